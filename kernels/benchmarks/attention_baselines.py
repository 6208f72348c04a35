"""Other ways to compute softmax(Q K^T / sqrt(D)) V per jagged sequence, for benchmarks.

Every function maps q, k, v (T, H, D) and offsets (B+1,) to (T, H, D), differentiably,
and computes the same thing as jagged_attention(..., form="softmax", causal=False) when
max_len >= every sequence length (and every sequence is non-empty).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def padded_sdpa(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int) -> Tensor:
    """Pad every sequence to max_len, SDPA with a key-padding mask, take the values back."""
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    num_tokens, num_heads, dim = q.shape
    batch = offsets.shape[0] - 1

    def pad(x: Tensor) -> Tensor:
        dense = torch.ops.fbgemm.jagged_to_padded_dense(
            x.reshape(num_tokens, -1), [offsets], [max_len])
        return dense.view(batch, max_len, num_heads, -1).transpose(1, 2)

    lengths = offsets[1:] - offsets[:-1]
    key_mask = torch.arange(max_len).view(1, max_len) < lengths.view(-1, 1)  # (B, L)
    out = F.scaled_dot_product_attention(pad(q), pad(k), pad(v),
                                         attn_mask=key_mask.view(batch, 1, 1, max_len))
    out = out.transpose(1, 2).reshape(batch, max_len, -1)
    return torch.ops.fbgemm.dense_to_jagged(out, [offsets])[0].view(num_tokens, num_heads, -1)


def nested_sdpa(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int) -> Tensor:
    """torch nested tensors (layout=torch.jagged) through SDPA."""
    def nest(x: Tensor) -> Tensor:
        return torch.nested.nested_tensor_from_jagged(x, offsets).transpose(1, 2)

    out = F.scaled_dot_product_attention(nest(q), nest(k), nest(v))
    return out.transpose(1, 2).values()


def fbgemm_sll_per_head(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int) -> Tensor:
    """fbgemm's single-head sll_jagged_flash_attention_basic looped over heads.

    It computes (softmax(Q K^T) / max_len) V: q is pre-scaled by 1/sqrt(D) and the
    result multiplied by max_len so the function equals the others.
    """
    import fbgemm_gpu.sll  # noqa: F401  (registers the sll ops)

    scale = 1.0 / math.sqrt(q.shape[2])
    heads = [
        torch.ops.fbgemm.sll_jagged_flash_attention_basic(
            (q[:, h] * scale).contiguous(), k[:, h].contiguous(), v[:, h].contiguous(),
            offsets, max_len)
        for h in range(q.shape[1])
    ]
    return torch.stack(heads, dim=1) * max_len


def padded_dense(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int,
                 form: str = "softmax", causal: bool = False) -> Tensor:
    """Pad to max_len with fbgemm's jagged<->dense ops, mask, dense math, take values back.

    What HSTU's PyTorch reference does for its GDPA form (einsum, SiLU, mask), normalized
    by each sequence's length (our convention) rather than by max_len. Softmax goes through
    SDPA with a boolean mask. (Formerly the model's `padded` attention backend.)
    """
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    num_tokens, heads, head_dim = q.shape
    batch = offsets.numel() - 1
    lengths = offsets[1:] - offsets[:-1]

    def pad(x: Tensor) -> Tensor:
        dense = torch.ops.fbgemm.jagged_to_padded_dense(
            x.reshape(num_tokens, -1), [offsets], [max_len], 0.0)
        return dense.view(batch, max_len, heads, -1).transpose(1, 2)

    positions = torch.arange(max_len, device=q.device)
    # Position 0 stays a valid key so empty sequences don't produce NaN rows (discarded later).
    key_valid = (positions[None, :] < lengths[:, None]) | (positions[None, :] == 0)
    mask = key_valid[:, None, None, :]
    if causal:
        mask = mask & torch.ones(max_len, max_len, dtype=torch.bool, device=q.device).tril()
    q_d, k_d, v_d = pad(q), pad(k), pad(v)
    if form == "softmax":
        out = F.scaled_dot_product_attention(q_d, k_d, v_d, attn_mask=mask)
    else:
        scores = torch.matmul(q_d, k_d.transpose(-1, -2)) / math.sqrt(head_dim)
        inv_len = 1.0 / lengths.clamp(min=1).view(batch, 1, 1, 1).to(scores.dtype)
        out = torch.matmul(F.silu(scores) * mask * inv_len, v_d)
    out = out.transpose(1, 2).reshape(batch, max_len, -1)
    return torch.ops.fbgemm.dense_to_jagged(out, [offsets])[0].view(num_tokens, heads, -1)
