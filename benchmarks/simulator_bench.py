"""Simulator throughput: events/s and peak memory for ~10M events on this machine.

`python -m benchmarks.simulator_bench [--users N --days D]` writes
benchmarks/results/simulator.json. Peak memory is the whole process tree's RSS
(parent plus worker processes), sampled every 50 ms.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.results import print_table, write_result
from gem.config import load_config
from gem.data.simulate import SimulatorConfig, simulate


class TreeRssSampler:
    """Samples the summed RSS of this process and its children in a thread."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(self.interval)

    def __enter__(self) -> "TreeRssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run(cfg: SimulatorConfig, workdir: Path) -> dict:
    out = workdir / "sim"
    with TreeRssSampler() as rss:
        start = time.perf_counter()
        manifest = simulate(cfg, out, progress=False)
        seconds = time.perf_counter() - start
    events = manifest.extra["events"]
    disk = sum(p.stat().st_size for p in out.rglob("*.parquet"))
    shutil.rmtree(out)
    return {"events": events, "seconds": seconds, "events_per_s": events / seconds,
            "peak_rss_gb": rss.peak / 2**30, "bytes_per_event_on_disk": disk / events}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="large")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    cfg = load_config(SimulatorConfig, section="simulator", preset=args.preset, overrides=args.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        main_run = run(cfg, Path(tmp))
        one_worker = [*args.overrides, "workers=1", f"users={max(cfg.users // 10, 1)}"]
        single = run(load_config(SimulatorConfig, section="simulator", preset=args.preset, overrides=one_worker),
                     Path(tmp))
    figures = dict(main_run)
    figures["single_process_events_per_s"] = single["events_per_s"]
    figures["parallel_speedup_vs_single_process"] = main_run["events_per_s"] / single["events_per_s"]
    figures["goal_events_per_s"] = 1_000_000
    figures["meets_goal"] = main_run["events_per_s"] >= 1_000_000
    path = write_result("simulator", figures, sizes={"users": cfg.users, "items": cfg.items, "days": cfg.days,
                                                     "topics": cfg.topics, "workers": cfg.workers or "all cores",
                                                     "single_process_users": max(cfg.users // 10, 1)})
    print_table(f"simulator ({path})", [(k, v) for k, v in figures.items()])


if __name__ == "__main__":
    main()
