"""Multi-head jagged self-attention, with a PyTorch reference used until (or instead
of) ``kernels.jagged_attention``.

Shapes: q, k, v (N, H, Dh) with N = total tokens; offsets int64 (B+1,).

Forms:
- ``softmax``: softmax(q k^T / sqrt(Dh)) v within each sequence.
- ``gdpa``: SiLU pointwise attention, silu(q k^T / sqrt(Dh)) v / L with L the
  sequence's length (the kernels package's convention, kernels/attention_spec.py).

Sequences are expected to be at most ``max_seq_len`` long (the model guarantees it).

Backends: ``loop`` (per-sequence, exact FLOPs, slow), ``padded`` (pads to the batch
max length with fbgemm jagged<->dense ops and masks), ``kernels`` (the kernels
package), ``auto`` (kernels when importable, else padded).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def _kernels_attention():
    try:
        from kernels import jagged_attention  # type: ignore[attr-defined]
    except ImportError:
        return None
    return jagged_attention


def _loop_attention(q, k, v, offsets, max_seq_len: int, form: str, causal: bool) -> torch.Tensor:
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(q.shape[-1])
    bounds = offsets.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        q_HLD, k_HLD, v_HLD = (t[start:end].transpose(0, 1) for t in (q, k, v))
        scores = torch.matmul(q_HLD, k_HLD.transpose(1, 2)) * scale
        if causal:
            length = end - start
            mask = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf") if form == "softmax" else 0.0)
        weights = scores.softmax(-1) if form == "softmax" else F.silu(scores) / (end - start)
        if causal and form == "gdpa":
            weights = weights * mask
        out[start:end] = torch.matmul(weights, v_HLD).transpose(0, 1)
    return out


def _padded_attention(q, k, v, offsets, max_seq_len: int, form: str, causal: bool) -> torch.Tensor:
    num_tokens, heads, head_dim = q.shape
    batch = offsets.numel() - 1
    lengths = offsets[1:] - offsets[:-1]
    max_len = max(int(lengths.max()) if batch else 0, 1)
    dense = [
        torch.ops.fbgemm.jagged_to_padded_dense(t.reshape(num_tokens, heads * head_dim), [offsets], [max_len], 0.0)
        .view(batch, max_len, heads, head_dim).transpose(1, 2)
        for t in (q, k, v)
    ]
    q_BHLD, k_BHLD, v_BHLD = dense
    positions = torch.arange(max_len, device=q.device)
    # Position 0 stays a valid key so empty sequences don't produce NaN rows (discarded later).
    key_valid_BL = (positions[None, :] < lengths[:, None]) | (positions[None, :] == 0)
    mask_B1LL = key_valid_BL[:, None, None, :]
    if causal:
        mask_B1LL = mask_B1LL & torch.ones(max_len, max_len, dtype=torch.bool, device=q.device).tril()
    if form == "softmax":
        out_BHLD = F.scaled_dot_product_attention(q_BHLD, k_BHLD, v_BHLD, attn_mask=mask_B1LL)
    else:
        scores = torch.matmul(q_BHLD, k_BHLD.transpose(-1, -2)) / math.sqrt(head_dim)
        weights = F.silu(scores) * mask_B1LL / lengths.clamp(min=1).view(batch, 1, 1, 1).to(scores.dtype)
        out_BHLD = torch.matmul(weights.to(v_BHLD.dtype), v_BHLD)
    out_BLX = out_BHLD.transpose(1, 2).reshape(batch, max_len, heads * head_dim)
    return torch.ops.fbgemm.dense_to_jagged(out_BLX, [offsets])[0].view(num_tokens, heads, head_dim)


def jagged_self_attention(q, k, v, offsets, *, max_seq_len: int, form: str = "softmax",
                          causal: bool = False, backend: str = "auto") -> torch.Tensor:
    """(N, H, Dh) x3 + offsets (B+1,) -> (N, H, Dh); see the module docstring."""
    if backend in ("auto", "kernels"):
        kernel = _kernels_attention()
        if kernel is not None:
            return kernel(q, k, v, offsets, max_seq_len=max_seq_len, form=form, causal=causal)
        if backend == "kernels":
            raise ValueError("attention_backend='kernels' needs `from kernels import jagged_attention`")
        backend = "padded"
    if backend == "padded":
        return _padded_attention(q, k, v, offsets, max_seq_len, form, causal)
    if backend == "loop":
        return _loop_attention(q, k, v, offsets, max_seq_len, form, causal)
    raise ValueError(f"attention backend {backend!r} must be one of auto, kernels, padded, loop")


class JaggedMultiHeadAttention(nn.Module):
    """Pre-projected multi-head self-attention over jagged tokens: (N, D) -> (N, D)."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, *, form: str, causal: bool,
                 backend: str) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.form, self.causal, self.backend = form, causal, backend
        # No bias: a key bias gets a zero (noise-only) gradient under softmax, which Adam amplifies.
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim, bias=False)
        self.out = nn.Linear(num_heads * head_dim, dim)

    def forward(self, x_ND: torch.Tensor, offsets: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        q, k, v = self.qkv(x_ND).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        attn = jagged_self_attention(
            q.contiguous(), k.contiguous(), v.contiguous(), offsets, max_seq_len=max_seq_len,
            form=self.form, causal=self.causal, backend=self.backend,
        )
        return self.out(attn.reshape(x_ND.shape[0], -1))
