"""Distillation losses on joint probabilities (click, click-and-conversion).

    loss = (1 - sum_i w_i) * BCE(labels) + sum_i w_i * T_i^2 * BCE(sigmoid(z_s / T_i), q_i)

z_s are the student's joint logits, q_i the i-th soft target (teacher predictions
softened by T_i, or adapter/domain-model probabilities). A term with w_i == 0 is not
computed at all, so a student with every weight 0 is exactly the no-teacher student.
Rows whose target is NaN (the teacher never scored them) fall back to labels only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gem.model import ModelOutput, multitask_loss


@dataclass
class SoftTarget:
    name: str
    weight: float
    probs: torch.Tensor  # float32 (N, T) targets in [0, 1], NaN where unknown
    temperature: float = 1.0


def soften(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.sigmoid(logits / temperature)


def distill_loss(out: ModelOutput, labels: torch.Tensor, soft: list[tuple[float, torch.Tensor, float]]) -> torch.Tensor:
    """``soft``: (weight, target probs (B, T), temperature) terms with weight > 0."""
    hard_weight = 1.0 - sum(w for w, _, _ in soft)
    if not soft:
        return multitask_loss(out, labels)[0]
    z = out.logits.float()
    per_row_hard = _hard_rows(out, labels)  # (B,)
    total = hard_weight * per_row_hard
    for weight, target, temperature in soft:
        known = torch.isfinite(target).all(dim=1)
        q = torch.nan_to_num(target, nan=0.5)
        term = F.binary_cross_entropy_with_logits(z / temperature, q, reduction="none").sum(dim=1)
        term = term * temperature**2
        # unknown teacher: that share of the weight goes back to the labels
        total = total + torch.where(known, weight * term, weight * per_row_hard)
    return total.mean()


def _hard_rows(out: ModelOutput, labels: torch.Tensor) -> torch.Tensor:
    from gem.model import joint_log_probs

    log_p, log_q = joint_log_probs(out.cond_logits.float())
    return -(labels * log_p + (1 - labels) * log_q).sum(dim=1)
