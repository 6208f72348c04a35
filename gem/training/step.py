"""The one training-step definition, shared by the native loop (single process or
torchrun) and the Lightning module.

Embedding tables are updated inside ``backward`` by the fused row-wise Adagrad
(attached with ``apply_optimizer_in_backward``); ``dense_optimizer`` (AdamW) updates
everything else.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from gem.data.batch import Batch
from gem.model import ModelOutput, multitask_loss


@dataclass
class StepResult:
    loss: torch.Tensor  # () detached
    per_task: torch.Tensor  # (T,) detached
    probs: torch.Tensor  # (B, T) detached


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


def build_dense_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: list[float],
                          warmup_steps: int = 0):
    """AdamW over the dense parameters, with an optional linear warmup; returns (opt, sched)."""
    params = dense_parameters(model)
    # fused=True runs one kernel per step on CPU and GPU (the per-tensor loop dominated
    # small-batch CPU steps).
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay,
                                  betas=(float(betas[0]), float(betas[1])), fused=True)
    scheduler = None
    if warmup_steps > 0:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup_steps))
    return optimizer, scheduler


@torch.no_grad()
def eval_step(model: nn.Module, batch: Batch, *, precision: str = "fp32") -> torch.Tensor:
    """(B, T) probabilities for the example's own surface."""
    with autocast(precision, batch.dense.device):
        out = model(batch)
    return torch.sigmoid(out.logits.float())
