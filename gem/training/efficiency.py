"""Training efficiency: machine peak FLOP/s, MFU, throughput, launch-to-first-step time
and the share of wall time spent in training steps.

Definitions (what ``EfficiencyMeter.summary()`` reports):

- model FLOPs = 3 x the forward FLOPs (forward + backward; checked against a counted
  forward + backward, gem/model/flops.py) of each trained batch, real tokens only
  (gem/model/batch_flops.py prices every batch exactly from its history lengths); a
  meter given no per-batch figure uses ``train_flops_per_example`` for every example.
- training window = wall time from the end of the warm-up steps (the first step by
  default: lazy init, allocator growth, compile) to the end of the last step. It
  includes everything the loop does between steps (data loading, metrics, logging,
  checkpoints), so data stalls lower throughput and MFU.
- ``examples_per_s`` and ``model_flops_per_s`` = examples and model FLOPs of the steps
  inside the window / the window's wall time; ``window()`` gives the same figures (and
  the MFU) since its previous call, for the lines logged every ``log_every`` steps.
- ``mfu`` = model_flops_per_s / (peak x world size); peak = the best rate of a large
  square matmul in the training dtype measured on this machine (not a datasheet
  number), kept as the best seen (``measure_peak_flops``).
- ``step_time_share`` = time inside steps / window (1.0: the loop does nothing else).
- ``startup_seconds`` = process launch to the end of the first step.
- ``effective_training_time`` = time inside all steps / wall time from launch to the
  summary (startup, tracking, checkpoints and the loop's own overhead lower it).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from gem.utils.cache import cache_dir


def peak_cache() -> Path:
    return cache_dir() / "peak_flops.json"


def _device_key(device: torch.device, dtype: torch.dtype) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:  # hosts of one name differ in vector units (AVX2 vs AVX-512 with bf16)
        name = f"{_cpu_name()} {torch.backends.cpu.get_cpu_capability()}"
    return f"{name}|{device.type}|{dtype}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def cached_peak_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> float | None:
    """The best peak measured before on this machine (``measure_peak_flops``), or None."""
    device = torch.device(device)
    cache = peak_cache()
    cached = json.loads(cache.read_text()) if cache.is_file() else {}
    value = cached.get(_device_key(device, dtype))
    return None if value is None else float(value)


def measure_peak_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                       size: int | None = None, repeats: int = 5, use_cache: bool = True,
                       refresh: bool = False) -> float:
    """Best-of-``repeats`` FLOP/s of an n x n x n matmul (n = 2048 on CPU, 8192 on GPU)
    through the faster of ``torch.mm`` and ``F.linear`` (on CPUs without bf16 units, bf16
    mm runs a scalar fallback at ~1 GFLOP/s while linear goes through oneDNN at ~20).

    With ``use_cache`` the cache keeps the best value measured for this device, dtype,
    thread count and torch build: it is returned without measuring unless ``refresh``,
    and a new measurement replaces it only when higher, so a measurement slowed by other
    jobs on the machine never lowers the peak (which would inflate MFU)."""
    device = torch.device(device)
    key = _device_key(device, dtype)
    cache = peak_cache()
    cached = json.loads(cache.read_text()) if use_cache and cache.is_file() else {}
    if key in cached and not refresh:
        return float(cached[key])
    n = size or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)

    def seconds(matmul, x: torch.Tensor, y: torch.Tensor) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        matmul(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    # The faster path on a small product (each run twice: the first call warms up), so
    # the slow one is never timed at full size.
    small = min(n, 256)
    matmul = min((torch.mm, torch.nn.functional.linear),
                 key=lambda f: min(seconds(f, a[:small, :small], b[:small, :small]) for _ in range(2)))
    best = min(seconds(matmul, a, b) for _ in range(repeats + 1))
    peak = 2.0 * n**3 / best
    if use_cache and peak > cached.get(key, 0.0):
        cache.parent.mkdir(parents=True, exist_ok=True)
        cached = json.loads(cache.read_text()) if cache.is_file() else {}
        cached[key] = max(peak, cached.get(key, 0.0))
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=1))
        os.replace(tmp, cache)
    return max(peak, cached.get(key, 0.0)) if use_cache else peak


def process_start_time() -> float:
    """Wall-clock time this process was launched (falls back to now)."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable
        return time.time()


