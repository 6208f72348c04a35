"""The conventions of jagged attention, shared by every backend.

Shapes: B sequences, T tokens in all (T = offsets[-1]), H heads, D = q/k head dim,
Dv = v head dim, L = a sequence's kept length, Lp = a padded length (>= every L).

- Truncation: a sequence longer than max_seq_len keeps its LAST max_seq_len tokens
  (the most recent events); dropped tokens get output 0 and gradient 0.
- Targets: the last num_targets[b] kept tokens (clamped to [0, L]) are candidates. With
  h = L - num_targets[b] history tokens, query i may see key j when
  (j < h or j == i) and (j <= i if causal): history sees history, a target sees the
  history and itself, never another target.
- Scaling: scores are q.k * scale, scale = 1/sqrt(D) unless given (HSTU's alpha).
- GDPA normalization: act(score + bias) is divided by the sequence's kept length L.
- Contextual tokens (contextual_len = c > 0): the first min(c, h) kept tokens. They see
  every history token (also later ones, also when causal) and every query sees them.
- Attention window (max_attn_len = W > 0): query i sees key j only if
  |id_i - id_j| <= W, with HSTU's ids: contextual tokens share id 0, the next token is 1,
  and every target takes the id of the first target. Contextual rows ignore the window.
- Dropout (dropout_p = p > 0): each (head, query token, key token) weight is kept with
  probability 1 - p and scaled by 1/(1 - p), after softmax or act(.)/L. Whether it is
  kept is a hash of (dropout_seed, head, global query token, global key token)
  (dropout_keep), so every backend, and a backward that recomputes the weights, draw
  the same mask.
- Relative position bias: a learned table (H, 2R+1). Token positions count from 0 in the
  kept sequence, except that every target takes position h (targets are interchangeable
  candidates at "now"); the score of (i, j) gets table[:, clamp(pos_j - pos_i, -R, R) + R].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

FORMS = ("softmax", "gdpa")

Tensor = torch.Tensor


@dataclass(frozen=True)
class Activation:
    """A pointwise GDPA activation: `fn(x)` and `grad(dy, x) = dy * fn'(x)`."""

    fn: Callable[[Tensor], Tensor]
    grad: Callable[[Tensor, Tensor], Tensor]


def _sigmoid_grad(dy: Tensor, x: Tensor) -> Tensor:
    return torch.ops.aten.sigmoid_backward(dy, torch.sigmoid(x))


ACTIVATIONS: dict[str, Activation] = {
    "silu": Activation(F.silu, lambda dy, x: torch.ops.aten.silu_backward(dy, x)),
    "relu": Activation(F.relu, lambda dy, x: torch.ops.aten.threshold_backward(dy, x, 0)),
    "sigmoid": Activation(torch.sigmoid, _sigmoid_grad),
}
# Activations the Triton kernels implement in-kernel (register_activation can't reach them).
TRITON_ACTIVATIONS = ("silu", "relu", "sigmoid")


def register_activation(name: str, fn: Callable[[Tensor], Tensor],
                        grad: Callable[[Tensor, Tensor], Tensor]) -> None:
    """Add a GDPA activation for the PYTORCH and BUCKETED backends (not Triton)."""
    if name in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is already registered")
    ACTIVATIONS[name] = Activation(fn, grad)


def kept_spans(offsets: Tensor, max_seq_len: int) -> tuple[Tensor, Tensor]:
    """(starts, lengths), each (B,) int64: where each truncated sequence begins in the
    values and how many tokens it keeps (the last min(length, max_seq_len))."""
    lengths = (offsets[1:] - offsets[:-1]).clamp(max=max_seq_len)
    return offsets[1:] - lengths, lengths


def history_lengths(lengths: Tensor, num_targets: Tensor | None) -> Tensor:
    """(B,) int64: kept tokens that are history (not targets)."""
    if num_targets is None:
        return lengths
    targets = torch.minimum(num_targets.to(lengths.dtype).clamp(min=0), lengths)
    return lengths - targets


@dataclass(frozen=True)
class Spec:
    """The scalar options of one call (everything but the tensors)."""

    max_seq_len: int
    form: str = "softmax"
    causal: bool = False
    activation: str = "silu"
    scale: float | None = None  # None: 1/sqrt(D)
    max_attn_len: int = 0  # 0: no window
    contextual_len: int = 0
    dropout_p: float = 0.0
    dropout_seed: int = 0

    def score_scale(self, dim: int) -> float:
        return 1.0 / math.sqrt(dim) if self.scale is None else self.scale

    @property
    def plain_mask(self) -> bool:
        """No window and no contextual tokens: the mask is targets + causal only."""
        return self.max_attn_len == 0 and self.contextual_len == 0


def allowed_mask(lengths: Tensor, history: Tensor, size: int, causal: bool,
                 max_attn_len: int = 0, contextual_len: int = 0) -> Tensor:
    """(n, size, size) bool: query i may attend key j (both inside the sequence).

    lengths, history: (n,) for n sequences padded to `size` positions.
    """
    pos = torch.arange(size, device=lengths.device)
    i, j = pos.view(1, size, 1), pos.view(1, 1, size)
    hist = history.view(-1, 1, 1)
    allowed = (j < hist) | (j == i)
    if causal:
        allowed &= j <= i
    if max_attn_len > 0 or contextual_len > 0:
        context = torch.clamp(hist, max=contextual_len)  # contextual tokens: min(c, h)
        ids = pos.view(1, size) - (context.view(-1, 1) - 1).clamp(min=0)
        ids = torch.minimum(ids.clamp(min=0), (hist - (context - 1).clamp(min=0)).view(-1, 1))
        if max_attn_len > 0:
            allowed &= (ids.unsqueeze(2) - ids.unsqueeze(1)).abs() <= max_attn_len
        if contextual_len > 0:
            allowed |= (i < context) & (j < hist)
    return allowed & (i < lengths.view(-1, 1, 1))


_HASH_MASK = 0xFFFFFFFF


def dropout_keep(seed: int, p: float, heads: Tensor, query_tokens: Tensor,
                 key_tokens: Tensor) -> Tensor:
    """(h, n, Lq, Lk) bool: which weights dropout keeps (probability 1 - p).

    heads: (h,) head indices; query_tokens: (n, Lq), key_tokens: (n, Lk) global token
    indices (int64). A counter-based hash (lowbias32), so the mask is a pure function
    of (seed, head, query token, key token) on every backend and in the backward.
    """
    x = (query_tokens.view(1, *query_tokens.shape, 1) * 0x9E3779B1
         + key_tokens.view(1, key_tokens.shape[0], 1, key_tokens.shape[1]) * 0x85EBCA6B
         + heads.view(-1, 1, 1, 1) * 0xC2B2AE35 + (seed & _HASH_MASK)) & _HASH_MASK
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _HASH_MASK
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _HASH_MASK
    x = x ^ (x >> 16)
    return x >= int(p * 2**32)


def relative_position_index(history: Tensor, size: int, radius: int) -> Tensor:
    """(n, size, size) int64 index into a (H, 2*radius+1) bias table.

    Targets (positions >= history) all sit at position `history`.
    """
    pos = torch.arange(size, device=history.device).view(1, size)
    pos = torch.minimum(pos, history.view(-1, 1))
    rel = pos.unsqueeze(1) - pos.unsqueeze(2)  # [n, i, j] = pos_j - pos_i
    return rel.clamp(-radius, radius) + radius


def bias_radius(attn_bias: Tensor) -> int:
    return (attn_bias.shape[1] - 1) // 2
