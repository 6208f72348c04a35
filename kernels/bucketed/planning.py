"""Grouping jagged sequences into padded chunks for batched matmuls.

Attention costs ~L^2 per sequence, so padding a short sequence to a long one wastes
quadratically. Sequences are sorted by kept length and split into buckets by an exact
dynamic program over a cost model: padded score elements (heads * count * size^2) plus a
fixed per-chunk cost standing for the ~20 tensor ops each chunk launches. A bucket whose
score matrices would exceed `max_chunk_scores` is cut into chunks, which bounds peak
memory and keeps every buffer small enough for the allocator to reuse rather than
map fresh pages on each call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

SIZE_MULTIPLE = 8  # padded sizes are multiples of this (fewer DP states, aligned rows)
# fixed per-chunk cost, in score elements (measured on an earlier 2-core AMD EPYC; not retuned)
CHUNK_OVERHEAD_SCORES = 40_000
MAX_CHUNK_SCORES = 1 << 22  # 4M score elements = 16 MiB in float32 per score buffer


@dataclass(frozen=True)
class Chunk:
    """n sequences padded to `size` positions.

    gather: (n * size,) int64 token index per padded position to read from; padding
        positions hold 0 and are zero-filled after the gather (`padding`), so no token's
        values (a NaN, say) reach another sequence through padding.
    padding: (P,) int64 padding positions in 0 .. n * size - 1.
    scatter: like gather, but padding points at `trash_index` (a spare row after the T
        real tokens in output buffers).
    lengths, history: (n,) int64 kept length and history length of each sequence.
    heads_per_group: heads processed together; below H only for sequences so long that
        all heads' scores at once would exceed the chunk budget.
    """

    size: int
    gather: torch.Tensor
    padding: torch.Tensor
    scatter: torch.Tensor
    lengths: torch.Tensor
    history: torch.Tensor
    heads_per_group: int


def _bucket_bounds(sizes: np.ndarray, counts: np.ndarray, num_heads: int,
                   max_chunk_scores: int) -> list[tuple[int, int]]:
    """Optimal split of sorted distinct sizes into buckets [a, b] (inclusive indices)."""
    num_sizes = len(sizes)
    cum = np.concatenate([[0], np.cumsum(counts)])
    best = np.zeros(num_sizes + 1)
    choice = np.zeros(num_sizes + 1, dtype=np.int64)
    for b in range(1, num_sizes + 1):
        a = np.arange(b)  # bucket holds distinct sizes a .. b-1
        count = cum[b] - cum[a]
        scores = num_heads * count * float(sizes[b - 1]) ** 2
        per_seq = max(num_heads * float(sizes[b - 1]) ** 2, 1.0)
        seqs_per_chunk = max(int(max_chunk_scores // per_seq), 1)
        head_groups = np.ceil(per_seq / max_chunk_scores)
        num_chunks = np.ceil(count / seqs_per_chunk) * head_groups
        cost = best[a] + scores + CHUNK_OVERHEAD_SCORES * num_chunks
        choice[b] = int(np.argmin(cost))
        best[b] = cost[choice[b]]
    bounds = []
    b = num_sizes
    while b > 0:
        bounds.append((int(choice[b]), b - 1))
        b = int(choice[b])
    return bounds[::-1]


def plan_chunks(starts: torch.Tensor, lengths: torch.Tensor, history: torch.Tensor,
                trash_index: int, num_heads: int,
                max_chunk_scores: int | None = None) -> list[Chunk]:
    """Chunks covering every non-empty sequence exactly once (all inputs (B,) int64).

    max_chunk_scores: score elements per chunk (default MAX_CHUNK_SCORES, read per call).
    """
    max_chunk_scores = max_chunk_scores or MAX_CHUNK_SCORES
    device = starts.device
    lengths_np = lengths.cpu().numpy()
    keep = np.nonzero(lengths_np > 0)[0]
    if len(keep) == 0:
        return []
    order = keep[np.argsort(lengths_np[keep], kind="stable")]
    padded = -(-lengths_np[order] // SIZE_MULTIPLE) * SIZE_MULTIPLE
    sizes, counts = np.unique(padded, return_counts=True)
    size_starts = np.concatenate([[0], np.cumsum(counts)])
    chunks = []
    for first, last in _bucket_bounds(sizes, counts, num_heads, max_chunk_scores):
        size = int(sizes[last])
        members = order[size_starts[first]:size_starts[last + 1]]
        per_chunk = max(max_chunk_scores // (num_heads * size * size), 1)
        heads_per_group = min(num_heads, max(max_chunk_scores // (size * size), 1))
        for lo in range(0, len(members), per_chunk):
            ids = torch.from_numpy(members[lo:lo + per_chunk]).to(device)
            chunks.append(_make_chunk(size, starts[ids], lengths[ids], history[ids],
                                      trash_index, heads_per_group))
    return chunks


def _make_chunk(size: int, starts: torch.Tensor, lengths: torch.Tensor, history: torch.Tensor,
                trash_index: int, heads_per_group: int) -> Chunk:
    pos = torch.arange(size, device=starts.device).view(1, size)
    inside = pos < lengths.view(-1, 1)
    tokens = starts.view(-1, 1) + pos
    return Chunk(size=size, gather=torch.where(inside, tokens, 0).reshape(-1),
                 padding=torch.nonzero(~inside.reshape(-1)).flatten(),
                 scatter=torch.where(inside, tokens, trash_index).reshape(-1),
                 lengths=lengths, history=history, heads_per_group=heads_per_group)
