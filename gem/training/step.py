"""The one training-step definition, shared by the native loop (single process or
torchrun) and the Lightning module.

Embedding tables are updated inside ``backward`` by the fused row-wise Adagrad
(attached with ``apply_optimizer_in_backward``); ``dense_optimizer`` (AdamW) updates
everything else.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from gem.data.batch import Batch
from gem.errors import UserError
from gem.model import ModelOutput, multitask_loss
from gem.training.config import DECAYS, TrainConfig
from gem.training.fused_adamw import FusedAdamW


@dataclass
class StepResult:
    loss: torch.Tensor  # () detached
    per_task: torch.Tensor  # (T,) detached
    probs: torch.Tensor  # (B, T) detached


class TrainingDiverged(UserError, RuntimeError):
    """The loss stopped being a finite number: the run stops there, nothing is exported."""


def diverged(step: int, cfg: TrainConfig, loss: float | None = None) -> TrainingDiverged:
    value = f"{loss}" if loss is not None else "NaN or infinite"
    return TrainingDiverged(
        f"training stopped at step {step}: the loss is {value}, the model diverged and nothing was exported. "
        f"Check optim.dense_lr (now {cfg.optim.dense_lr:g}), optim.embedding_lr (now {cfg.optim.embedding_lr:g}) "
        f"and optim.grad_clip (now {cfg.optim.grad_clip:g}, 0 = off)")


class LossGuard:
    """Stops a run at its first non-finite loss. A single CPU process checks each step at
    once; otherwise the first bad step is kept as a tensor and read by ``check`` (at log
    steps, before a checkpoint or an evaluation, at the end), so the steps of an
    accelerator or of several ranks are not synchronised for it."""

    NONE = 2**62

    def __init__(self, cfg: TrainConfig, device: torch.device, world_size: int = 1) -> None:
        self.cfg, self.world_size = cfg, world_size
        self.at_once = device.type == "cpu" and world_size == 1
        self.first_bad = torch.full((), self.NONE, dtype=torch.int64, device=device)

    def observe(self, loss: torch.Tensor, step: int) -> None:
        if self.at_once:
            if not bool(torch.isfinite(loss)):
                raise diverged(step, self.cfg, float(loss))
            return
        bad = ~torch.isfinite(loss)
        self.first_bad = torch.where(bad, torch.minimum(self.first_bad, torch.full_like(self.first_bad, step)),
                                     self.first_bad)

    def check(self) -> None:
        if self.at_once:
            return
        first = self.first_bad.clone()
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(first, op=dist.ReduceOp.MIN)
        if int(first) != self.NONE:
            raise diverged(int(first), self.cfg)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def forward_loss(model: nn.Module, batch: Batch, *, precision: str = "fp32",
                 task_weights: tuple[float, ...] = (1.0, 1.0)) -> tuple[torch.Tensor, torch.Tensor, ModelOutput]:
    with autocast(precision, batch.dense.device):
        out = model(batch)
    loss, per_task = multitask_loss(out, batch.labels, tuple(task_weights))
    return loss, per_task, out


def dense_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters not updated in backward by a fused embedding optimizer."""
    return [p for p in model.parameters() if p.requires_grad and not hasattr(p, "_in_backward_optimizers")]


def train_step(model: nn.Module, batch: Batch, dense_optimizer: torch.optim.Optimizer, *,
               precision: str = "fp32", task_weights: tuple[float, ...] = (1.0, 1.0),
               grad_clip: float = 0.0, scheduler=None,
               backward: Callable[[torch.Tensor], None] | None = None) -> StepResult:
    dense_optimizer.zero_grad(set_to_none=True)
    loss, per_task, out = forward_loss(model, batch, precision=precision, task_weights=task_weights)
    (backward or torch.Tensor.backward)(loss)
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(dense_parameters(model), grad_clip)
    dense_optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return StepResult(loss.detach(), per_task, torch.sigmoid(out.logits.detach().float()))


def lr_factor(step: int, *, warmup_steps: int = 0, decay: str = "none", total_steps: int = 0,
              min_ratio: float = 0.0) -> float:
    """The dense lr multiplier after ``step`` optimizer steps: a linear warmup over
    ``warmup_steps``, then (``decay`` != "none") a linear or cosine fall to ``min_ratio``
    at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "none" or total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    shape = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape


def build_dense_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: list[float],
                          warmup_steps: int = 0, *, decay: str = "none", total_steps: int = 0,
                          min_lr_ratio: float = 0.0):
    """AdamW over the dense parameters with the ``lr_factor`` schedule; returns (opt, sched),
    sched None when the lr is constant."""
    if decay not in DECAYS:
        raise ValueError(f"lr decay={decay!r} must be one of {DECAYS}")
    params = dense_parameters(model)
    # fused: one kernel per step on CPU and GPU (the per-tensor loop dominated small-batch
    # CPU steps), its per-step Python bookkeeping done once (gem/training/fused_adamw.py)
    optimizer = FusedAdamW(params, lr=lr, weight_decay=weight_decay, betas=(float(betas[0]), float(betas[1])))
    scheduler = None
    if warmup_steps > 0 or (decay != "none" and total_steps > 0):
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(
            lr_factor, warmup_steps=warmup_steps, decay=decay, total_steps=total_steps, min_ratio=min_lr_ratio))
    return optimizer, scheduler


@torch.no_grad()
def eval_step(model: nn.Module, batch: Batch, *, precision: str = "fp32") -> torch.Tensor:
    """(B, T) probabilities for the example's own surface."""
    with autocast(precision, batch.dense.device):
        out = model(batch)
    return torch.sigmoid(out.logits.float())
