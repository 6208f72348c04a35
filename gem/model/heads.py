"""Multi-domain multi-task heads, two-tower embeddings, outputs and loss.

Shapes: B batch, H trunk width, S surfaces (the data's: spec.surfaces), T tasks (the
data's: spec.tasks, (click,) or (click, conversion)), E encode dim.

Conversion is modelled click-then-convert: p(conv) = p(click) * p(conv | click), so
the conversion head is defined (and trained) on every impression. Data without any
conversion has the click task only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

CLICK, CONVERSION = 0, 1


def mlp(sizes: list[int], dropout: float = 0.0, last_activation: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_activation or i < len(sizes) - 2:
            layers += [nn.ReLU(), nn.Dropout(dropout)] if dropout else [nn.ReLU()]
    return nn.Sequential(*layers)


@dataclass
class ModelOutput:
    """``logits`` (B, T): the example's own surface; column 1 is the logit of the joint
    p(click and conversion). ``cond_logits`` (B, T): click and conversion-given-click
    logits (the loss uses them). ``all_logits`` (B, S, T) joint logits of every surface
    (only when asked)."""

    logits: torch.Tensor
    cond_logits: torch.Tensor
    all_logits: torch.Tensor | None = None

    def probabilities(self) -> torch.Tensor:
        return torch.sigmoid(self.logits)


@dataclass
class Encoded:
    """user (B, E), item (B, E): two-tower embeddings, each from its side's features
    only; joint (B, H): the trunk's representation of the (user, item, surface) triple."""

    user: torch.Tensor
    item: torch.Tensor
    joint: torch.Tensor


def joint_log_probs(cond_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p and log(1 - p) of (click, conversion) from (click, conv|click) logits, (..., 2);
    of click alone from (..., 1)."""
    click = cond_logits[..., CLICK]
    log_p_click = F.logsigmoid(click)
    if cond_logits.shape[-1] == 1:
        return log_p_click[..., None], F.logsigmoid(-click)[..., None]
    log_p_conv = (log_p_click + F.logsigmoid(cond_logits[..., CONVERSION])).clamp(max=-1e-7)
    log_p = torch.stack([log_p_click, log_p_conv], dim=-1)
    log_q = torch.stack([F.logsigmoid(-click), torch.log(-torch.expm1(log_p_conv))], dim=-1)
    return log_p, log_q


def joint_logits(cond_logits: torch.Tensor) -> torch.Tensor:
    log_p, log_q = joint_log_probs(cond_logits)
    return log_p - log_q


def multitask_loss(out: ModelOutput, labels: torch.Tensor,
                   task_weights: tuple[float, ...] = (1.0, 1.0)) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean binary cross-entropy per task on the joint probabilities.

    Returns (weighted total loss (), per-task losses (2,)); labels (B, T) in {0, 1}.
    With the click task only, the conversion entry of the per-task losses is 0 (the
    trainer logs both)."""
    log_p, log_q = joint_log_probs(out.cond_logits.float())
    per_task = -(labels * log_p + (1 - labels) * log_q).mean(dim=0)
    weights = torch.tensor(task_weights[: per_task.shape[0]], dtype=per_task.dtype, device=per_task.device)
    shown = per_task.detach()
    if shown.shape[0] == 1:
        shown = torch.cat([shown, shown.new_zeros(1)])
    return (per_task * weights).sum(), shown


class SurfaceTowers(nn.Module):
    """(B, H) -> (B, S, T) conditional logits, one tower per surface computed together."""

    def __init__(self, in_dim: int, hidden: list[int], num_surfaces: int, num_tasks: int) -> None:
        super().__init__()
        sizes = [in_dim, *hidden, num_tasks]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.randn(num_surfaces, a, b) / a**0.5) for a, b in zip(sizes[:-1], sizes[1:])
        )
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(num_surfaces, b)) for b in sizes[1:])

    def forward(self, h_BH: torch.Tensor) -> torch.Tensor:
        # a matmul and batched matmuls over surfaces: einsum's reshapes and permutes were
        # half of the small heads' time, forward and backward
        w0_SIO = self.weights[0]
        surfaces, width, out = w0_SIO.shape
        h = (h_BH @ w0_SIO.transpose(0, 1).reshape(width, surfaces * out)).view(-1, surfaces, out) + self.biases[0]
        for w_SIO, b in zip(self.weights[1:], self.biases[1:]):
            h = torch.bmm(F.relu(h).transpose(0, 1), w_SIO).transpose(0, 1) + b
        return h


