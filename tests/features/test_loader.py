"""FeatureLoader: the Batch contract, determinism, workers, resume from a state_dict."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gem.data.batch import Batch
from gem.features.loader import FeatureLoader


def example_ids(loader) -> list[np.ndarray]:
    return [b.example_id.numpy().copy() for b in loader]


def test_batches_honour_the_contract(conv_features):
    loader = FeatureLoader(conv_features, batch_size=64, seed=1)
    spec = loader.spec
    batch = next(iter(loader))
    assert isinstance(batch, Batch) and batch.batch_size == 64
    assert batch.sparse.keys() == list(spec.sparse)
    assert batch.sequence.keys() == list(spec.sequence)
    assert torch.equal(batch.sparse.lengths(), torch.ones(64 * len(spec.sparse), dtype=torch.long))
    lengths = batch.sequence.lengths().view(len(spec.sequence), 64)
    assert (lengths == lengths[0]).all() and int(lengths.max()) <= spec.max_seq_len
    total = int(lengths[0].sum())
    assert total > 0 and batch.sequence_age.shape == (total,) and batch.sequence_age.dtype == torch.float32
    assert (batch.sequence_age > 0).all()
    assert batch.dense.shape == (64, len(spec.dense)) and batch.dense.dtype == torch.float32
    assert batch.labels.shape == (64, 2) and set(batch.labels.unique().tolist()) <= {0.0, 1.0}
    assert batch.surface.dtype == torch.long and int(batch.surface.max()) < len(spec.surfaces)
    assert torch.equal(batch.sequence_offsets()[1:] - batch.sequence_offsets()[:-1], lengths[0])


def test_plain_arrays_hold_what_the_batches_hold(conv_features):
    """iter_arrays (the students' path, without torchrec) gives the batches' values in the
    same order and moves the same position (resume)."""
    spec = FeatureLoader(conv_features, batch_size=64).spec
    batches = list(FeatureLoader(conv_features, batch_size=64, seed=3))
    loader = FeatureLoader(conv_features, batch_size=64, seed=3)
    arrays = list(loader.iter_arrays())
    assert len(arrays) == len(batches) and loader.state_dict()["position"] == 0
    for a, b in zip(arrays, batches):
        sparse, sequence = b.sparse.to_dict(), b.sequence.to_dict()
        for i, key in enumerate(spec.sparse):
            assert torch.equal(a["sparse"][:, i], sparse[key].values())
        for i, key in enumerate(spec.sequence):
            assert torch.equal(a["sequence"][i], sequence[key].values())
            assert torch.equal(a["lengths"].long(), sequence[key].lengths())
        for key in ("dense", "surface", "labels", "example_id"):
            assert torch.equal(a[key], getattr(b, key))
    partial = FeatureLoader(conv_features, batch_size=64, seed=3)
    stream = partial.iter_arrays()
    next(stream), next(stream)
    resumed = FeatureLoader(conv_features, batch_size=64, seed=3)
    resumed.load_state_dict(partial.state_dict())
    assert torch.equal(next(iter(resumed)).example_id, next(stream)["example_id"])


def test_every_example_once_per_epoch_and_order_is_seeded(conv_features):
    a = FeatureLoader(conv_features, batch_size=100, seed=7)
    b = FeatureLoader(conv_features, batch_size=100, seed=7)
    c = FeatureLoader(conv_features, batch_size=100, seed=8)
    ids_a, ids_b, ids_c = example_ids(a), example_ids(b), example_ids(c)
    flat = np.concatenate(ids_a)
    assert len(flat) == a.num_examples == len(np.unique(flat))
    assert all(len(x) == 100 for x in ids_a[:-1]) and 0 < len(ids_a[-1]) <= 100
    assert len(ids_a) == len(a)
    assert all(np.array_equal(x, y) for x, y in zip(ids_a, ids_b))
    assert not np.array_equal(flat, np.concatenate(ids_c))
    a.set_epoch(1)
    epoch1 = np.concatenate(example_ids(a))
    assert not np.array_equal(flat, epoch1) and np.array_equal(np.sort(flat), np.sort(epoch1))


def test_unshuffled_order_follows_shards_and_drop_last(conv_features):
    loader = FeatureLoader(conv_features, batch_size=128, shuffle=False, drop_last=True)
    batches = example_ids(loader)
    assert all(len(x) == 128 for x in batches)
    assert len(batches) == loader.num_examples // 128
    subset = FeatureLoader(conv_features, batch_size=128, shards=loader.shard_names[:2])
    assert subset.num_examples == sum(s["examples"] for s in loader.manifest["shards"][:2])
    with pytest.raises(ValueError, match="unknown shard"):
        FeatureLoader(conv_features, batch_size=8, shards=["b999-2026-01-01"])


def test_workers_are_deterministic_and_cover_everything(conv_features):
    one = example_ids(FeatureLoader(conv_features, batch_size=50, seed=3, num_workers=1))
    zero = example_ids(FeatureLoader(conv_features, batch_size=50, seed=3, num_workers=0))
    assert all(np.array_equal(x, y) for x, y in zip(one, zero)) and len(one) == len(zero)
    two_a = example_ids(FeatureLoader(conv_features, batch_size=50, seed=3, num_workers=2))
    two_b = example_ids(FeatureLoader(conv_features, batch_size=50, seed=3, num_workers=2))
    assert len(two_a) == len(two_b) and all(np.array_equal(x, y) for x, y in zip(two_a, two_b))
    assert np.array_equal(np.sort(np.concatenate(two_a)), np.sort(np.concatenate(one)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_from_state_yields_exactly_the_remaining_batches(conv_features, num_workers):
    def make():
        return FeatureLoader(conv_features, batch_size=40, seed=5, num_workers=num_workers)

    reference = make()
    reference.set_epoch(2)
    full = example_ids(reference)
    assert len(full) > 10
    first = make()
    first.set_epoch(2)
    consumed = []
    for batch in first:
        consumed.append(batch.example_id.numpy().copy())
        if len(consumed) == 7:
            break
    state = first.state_dict()
    assert state["epoch"] == 2 and state["position"] == 7
    resumed = make()
    resumed.load_state_dict(state)
    rest = example_ids(resumed)
    assert len(consumed) + len(rest) == len(full)
    assert all(np.array_equal(x, y) for x, y in zip(consumed + rest, full))
    assert resumed.state_dict()["position"] == 0  # a finished epoch restarts at its beginning


def test_state_from_other_settings_is_refused(conv_features):
    state = FeatureLoader(conv_features, batch_size=40, seed=5).state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        FeatureLoader(conv_features, batch_size=41, seed=5).load_state_dict(state)


def test_later_shards_alone_and_a_tiny_segment_cache_give_the_same_examples(conv_features):
    from tests.features.conftest import collect

    full = collect(FeatureLoader(conv_features, batch_size=256, shuffle=False))
    shards = FeatureLoader(conv_features, batch_size=8).manifest["shards"]
    late = [s["name"] for s in shards if s["day"] >= "2026-01-03"]
    alone = collect(FeatureLoader(conv_features, batch_size=256, seed=2, shards=late, cache_events=0))
    assert 0 < len(alone) < len(full)
    for eid in alone:
        for key, value in alone[eid].items():
            np.testing.assert_array_equal(value, full[eid][key], err_msg=f"{eid} {key}")


def test_time_order_takes_days_oldest_first_and_shuffles_within_a_day(conv_features):
    day_of = {}
    for shard in FeatureLoader(conv_features, batch_size=64).manifest["shards"]:
        name, day = shard["name"], shard["day"]
        for ids in example_ids(FeatureLoader(conv_features, batch_size=4096, shuffle=False, shards=[name])):
            day_of.update(dict.fromkeys(ids.tolist(), day))
    assert len(set(day_of.values())) > 1
    runs = {}
    for seed in (1, 2):
        loader = FeatureLoader(conv_features, batch_size=64, seed=seed, shard_order="time")
        flat = np.concatenate(example_ids(loader))
        days = [day_of[i] for i in flat.tolist()]
        assert days == sorted(days) and len(flat) == len(day_of)
        runs[seed] = flat
    assert not np.array_equal(runs[1], runs[2])
    random_order = [day_of[i] for i in np.concatenate(example_ids(FeatureLoader(conv_features, batch_size=64,
                                                                                seed=1))).tolist()]
    assert random_order != sorted(random_order)
    resumed = FeatureLoader(conv_features, batch_size=64, seed=2)
    with pytest.raises(ValueError, match="shard_order"):
        resumed.load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="shard_order"):
        FeatureLoader(conv_features, batch_size=64, shard_order="newest")


def test_a_student_table_loads_without_torchrec(conv_features):
    """The students' whole read of a window (students.data.load_table) stays off torchrec."""
    import subprocess
    import sys

    probe = ("import sys; from students.config import StudentModelConfig; from students.data import load_table; "
             f"table, _ = load_table({str(conv_features)!r}, StudentModelConfig()); "
             "print(len(table), 'torchrec' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[-2]) == FeatureLoader(conv_features, batch_size=64).num_examples and out[-1] == "False"
