"""Shared helpers for benchmarks: machine description, result files, tables.

Every benchmark writes `benchmarks/results/<name>.json`: flat figures plus a
`machine` description and the sizes used, so results are comparable across runs.
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

RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


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
                 results_dir: Path | None = None) -> Path:
    """Write figures (flat; one nested level allowed for variants) plus machine and sizes."""
    out_dir = Path(results_dir or RESULTS_DIR)
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
