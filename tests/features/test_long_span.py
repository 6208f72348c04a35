"""Long spans: the shard width follows the events per day, a shard reads only its own
period (never its bucket's whole history), and the loader's time order still goes day
by day through shards of many days."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from gem.data.contract import MANIFEST
from gem.features.build import build_features, finalize_build, prepare_build
from gem.features.loader import FeatureLoader
from gem.features.shards import build_shard, list_shards
from tests.datasets.shapes import repeated_years
from tests.features.conftest import raw_events, tiny_cfg

US_PER_DAY = 86_400_000_000
SHARD_EVENTS = 150  # per bucket: a year of the base data makes ~12 periods


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from gem.data.simulate import SimulatorConfig, simulate

    out = tmp_path_factory.mktemp("long") / "base"
    simulate(SimulatorConfig(users=120, items=300, days=4, topics=6, advertisers=20, seed=11, click_bias=-2.5,
                             click_delay_hours=6.0, workers=1), out, progress=False)
    return out


@pytest.fixture(scope="module")
def years(base):
    """The same year of events (on every 7th day) once, and repeated for three years."""
    return {n: repeated_years(base, base.parent / f"years{n}", n) for n in (1, 3)}


def _build_counting_reads(data, out, cfg) -> tuple[dict, list[int]]:
    """Build shard by shard; per shard, the rows of events it read (counted where
    pyarrow returns Parquet tables, whatever code path asked)."""
    plan = prepare_build(data, out, cfg)
    read_table, read_file, read = pq.read_table, pq.ParquetFile.read, []

    def count(table):
        read[-1] += table.num_rows if "event_id" in table.column_names else 0  # not the vocabularies
        return table

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pq, "read_table", lambda *a, **k: count(read_table(*a, **k)))
        patch.setattr(pq.ParquetFile, "read", lambda self, *a, **k: count(read_file(self, *a, **k)))
        for key in list_shards(plan):
            read.append(0)
            build_shard(plan, key)
    return finalize_build(plan, cfg), read


@pytest.fixture(scope="module")
def builds(years, tmp_path_factory):
    """Both spans built with the width chosen from the data: (manifest, rows read per
    shard, features directory)."""
    cfg = tiny_cfg(max_seq_len=32, days_per_shard=0, shard_events=SHARD_EVENTS)
    out = tmp_path_factory.mktemp("long-features")
    return {n: (*_build_counting_reads(years[n], out / f"years{n}", cfg), out / f"years{n}") for n in (1, 3)}


def test_a_long_sparse_dataset_gets_shards_by_its_events_not_its_days(years, builds):
    from tests.features.test_leakage import check_against_brute_force

    data = years[3]
    cfg = tiny_cfg(max_seq_len=32, days_per_shard=0, shard_events=SHARD_EVENTS)
    manifest = builds[3][0]
    events = raw_events(data)
    days = np.bincount((events["event_time"].to_numpy() - int(events["event_time"].min()) // US_PER_DAY * US_PER_DAY)
                       // US_PER_DAY)
    periods = manifest["periods"]
    assert periods["days_per_shard"] == 0 and periods["shard_events"] == SHARD_EVENTS
    assert sum(periods["days"]) >= len(days) > 1000
    assert manifest["counts"]["shards"] == cfg.num_buckets * len(periods["days"])
    # every period but the last is filled to the target, and its last day is what filled it
    target, lo = SHARD_EVENTS * cfg.num_buckets, 0
    for width in periods["days"][:-1]:
        assert days[lo:lo + width].sum() >= target > days[lo:lo + width - 1].sum()
        lo += width
    assert len(periods["days"]) <= len(events) / target + 1  # proportional to events, not days
    assert [s["days"] for s in manifest["shards"][:len(periods["days"])]] == periods["days"]
    counts = check_against_brute_force(data, builds[3][2], sample=150)
    assert counts["checked"] == 150 and counts["elements"] > 1_000


def test_shard_work_does_not_grow_with_the_history(years, builds):
    cfg = tiny_cfg(max_seq_len=32, days_per_shard=0, shard_events=SHARD_EVENTS)
    (one, read_one, _), (three, read_three, _) = builds[1], builds[3]
    # the same events per day: three times the shards, each reading what a shard of the
    # one-year build reads, although the histories of the third year are three times longer
    assert abs(three["counts"]["shards"] - 3 * one["counts"]["shards"]) <= 2 * cfg.num_buckets
    assert np.mean(read_three) <= 1.15 * np.mean(read_one)
    assert max(read_three) <= 1.15 * max(read_one)
    # all shards together read each stored event about twice (staged row + index row)
    assert sum(read_three) <= 2 * len(raw_events(years[3]))
    assert sum(read_three) == three["counts"]["staged_rows_read_by_shards"]


def test_auto_width_keeps_dense_days_apart_and_explicit_widths_hold(conv_dataset, conv_features, tmp_path):
    daily = json.loads((conv_features / MANIFEST).read_text())
    # each day holds more than the target: the same day shards, byte for byte
    auto = build_features(conv_dataset, tmp_path / "auto", tiny_cfg(max_seq_len=48, days_per_shard=0,
                                                                       shard_events=300))
    assert auto["periods"]["days"] == [1, 1, 1, 1]
    assert auto["digest"] == daily["digest"]
    three = build_features(conv_dataset, tmp_path / "three", tiny_cfg(max_seq_len=48, days_per_shard=3))
    assert three["periods"]["days"] == [3, 3] and [s["days"] for s in three["shards"]] == [3, 3, 3, 3]
    assert [sum(s["examples_by_day"]) for s in three["shards"]] == [s["examples"] for s in three["shards"]]


def test_time_order_goes_day_by_day_through_shards_of_many_days(conv_dataset, conv_features, tmp_path):
    from tests.features.conftest import collect

    out = tmp_path / "wide"
    manifest = build_features(conv_dataset, out, tiny_cfg(max_seq_len=48, days_per_shard=0))
    assert manifest["periods"]["days"] == [4] and manifest["counts"]["shards"] == 2  # one period, two buckets
    day_of = dict(zip(raw_events(conv_dataset)["event_id"].tolist(),
                      (raw_events(conv_dataset)["event_time"] // US_PER_DAY).tolist()))
    loader = FeatureLoader(out, batch_size=64, seed=3, shard_order="time")
    batches = [b.example_id.numpy() for b in loader]
    flat = np.concatenate(batches)
    days = [day_of[i] for i in flat.tolist()]
    assert days == sorted(days) and len(set(days)) == 4 and len(flat) == len(set(flat.tolist()))
    # a resume inside a day of a shard yields exactly the remaining batches
    loader = FeatureLoader(out, batch_size=64, seed=3, shard_order="time")
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = loader.state_dict()
    resumed = FeatureLoader(out, batch_size=64, seed=3, shard_order="time")
    resumed.load_state_dict(state)
    rest = [b.example_id.numpy() for b in resumed]
    assert len(rest) == len(batches) - 7
    for got, want in zip(rest, batches[7:]):
        np.testing.assert_array_equal(got, want)
    # and the examples are those of the daily build, element for element
    a, b = collect(FeatureLoader(out, batch_size=256, shuffle=False)), collect(
        FeatureLoader(conv_features, batch_size=256, shuffle=False))
    assert sorted(a) == sorted(b)
    for eid in list(a)[::11]:
        for key, value in a[eid].items():
            np.testing.assert_array_equal(value, b[eid][key], err_msg=f"{eid} {key}")
