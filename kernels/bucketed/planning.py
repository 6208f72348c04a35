"""Grouping jagged sequences into padded chunks for batched kernels.

Attention costs ~L^2 per sequence, so padding a short sequence to a long one wastes
quadratically. Sequences are sorted by kept length and split into buckets by an exact
dynamic program over a cost model: padded score elements (heads * count * size^2) plus a
fixed per-chunk cost standing for the tensor ops each chunk launches. A bucket whose
score matrices would exceed `max_chunk_scores` is cut into chunks, which bounds peak
memory and keeps every buffer small enough for the allocator to reuse rather than
map fresh pages on each call.

With `solo_min`, every sequence at least that long is its own "solo" chunk: the fused
kernels read and write it in place as a view of the (T, H, D) tensors (no gather, no
padding, no mask), which is where most of the work of a long-tailed batch lies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

SIZE_MULTIPLE = 8  # padded sizes are multiples of this (fewer DP states, aligned rows)
# Fixed per-chunk cost, in score elements (heads included), of the bmm path: ~20 tensor ops
# per chunk (measured on an earlier 2-core AMD EPYC).
CHUNK_OVERHEAD_SCORES = 40_000
# The same for the fused path (a gather per input, one kernel call, slices out), and the
# length from which a sequence runs solo there: measured on the benchmark's default batch
# (kernels.benchmarks.jagged_attention_bench).
FUSED_CHUNK_OVERHEAD_SCORES = 40_000
FUSED_SOLO_MIN = 128
MAX_CHUNK_SCORES = 1 << 22  # 4M score elements = 16 MiB in float32 per score buffer
# Padded rows per chunk: bounds each gathered input (8 MiB at H * D = 256 in float32) when
# many short sequences share a size.
MAX_CHUNK_ROWS = 1 << 13


@dataclass(frozen=True)
class Chunk:
    """n sequences padded to `size` positions, or one sequence read in place (`solo`).

    gather: (n * size,) int64 token index per padded position to read from; padding
        positions hold 0 and are zero-filled after the gather (`padding`), so no token's
        values (a NaN, say) reach another sequence through padding. None when solo.
    padding: (P,) int64 padding positions in 0 .. n * size - 1 (None when solo).
    scatter: like gather, but padding points at `trash_index` (a spare row after the T
        real tokens in output buffers). None when solo.
    lengths, history: (n,) int64 kept length and history length of each sequence.
    heads_per_group: heads processed together; below H only for sequences so long that
        all heads' scores at once would exceed the chunk budget.
    sequences, kept, firsts: the sequences' indices in the batch, kept lengths and first
        kept tokens (ints).
    solo: one sequence of exactly `size` tokens starting at token `start`, no padding.
    """

    size: int
    gather: torch.Tensor | None
    padding: torch.Tensor | None
    scatter: torch.Tensor | None
    lengths: torch.Tensor
    history: torch.Tensor
    heads_per_group: int
    sequences: tuple[int, ...] = ()
    kept: tuple[int, ...] = ()
    firsts: tuple[int, ...] = ()
    solo: bool = False
    start: int = 0


def _seqs_per_chunk(size: int, num_heads: int, max_chunk_scores: int) -> int:
    by_scores = max_chunk_scores // max(num_heads * size * size, 1)
    return max(min(by_scores, MAX_CHUNK_ROWS // max(size, 1)), 1)


def _bucket_bounds(sizes: np.ndarray, counts: np.ndarray, num_heads: int,
                   max_chunk_scores: int, overhead: float) -> list[tuple[int, int]]:
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
        seqs_per_chunk = _seqs_per_chunk(int(sizes[b - 1]), num_heads, max_chunk_scores)
        head_groups = np.ceil(per_seq / max_chunk_scores)
        num_chunks = np.ceil(count / seqs_per_chunk) * head_groups
        cost = best[a] + scores + overhead * num_chunks
        choice[b] = int(np.argmin(cost))
        best[b] = cost[choice[b]]
    bounds = []
    b = num_sizes
    while b > 0:
        bounds.append((int(choice[b]), b - 1))
        b = int(choice[b])
    return bounds[::-1]


def plan_chunks(starts: torch.Tensor, lengths: torch.Tensor, history: torch.Tensor,
                trash_index: int, num_heads: int, max_chunk_scores: int | None = None,
                solo_min: int | None = None, overhead: float | None = None) -> list[Chunk]:
    """Chunks covering every non-empty sequence exactly once (all inputs (B,) int64).

    max_chunk_scores: score elements per chunk (default MAX_CHUNK_SCORES, read per call);
        a chunk also holds at most MAX_CHUNK_ROWS padded rows.
    solo_min: sequences at least this long become solo chunks (None: none do).
    overhead: per-chunk cost in score elements (default CHUNK_OVERHEAD_SCORES).
    """
    max_chunk_scores = max_chunk_scores or MAX_CHUNK_SCORES
    overhead = CHUNK_OVERHEAD_SCORES if overhead is None else overhead
    device = starts.device
    lengths_np, starts_np = lengths.cpu().numpy(), starts.cpu().numpy()
    keep = np.nonzero(lengths_np > 0)[0]
    chunks = []
    if solo_min is not None:
        solo = keep[lengths_np[keep] >= solo_min]
        keep = keep[lengths_np[keep] < solo_min]
        for b in solo[np.argsort(lengths_np[solo], kind="stable")]:
            size = int(lengths_np[b])
            chunks.append(Chunk(size=size, gather=None, padding=None, scatter=None,
                                lengths=lengths[b:b + 1], history=history[b:b + 1],
                                heads_per_group=_heads_per_group(num_heads, size, max_chunk_scores),
                                sequences=(int(b),), kept=(size,), firsts=(int(starts_np[b]),),
                                solo=True, start=int(starts_np[b])))
    if len(keep) == 0:
        return chunks
    order = keep[np.argsort(lengths_np[keep], kind="stable")]
    padded = -(-lengths_np[order] // SIZE_MULTIPLE) * SIZE_MULTIPLE
    sizes, counts = np.unique(padded, return_counts=True)
    size_starts = np.concatenate([[0], np.cumsum(counts)])
    batched = []
    for first, last in _bucket_bounds(sizes, counts, num_heads, max_chunk_scores, overhead):
        size = int(sizes[last])
        members = order[size_starts[first]:size_starts[last + 1]]
        per_chunk = _seqs_per_chunk(size, num_heads, max_chunk_scores)
        for lo in range(0, len(members), per_chunk):
            ids_np = members[lo:lo + per_chunk]
            ids = torch.from_numpy(ids_np).to(device)
            batched.append(_make_chunk(size, starts[ids], lengths[ids], history[ids], trash_index,
                                       _heads_per_group(num_heads, size, max_chunk_scores),
                                       tuple(ids_np.tolist()), tuple(lengths_np[ids_np].tolist()),
                                       tuple(starts_np[ids_np].tolist())))
    return batched + chunks


def _heads_per_group(num_heads: int, size: int, max_chunk_scores: int) -> int:
    return min(num_heads, max(max_chunk_scores // (size * size), 1))


def _make_chunk(size: int, starts: torch.Tensor, lengths: torch.Tensor, history: torch.Tensor,
                trash_index: int, heads_per_group: int, sequences: tuple[int, ...],
                kept: tuple[int, ...], firsts: tuple[int, ...]) -> Chunk:
    pos = torch.arange(size, device=starts.device).view(1, size)
    inside = pos < lengths.view(-1, 1)
    tokens = starts.view(-1, 1) + pos
    return Chunk(size=size, gather=torch.where(inside, tokens, 0).reshape(-1),
                 padding=torch.nonzero(~inside.reshape(-1)).flatten(),
                 scatter=torch.where(inside, tokens, trash_index).reshape(-1),
                 lengths=lengths, history=history, heads_per_group=heads_per_group,
                 sequences=sequences, kept=kept, firsts=firsts)
