"""Training precision chosen by measurement (``precision: auto``).

bf16 autocast pays only where the host multiplies bf16 natively and the model's matmuls
are large enough to outweigh the casts it adds: on a 2-core AVX-512-bf16 EPYC the
pipeline's small model trained 1.6x faster in bf16 (same holdout AUC), the tiny preset
at batch 64 0.67x as fast; on an AVX2 host bf16 matmuls run in software at ~1/10 of fp32.
So ``auto`` first compares one bf16 and one fp32 matmul (milliseconds; no bf16 trial on a
host where bf16 is not faster), then trains the first steps alternately in each and keeps
the one with fewer seconds per model FLOP for the rest of the run. The weights stay fp32
either way (autocast), so the exported model and its scoring do not change.

    trial = precision_trial(cfg.precision, device, world_size)
    trial.precision()                   # for the coming step
    ...; trial.after_step(seconds, flops)
    trial.chosen                        # "fp32" / "bf16" once decided (from the start when fixed)
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

# bf16 matmuls must beat fp32 ones by this much before a trial step is spent on them
MIN_MATMUL_GAIN = 1.3


def fixed_precision(precision: str) -> str:
    """The precision of work that is not tuned (evaluation, the Lightning engine): "auto"
    runs fp32, what scoring the exported weights gives."""
    return "fp32" if precision == "auto" else precision


def bf16_matmul_gain(size: int = 512, repeats: int = 3) -> float:
    """bf16 over fp32 FLOP/s of one size x size matmul on this CPU (F.linear: oneDNN's
    path, the one autocast takes); best of ``repeats`` each, interleaved."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    pairs = {dtype: (a.to(dtype), b.to(dtype)) for dtype in best}
    for _ in range(repeats + 1):  # the first round warms each path up
        for dtype, (x, y) in pairs.items():
            start = time.perf_counter()
            torch.nn.functional.linear(x, y)
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


class PrecisionTrial:
    """After ``warmup_steps``, ``trial_steps`` steps in each precision, alternating; then
    the lower median seconds per FLOP wins. ``reduce`` (ranks: sums the two costs over
    ranks) makes every rank keep the same choice."""

    CHOICES = ("fp32", "bf16")

    def __init__(self, trial_steps: int = 2, warmup_steps: int = 1,
                 reduce: Callable[[list[float]], list[float]] | None = None, fixed: str | None = None) -> None:
        self.trial_steps, self.warmup, self.reduce = trial_steps, warmup_steps, reduce
        self.cost: dict[str, list[float]] = {p: [] for p in self.CHOICES}
        self.steps = 0
        self.chosen: str | None = fixed  # a fixed precision: decided before any step
        self.tries = fixed is None
        self.ratio = float("nan")  # bf16 step time per FLOP over fp32's, once a trial decided

    @property
    def steps_needed(self) -> int:
        """Steps before the choice is made (a thread tuner starts after them); 0 when fixed."""
        return self.warmup + len(self.CHOICES) * self.trial_steps if self.tries else 0

    def precision(self) -> str:
        if self.chosen is not None:
            return self.chosen
        if self.steps < self.warmup:
            return "fp32"
        return self.CHOICES[(self.steps - self.warmup) % len(self.CHOICES)]

    def after_step(self, seconds: float, flops: float) -> None:
        if self.chosen is not None:
            return
        current = self.precision()
        self.steps += 1
        if self.steps <= self.warmup:
            return
        self.cost[current].append(seconds / max(flops, 1.0))
        if self.steps < self.steps_needed:
            return
        medians = [statistics.median(self.cost[p]) for p in self.CHOICES]
        if self.reduce is not None:
            medians = self.reduce(medians)
        self.ratio = medians[1] / medians[0]
        self.chosen = "bf16" if self.ratio < 1.0 else "fp32"
        log.info("precision: %s (auto: a bf16 step took %.2fx the time of an fp32 step per FLOP)",
                 self.chosen, self.ratio)


def precision_trial(precision: str, device: torch.device, world_size: int = 1,
                    reduce: Callable[[list[float]], list[float]] | None = None) -> PrecisionTrial:
    """A trial decided from the start for fp32 or bf16; for "auto": bf16 on a GPU that has
    it, fp32 on a CPU whose bf16 matmuls are not ``MIN_MATMUL_GAIN`` times faster, else a
    trial over the first steps."""
    if precision != "auto":
        return PrecisionTrial(fixed=precision)
    if device.type == "cuda":
        return PrecisionTrial(fixed="bf16" if torch.cuda.is_bf16_supported() else "fp32")
    gain = bf16_matmul_gain()
    if gain < MIN_MATMUL_GAIN:
        log.info("precision: fp32 (auto: this CPU's bf16 matmuls run %.2fx as fast as fp32's)", gain)
        return PrecisionTrial(fixed="fp32")
    return PrecisionTrial(reduce=reduce if world_size > 1 else None)
