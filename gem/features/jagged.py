"""Numpy helpers for sorted event logs and jagged (ragged) index ranges.

Legend: n = events, m = ranges/examples, T = total gathered elements.
"""

from __future__ import annotations

import numpy as np


def run_starts(*keys: np.ndarray) -> np.ndarray:
    """int64 (n,): for rows sorted by ``keys``, the index of the first row of each row's
    run of equal keys. ``run_starts(user)`` gives each user's first row;
    ``run_starts(user, time)`` the first row of each same-(user, time) tie group."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for key in keys:
        new[1:] |= key[1:] != key[:-1]
    return np.maximum.accumulate(np.where(new, np.arange(n, dtype=np.int64), 0))


def ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """int64 (T,) = concat(arange(s, s + l) for s, l in zip(starts, lengths)), T = sum(lengths)."""
    lengths = lengths.astype(np.int64, copy=False)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts.astype(np.int64) - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def user_bucket(user_id: np.ndarray, num_buckets: int) -> np.ndarray:
    """int32 (n,): a stable hash bucket per raw user id (splitmix64 finaliser), so shard
    membership never depends on the library versions or the process."""
    z = user_id.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(num_buckets)).astype(np.int32)


def lookup(sorted_values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """int32 dense ids: 1 + position of each query in ``sorted_values`` (a vocabulary),
    0 where absent (unknown)."""
    if len(sorted_values) == 0:
        return np.zeros(len(query), dtype=np.int32)
    pos = np.searchsorted(sorted_values, query)
    pos_clipped = np.minimum(pos, len(sorted_values) - 1)
    found = sorted_values[pos_clipped] == query
    return np.where(found, pos_clipped + 1, 0).astype(np.int32)