class EfficiencyMeter:
    """Call ``step_begin()`` / ``step_end(examples, flops)`` around each training step; see
    the module docstring for the definitions."""

    def __init__(self, train_flops_per_example: float, peak_flops: float, world_size: int = 1,
                 launch_time: float | None = None, warmup_steps: int = 1) -> None:
        self.flops_per_example, self.peak, self.world_size = train_flops_per_example, peak_flops, world_size
        self.warmup_steps, self.steps = warmup_steps, 0
        self.launch = launch_time or process_start_time()
        self.first_step_end: float | None = None  # wall clock (time.time())
        self.step_seconds, self.examples, self.flops = 0.0, 0, 0.0  # all steps
        self.last_step_seconds = 0.0
        # The window: from the end of the warm-up steps to the end of the last step.
        self._window_start: float | None = None  # perf_counter()
        self._last_end = 0.0
        self._window_examples, self._window_flops, self._window_step_seconds = 0, 0.0, 0.0
        self._log_mark: float | None = None
        self._log_examples, self._log_flops = 0, 0.0
        self._begin = 0.0

    def step_begin(self) -> None:
        self._begin = time.perf_counter()

    def step_end(self, examples: int, flops: float | None = None) -> None:
        """``flops``: the step's model FLOPs (default: examples x train_flops_per_example)."""
        now = time.perf_counter()
        elapsed = now - self._begin
        flops = examples * self.flops_per_example if flops is None else flops
        if self.first_step_end is None:
            self.first_step_end = time.time()
        self.step_seconds += elapsed
        self.last_step_seconds = elapsed
        self.examples += examples
        self.flops += flops
        self.steps += 1
        self._last_end = now
        if self.steps <= self.warmup_steps:
            self._window_start = self._log_mark = now
            return
        if self._window_start is None:  # warmup_steps == 0: the window opens at the first step's start
            self._window_start = self._log_mark = self._begin
        self._window_examples += examples
        self._window_flops += flops
        self._window_step_seconds += elapsed
        self._log_examples += examples
        self._log_flops += flops

    def restart_window(self) -> None:
        """Open the window now (after work between the warm-up and the next step that is not
        the loop's, e.g. measuring the peak); only before any step of the window."""
        if not self._window_examples:
            self._window_start = self._log_mark = time.perf_counter()

    def window(self) -> dict[str, float]:
        """``perf/window_*``: throughput and MFU over the wall time since the previous call
        (or the end of the warm-up), for the lines logged every ``log_every`` steps."""
        now = time.perf_counter()
        mark = self._log_mark if self._log_mark is not None else now
        figures = self._figures(self._log_examples, self._log_flops, max(now - mark, 1e-9))
        self._log_mark, self._log_examples, self._log_flops = now, 0, 0.0
        # the peak this window's MFU is read against: the run measures it again after its
        # last step (perf/peak_flops), and a higher one then does not rewrite logged windows
        figures["perf/peak_flops"] = self.peak
        return {f"perf/window_{k.split('/')[1]}": v for k, v in figures.items()}

    def _figures(self, examples: int, flops: float, seconds: float) -> dict[str, float]:
        rate = flops / seconds
        return {
            "perf/examples_per_s": examples / seconds,
            "perf/model_flops_per_s": rate,
            # Peak is one device's; examples here are global across the world.
            "perf/mfu": rate / (self.peak * self.world_size),
        }

    def summary(self) -> dict[str, float]:
        wall = time.time() - self.launch
        if self._window_examples:
            seconds = max(self._last_end - self._window_start, 1e-9)
            out = self._figures(self._window_examples, self._window_flops, seconds)
            out["perf/step_time_share"] = self._window_step_seconds / seconds
        else:  # no step after the warm-up: the steps' own time is all there is
            out = self._figures(self.examples, self.flops, max(self.step_seconds, 1e-9))
            out["perf/step_time_share"] = 1.0
        out["perf/startup_seconds"] = (self.first_step_end or time.time()) - self.launch
        out["perf/effective_training_time"] = self.step_seconds / max(wall, 1e-9)
        out["perf/peak_flops"] = self.peak
        # the mean over every trained example (the given figure when no step ran)
        out["perf/train_flops_per_example"] = self.flops / self.examples if self.examples else self.flops_per_example
        return out