class TwoTower(nn.Module):
    """User and item embeddings; their scaled dot product is added to the click logit so
    that ``encode()`` returns embeddings trained by the ranking loss."""

    def __init__(self, user_in: int, item_in: int, dim: int) -> None:
        super().__init__()
        self.user = mlp([user_in, 2 * dim, dim], last_activation=False)
        self.item = mlp([item_in, 2 * dim, dim], last_activation=False)
        self.scale = dim**-0.5

    def forward(self, user_in: torch.Tensor, item_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.user(user_in), self.item(item_in)

    def score(self, user_BE: torch.Tensor, item_BE: torch.Tensor) -> torch.Tensor:
        return (user_BE * item_BE).sum(-1) * self.scale


class MultiTaskHeads(nn.Module):
    def __init__(self, trunk_in: int, trunk_hidden: list[int], tower_hidden: list[int],
                 num_surfaces: int, num_tasks: int, dropout: float = 0.0) -> None:
        super().__init__()
        if num_tasks not in (1, 2):
            raise ValueError(f"num_tasks={num_tasks}: GEM heads model (click,) or (click, conversion)")
        self.trunk = mlp([trunk_in, *trunk_hidden], dropout)
        self.towers = SurfaceTowers(([trunk_in, *trunk_hidden])[-1], tower_hidden, num_surfaces, num_tasks)

    def forward(self, top_BX: torch.Tensor, surface_B: torch.Tensor, click_bias_B: torch.Tensor,
                all_surfaces: bool = False) -> tuple[ModelOutput, torch.Tensor]:
        joint_BH = self.trunk(top_BX)
        cond_BST = self.towers(joint_BH)
        cond_BST = cond_BST + F.pad(click_bias_B[:, None, None], (0, cond_BST.shape[-1] - 1))  # click only
        own = cond_BST[torch.arange(cond_BST.shape[0], device=cond_BST.device), surface_B]
        out = ModelOutput(
            logits=joint_logits(own.float()), cond_logits=own,
            all_logits=joint_logits(cond_BST.float()) if all_surfaces else None,
        )
        return out, joint_BH


class RankingModel(nn.Module):
    """The tail every ranking model shares: its own ``trunk`` gives the top-layer input
    (B, F) and the raw inputs; two towers and the multi-task heads finish.

    ``outputs`` does one pass for both the predictions and the embeddings (knowledge
    generation uses it); ``forward`` and ``encode`` are its two halves."""

    two_tower: TwoTower
    heads: MultiTaskHeads

    def trunk(self, batch) -> tuple[torch.Tensor, object]:
        raise NotImplementedError

    def outputs(self, batch, all_surfaces: bool = False) -> tuple[ModelOutput, Encoded]:
        top, inp = self.trunk(batch)
        user, item = self.two_tower(inp.user_in, inp.item_in)
        click_bias = self.two_tower.score(user, item)
        if inp.first_order is not None:
            click_bias = click_bias + inp.first_order.to(click_bias.dtype)
        out, joint = self.heads(top, batch.surface, click_bias, all_surfaces)
        return out, Encoded(user=user, item=item, joint=joint)

    def forward(self, batch, all_surfaces: bool = False) -> ModelOutput:
        return self.outputs(batch, all_surfaces)[0]

    def encode(self, batch) -> Encoded:
        """User, item (B, encode_dim) and joint (B, trunk width) embeddings."""
        return self.outputs(batch)[1]
