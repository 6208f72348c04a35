"""Shared helpers for benchmarks: machine description, result files, tables.

Every benchmark writes `<results>/<name>.json`: flat figures plus a `machine`
description and the sizes used, so results are comparable across runs. `<results>` is
``$GEM_BENCH_RESULTS`` when set, else `benchmarks/results` under the current directory
(the repository root for `make bench`): a path that holds for any install, editable or not.
The real datasets are read from ``$GEM_SHARED_DATA``, else `../shared/data` beside the
current directory.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def results_dir() -> Path:
    return Path(os.environ.get("GEM_BENCH_RESULTS") or Path.cwd() / "benchmarks" / "results")


def shared_data() -> Path:
    return Path(os.environ.get("GEM_SHARED_DATA") or Path.cwd().parent / "shared" / "data")


def work_dir(name: str) -> Path:
    """A scratch folder for a benchmark's generated data (ignored by git)."""
    return Path(os.environ.get("GEM_BENCH_WORK") or Path.cwd() / ".local_runs" / name)


def machine_info() -> dict[str, Any]:
    """What ran the benchmark: CPU model, core count, memory, torch build, GPU if any."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        import psutil

        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def peak_rss_gb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def write_result(name: str, figures: dict[str, Any], sizes: dict[str, Any] | None = None,
                 out_dir: Path | None = None) -> Path:
    """Write figures (flat; one nested level allowed for variants) plus machine and sizes."""
    out_dir = Path(out_dir or results_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = dict(figures)
    payload["machine"] = machine_info()
    payload["sizes"] = sizes or {}
    payload["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def print_table(title: str, rows: list[tuple[str, Any]]) -> None:
    """A short two-column table for the terminal."""
    width = max([len(k) for k, _ in rows] + [10])
    print(f"\n== {title}")
    for key, value in rows:
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"  {key:<{width}}  {shown}")


@contextmanager
def timed() -> Iterator[dict[str, float]]:
    """`with timed() as t: ...` then t['seconds']."""
    box: dict[str, float] = {}
    start = time.perf_counter()
    try:
        yield box
    finally:
        box["seconds"] = time.perf_counter() - start
