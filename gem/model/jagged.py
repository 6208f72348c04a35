"""Small jagged-tensor helpers (values (N, D) + int64 offsets (B+1,)); no padding
except in ``attention_pool``, whose queries are few."""

from __future__ import annotations

import math

import torch


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


def attention_pool(values_ND: torch.Tensor, offsets: torch.Tensor, queries_MD: torch.Tensor) -> torch.Tensor:
    """(B, M, D): softmax attention of M learned queries over each sequence (empty -> 0)."""
    batch = offsets.numel() - 1
    lengths = lengths_of(offsets)
    max_len = max(int(lengths.max()) if batch else 0, 1)
    dense_BLD = torch.ops.fbgemm.jagged_to_padded_dense(values_ND, [offsets], [max_len], 0.0)
    scores_BML = torch.einsum("md,bld->bml", queries_MD.to(dense_BLD.dtype), dense_BLD) / math.sqrt(values_ND.shape[1])
    valid_BL = torch.arange(max_len, device=offsets.device)[None, :] < lengths[:, None]
    scores_BML = scores_BML.masked_fill(~(valid_BL | (lengths[:, None] == 0))[:, None, :], float("-inf"))
    pooled = torch.bmm(scores_BML.softmax(-1), dense_BLD)
    return pooled * (lengths > 0)[:, None, None].to(pooled.dtype)


def target_pool(values_ND: torch.Tensor, offsets: torch.Tensor, queries_BD: torch.Tensor) -> torch.Tensor:
    """(B, D): softmax attention of one query per sequence over its tokens (empty -> 0)."""
    lengths = lengths_of(offsets)
    max_len = max(int(lengths.max()) if lengths.numel() else 0, 1)
    dense_BLD = torch.ops.fbgemm.jagged_to_padded_dense(values_ND, [offsets], [max_len], 0.0)
    scores_BL = torch.einsum("bd,bld->bl", queries_BD.to(dense_BLD.dtype), dense_BLD) / math.sqrt(values_ND.shape[1])
    valid_BL = torch.arange(max_len, device=offsets.device)[None, :] < lengths[:, None]
    scores_BL = scores_BL.masked_fill(~(valid_BL | (lengths[:, None] == 0)), float("-inf"))
    pooled = torch.einsum("bl,bld->bd", scores_BL.softmax(-1), dense_BLD)
    return pooled * (lengths > 0)[:, None].to(pooled.dtype)
