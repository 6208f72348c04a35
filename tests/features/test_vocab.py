"""Vocabulary lookups: the binary search over sorted integer ids gives exactly the ids
of a hash lookup (pyarrow index_in), for every kind of query."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gem.features.vocab import Vocabularies


def hashed_ids(vocab: pa.Array, raw) -> np.ndarray:
    raw = raw if isinstance(raw, (pa.Array, pa.ChunkedArray)) else pa.array(raw)
    pos = pc.index_in(raw.cast(vocab.type), value_set=vocab)
    return (pc.fill_null(pos, -1).to_numpy(zero_copy_only=False) + 1).astype(np.int32)


@pytest.mark.parametrize("n_vocab", [0, 1, 7, 5_000])
def test_integer_ids_equal_the_hash_lookup(n_vocab):
    rng = np.random.default_rng(n_vocab)
    values = np.sort(rng.choice(np.arange(-10**12, 10**12, 7919), n_vocab, replace=False)).astype(np.int64)
    if n_vocab > 2:  # the extremes of int64 sort and compare without overflow
        values[0], values[-1] = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    vocab = Vocabularies({"user_id": pa.array(values, pa.int64())})
    known = rng.choice(values, 300) if n_vocab else np.zeros(0, np.int64)
    unknown = rng.integers(-10**12, 10**12, 300)
    mixed = np.concatenate([known, unknown, [np.iinfo(np.int64).max, np.iinfo(np.int64).min]])
    queries = [mixed, np.sort(mixed), np.sort(np.tile(mixed, 40)), mixed.astype(np.int32) if n_vocab < 2 else known,
               pa.array(mixed), pa.chunked_array([mixed[:10], mixed[10:]]), mixed[:0]]
    for raw in queries:
        got = vocab.ids("user_id", raw)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, hashed_ids(vocab.values["user_id"], raw))
    if n_vocab:
        assert vocab.ids("user_id", values).tolist() == list(range(1, n_vocab + 1))


def test_nulls_strings_and_unsorted_vocabularies_take_the_hash_lookup():
    vocab = Vocabularies({"user_id": pa.array([3, 9, 20], pa.int64()), "country": pa.array(["de", "fr", "us"]),
                          "odd": pa.array([20, 3, 9], pa.int64())})
    assert vocab.ids("user_id", pa.array([9, None, 4, 20])).tolist() == [2, 0, 0, 3]
    assert vocab.ids("country", pa.array(["us", None, "xx", "de"])).tolist() == [3, 0, 0, 1]
    assert vocab.ids("odd", np.array([3, 9, 20, 5])).tolist() == [2, 3, 1, 0]  # ranks in stored order
