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
import logging
import os
import platform
import resource
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from gem.utils.atomic import write_json

log = logging.getLogger(__name__)


def results_dir() -> Path:
    return Path(os.environ.get("GEM_BENCH_RESULTS") or Path.cwd() / "benchmarks" / "results")


def shared_data() -> Path:
    return Path(os.environ.get("GEM_SHARED_DATA") or Path.cwd().parent / "shared" / "data")


def work_dir(name: str) -> Path:
    """A scratch folder for a benchmark's generated data (ignored by git)."""
    return Path(os.environ.get("GEM_BENCH_WORK") or Path.cwd() / ".local_runs" / name)


def built(out: Path, key: dict, build: Callable[[Path], Any], *, fresh: bool = False) -> str:
    """The folder ``out``, made by ``build(out)`` or reused. It is reused only when it was
    recorded under the same content key (input digests and settings; the code version is
    added) and its files still hash as recorded; a folder that merely exists is rebuilt.
    Returns the folder's content digest (``tree_digest``)."""
    from gem.utils.digest import code_version, tree_digest, value_digest

    out = Path(out)
    record = out.with_name(f".{out.name}.built.json")
    key = {**key, "code": code_version()}
    key_digest = value_digest(key)
    if not fresh and record.is_file() and out.is_dir():
        done = json.loads(record.read_text())
        if done.get("key_digest") == key_digest and tree_digest(out) == done.get("digest"):
            log.info("%s: same inputs as recorded; reused", out)
            return done["digest"]
        log.info("%s: inputs or content changed since it was recorded; building again", out)
    record.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    build(out)
    digest = tree_digest(out)
    write_json({"key_digest": key_digest, "key": key, "digest": digest}, record)
    return digest


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
    write_json(payload, path)
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


def bench_store() -> Path:
    """The benchmarks' persistent MLflow store (``$GEM_BENCH_STORE``, else
    `benchmarks/mlflow` under the current directory): every benchmark run stays there,
    one experiment per benchmark, for `mlflow ui` comparison views."""
    return Path(os.environ.get("GEM_BENCH_STORE") or Path.cwd() / "benchmarks" / "mlflow")


def bench_tracking(experiment: str) -> str:
    """Point MLflow at the benchmarks' store and experiment; returns the tracking URI."""
    from gem import tracking

    return tracking.configure(bench_store(), experiment=experiment)


def _metrics(figures: dict, prefix: str = "") -> Iterator[tuple[str, float, int]]:
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            yield name, float(value), 0
        elif isinstance(value, (int, float)) and value == value:
            yield name, float(value), 0
        elif isinstance(value, dict):
            yield from _metrics(value, f"{name}/")
        elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            for step, v in enumerate(value):  # per seed: one point each, the spread in the chart
                yield name, float(v), step


def log_comparison_run(experiment: str, run_name: str, figures: dict, params: dict) -> str:
    """One run whose params say what was compared (dataset, model or arm, sizes) and
    whose metrics are every numeric figure (nested keys joined with "/"), so MLflow's
    comparison view puts the models or arms of a benchmark side by side."""
    import mlflow

    bench_tracking(experiment)
    with mlflow.start_run(run_name=run_name) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        for name, value, step in _metrics(figures):
            mlflow.log_metric(name, value, step=step)
    return run.info.run_id
