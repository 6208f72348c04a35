"""Small jagged-tensor helpers (values (N, D) + int64 offsets (B+1,)); no padding."""

from __future__ import annotations

import math

import torch

from kernels.jagged_pool import jagged_weighted_sum


def lengths_of(offsets: torch.Tensor) -> torch.Tensor:
    return offsets[1:] - offsets[:-1]


def offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)


def segment_ids(offsets: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """(N,) index of the sequence each token belongs to."""
    batch = offsets.numel() - 1
    return torch.repeat_interleave(
        torch.arange(batch, device=offsets.device), lengths_of(offsets), output_size=num_tokens
    )


def prepend_tokens(values_ND: torch.Tensor, offsets: torch.Tensor,
                   tokens_BCD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Put C tokens in front of every sequence: returns (N + B*C, D) values, new offsets."""
    batch, num_prefix, dim = tokens_BCD.shape
    num_tokens = values_ND.shape[0]
    seg = segment_ids(offsets, num_tokens)
    token_pos = torch.arange(num_tokens, device=values_ND.device) + num_prefix * (seg + 1)
    prefix_pos = (offsets[:-1] + num_prefix * torch.arange(batch, device=offsets.device))[:, None] \
        + torch.arange(num_prefix, device=offsets.device)[None, :]
    out = values_ND.new_empty(num_tokens + batch * num_prefix, dim)
    out = out.index_copy(0, token_pos, values_ND).index_copy(0, prefix_pos.reshape(-1), tokens_BCD.reshape(-1, dim))
    return out, offsets + num_prefix * torch.arange(batch + 1, device=offsets.device)


def keep_recent(values_ND: torch.Tensor, offsets: torch.Tensor, num_prefix: int,
                budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the C prefix tokens and the ``budget`` most recent others of each sequence."""
    lengths = lengths_of(offsets)
    kept = num_prefix + (lengths - num_prefix).clamp(max=budget)
    if bool((kept == lengths).all()):
        return values_ND, offsets
    seg = segment_ids(offsets, values_ND.shape[0])
    pos = torch.arange(values_ND.shape[0], device=values_ND.device) - offsets[seg]
    keep = (pos < num_prefix) | (pos >= lengths[seg] - (kept[seg] - num_prefix))
    return values_ND[keep], offsets_of(kept)


def gather_prefix(values_ND: torch.Tensor, offsets: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """(B, C, D): the first C tokens of each sequence (every sequence has them)."""
    idx = offsets[:-1, None] + torch.arange(num_prefix, device=offsets.device)[None, :]
    return values_ND[idx]


def gather_recent(values_ND: torch.Tensor, offsets: torch.Tensor, num_prefix: int,
                  count: int) -> torch.Tensor:
    """(B, R, D): the R most recent non-prefix tokens, oldest first, zeros where missing."""
    start = offsets[:-1] + num_prefix
    idx = offsets[1:, None] - count + torch.arange(count, device=offsets.device)[None, :]
    valid = idx >= start[:, None]
    picked = values_ND[idx.clamp(min=0).clamp(max=max(values_ND.shape[0] - 1, 0))]
    return picked * valid[..., None].to(picked.dtype)


def _segment_softmax(scores_NM: torch.Tensor, seg_N: torch.Tensor, batch: int) -> torch.Tensor:
    """Softmax of each column over each sequence's own tokens (N, M)."""
    # the per-sequence maximum only keeps exp() in range: a constant per sequence, no gradient
    peak_BM = scores_NM.new_full((batch, scores_NM.shape[1]), -torch.inf).scatter_reduce(
        0, seg_N[:, None].expand_as(scores_NM), scores_NM.detach(), "amax")
    e_NM = (scores_NM - peak_BM.index_select(0, seg_N)).exp()
    denom_BM = e_NM.new_zeros(peak_BM.shape).index_add_(0, seg_N, e_NM)
    return e_NM / denom_BM.index_select(0, seg_N)


def _segment_sum(values_NK: torch.Tensor, seg_N: torch.Tensor, batch: int) -> torch.Tensor:
    """(B, K) sums of each sequence's rows, accumulated in fp32 at least (0 for an empty one)."""
    dtype = torch.promote_types(values_NK.dtype, torch.float32)
    summed = torch.zeros(batch, values_NK.shape[1], dtype=dtype, device=values_NK.device)
    return summed.index_add_(0, seg_N, values_NK.to(dtype)).to(values_NK.dtype)


def attention_pool(values_ND: torch.Tensor, offsets: torch.Tensor, queries_MD: torch.Tensor) -> torch.Tensor:
    """(B, M, D): softmax attention of M learned queries over each sequence (empty -> 0).
    Jagged throughout: padding the batch to its longest history (2.7x the tokens on the
    demo's late batches) made this 2.8x slower (forward + backward, docs/training-efficiency.md)."""
    batch, dim = offsets.numel() - 1, queries_MD.shape[1]
    seg_N = segment_ids(offsets, values_ND.shape[0])
    scores_NM = values_ND @ queries_MD.t().to(values_ND.dtype) / math.sqrt(dim)
    weights_NM = _segment_softmax(scores_NM, seg_N, batch)
    return jagged_weighted_sum(weights_NM, values_ND, offsets, seg_N)  # kernels/jagged_pool.py


def target_pool(values_ND: torch.Tensor, offsets: torch.Tensor, queries_BD: torch.Tensor) -> torch.Tensor:
    """(B, D): softmax attention of one query per sequence over its tokens (empty -> 0)."""
    batch = offsets.numel() - 1
    seg_N = segment_ids(offsets, values_ND.shape[0])
    queries_ND = queries_BD.to(values_ND.dtype).index_select(0, seg_N)
    scores_N1 = (values_ND * queries_ND).sum(-1, keepdim=True) / math.sqrt(values_ND.shape[1])
    return _segment_sum(_segment_softmax(scores_N1, seg_N, batch) * values_ND, seg_N, batch)
