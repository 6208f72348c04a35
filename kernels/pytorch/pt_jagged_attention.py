"""Reference jagged attention: a plain loop over sequences, differentiable by autograd.

Slow and obviously correct; every other backend is tested against it. Runs in the
inputs' dtype (use float64 for ground truth). Conventions: kernels/attention_spec.py.
"""

from __future__ import annotations

import torch

from kernels.attention_spec import (
    ACTIVATIONS,
    Spec,
    allowed_mask,
    bias_radius,
    dropout_keep,
    history_lengths,
    kept_spans,
    relative_position_index,
)


def pytorch_jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    max_seq_len: int,
    form: str = "softmax",
    causal: bool = False,
    attn_bias: torch.Tensor | None = None,
    num_targets: torch.Tensor | None = None,
    activation: str = "silu",
    scale: float | None = None,
    max_attn_len: int = 0,
    contextual_len: int = 0,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
) -> torch.Tensor:
    """q, k: (T, H, D); v: (T, H, Dv); offsets: (B+1,) int64 -> (T, H, Dv).

    attn_bias: (H, 2R+1) relative position table or None; num_targets: (B,) or None.
    The other options are Spec's (kernels/attention_spec.py).
    """
    spec = Spec(max_seq_len, form, causal, activation, scale, max_attn_len, contextual_len,
                dropout_p, dropout_seed)
    return reference_attention(q, k, v, offsets, attn_bias, num_targets, spec)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                        attn_bias: torch.Tensor | None, num_targets: torch.Tensor | None,
                        spec: Spec) -> torch.Tensor:
    """pytorch_jagged_attention with its options as a Spec."""
    max_seq_len, form, causal, activation = spec.max_seq_len, spec.form, spec.causal, spec.activation
    num_tokens, num_heads, dim = q.shape
    scale = spec.score_scale(dim)
    heads = torch.arange(num_heads, device=q.device)
    starts, lengths = kept_spans(offsets, max_seq_len)
    history = history_lengths(lengths, num_targets)
    pieces = []
    cursor = 0
    for start, length, hist in zip(starts.tolist(), lengths.tolist(), history.tolist()):
        if start > cursor:  # tokens dropped by truncation (or before the first sequence)
            pieces.append(v.new_zeros(start - cursor, num_heads, v.shape[2]))
        cursor = start + length
        if length == 0:
            continue
        q_hld = q[start:cursor].transpose(0, 1)
        k_hld = k[start:cursor].transpose(0, 1)
        v_hld = v[start:cursor].transpose(0, 1)
        scores = q_hld @ k_hld.transpose(1, 2) * scale  # (H, L, L)
        hist_t = torch.tensor([hist], device=q.device)
        allowed = allowed_mask(torch.tensor([length], device=q.device), hist_t, length, causal,
                               spec.max_attn_len, spec.contextual_len)[0]
        if attn_bias is not None:
            index = relative_position_index(hist_t, length, bias_radius(attn_bias))[0]
            scores = scores + attn_bias[:, index].to(scores.dtype)
        if form == "softmax":
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        else:
            act = ACTIVATIONS[activation].fn(scores)
            weights = torch.where(allowed, act, torch.zeros_like(act)) / length
        if spec.dropout_p > 0:
            tokens = torch.arange(start, cursor, device=q.device).view(1, -1)
            keep = dropout_keep(spec.dropout_seed, spec.dropout_p, heads, tokens, tokens)[:, 0]
            weights = torch.where(keep, weights / (1.0 - spec.dropout_p), torch.zeros_like(weights))
        pieces.append((weights @ v_hld).transpose(0, 1))
    if num_tokens > cursor:
        pieces.append(v.new_zeros(num_tokens - cursor, num_heads, v.shape[2]))
    if not pieces:
        return v.new_zeros(num_tokens, num_heads, v.shape[2])
    return torch.cat(pieces, dim=0)
