"""Training efficiency: machine peak FLOP/s (measured once, cached), MFU, throughput,
launch-to-first-step time and the share of wall time spent in training steps.

MFU = achieved model FLOP/s / peak, where model FLOPs = 3 x forward FLOPs (forward +
backward) of the examples processed, and peak = a large square matmul in the training
dtype on this machine (not the vendor's datasheet number).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

CACHE = Path(os.environ.get("GEM_CACHE_DIR", Path.home() / ".cache" / "gem")) / "peak_flops.json"


def _device_key(device: torch.device, dtype: torch.dtype) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return f"{name}|{device.type}|{dtype}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def measure_peak_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                       size: int | None = None, repeats: int = 5, use_cache: bool = True) -> float:
    """Best-of-``repeats`` FLOP/s of an n x n x n matmul (n = 2048 on CPU, 8192 on GPU)."""
    device = torch.device(device)
    key = _device_key(device, dtype)
    if use_cache and CACHE.is_file():
        cached = json.loads(CACHE.read_text())
        if key in cached:
            return float(cached[key])
    n = size or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    peak = 2.0 * n**3 / best
    if use_cache:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        cached = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
        cached[key] = peak
        tmp = CACHE.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=1))
        os.replace(tmp, CACHE)
    return peak


def process_start_time() -> float:
    """Wall-clock time this process was launched (falls back to now)."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable
        return time.time()


class EfficiencyMeter:
    """Call ``step_begin()`` / ``step_end(examples)`` around each training step."""

    def __init__(self, train_flops_per_example: float, peak_flops: float, world_size: int = 1,
                 launch_time: float | None = None, warmup_steps: int = 2) -> None:
        self.flops_per_example, self.peak, self.world_size = train_flops_per_example, peak_flops, world_size
        # Throughput and MFU leave out the first steps (allocator warmup, lazy init, compile).
        self.warmup_steps, self.steps = warmup_steps, 0
        self.steady_seconds, self.steady_examples = 0.0, 0
        self.launch = launch_time or process_start_time()
        self.first_step_end: float | None = None
        self.step_seconds = 0.0
        self.examples = 0
        self._window_seconds, self._window_examples = 0.0, 0
        self._begin = 0.0

    def step_begin(self) -> None:
        self._begin = time.perf_counter()

    def step_end(self, examples: int) -> None:
        elapsed = time.perf_counter() - self._begin
        if self.first_step_end is None:
            self.first_step_end = time.time()
        self.step_seconds += elapsed
        self.examples += examples
        self.steps += 1
        if self.steps > self.warmup_steps:
            self.steady_seconds += elapsed
            self.steady_examples += examples
        self._window_seconds += elapsed
        self._window_examples += examples

    def window(self) -> dict[str, float]:
        """Throughput since the previous call (for per-step logging)."""
        seconds, examples = max(self._window_seconds, 1e-9), self._window_examples
        self._window_seconds, self._window_examples = 0.0, 0
        return self._figures(examples, seconds)

    def _figures(self, examples: int, seconds: float) -> dict[str, float]:
        flops = examples * self.flops_per_example / seconds
        return {
            "perf/examples_per_s": examples / seconds,
            "perf/model_flops_per_s": flops,
            # Peak is one device's; examples here are global across the world.
            "perf/mfu": flops / (self.peak * self.world_size),
        }

    def summary(self) -> dict[str, float]:
        wall = time.time() - self.launch
        if self.steady_examples:
            out = self._figures(self.steady_examples, max(self.steady_seconds, 1e-9))
        else:
            out = self._figures(self.examples, max(self.step_seconds, 1e-9))
        out["perf/startup_seconds"] = (self.first_step_end or time.time()) - self.launch
        out["perf/effective_training_time"] = self.step_seconds / max(wall, 1e-9)
        out["perf/peak_flops"] = self.peak
        out["perf/train_flops_per_example"] = self.flops_per_example
        return out
