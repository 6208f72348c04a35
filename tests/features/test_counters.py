"""Point-in-time counters (gem/features/counters.py): a row counts for an example only
once its label is known strictly before the example's time, and every count of a build
equals a brute-force recount from the raw events."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from gem.features.counters import (
    COUNT_COLUMNS,
    COUNTER_FEATURES,
    GLOBAL,
    HORIZONS,
    KINDS,
    SIGNALS,
    count_before,
    count_column,
    counts_for_kind,
)
from gem.features.loader import FeatureLoader
from gem.features.segments import read_examples, read_segment
from tests.features.conftest import collect, raw_events, tiny_cfg
from tests.features.test_leakage import rewrite_events

DAY = 86_400_000_000


def test_count_before_is_strict_and_per_key():
    # key 7: increments at 10 (signal 0), 10 (signal 1), 12 (signal 0); key 8: one at 5
    inc_keys, inc_time, inc_signal = [np.array([7, 7, 7, 8])], np.array([10, 10, 12, 5]), np.array([0, 1, 0, 0])
    q_keys, q_time = [np.array([7, 7, 7, 8, 9, 8])], np.array([10, 11, 13, 5, 100, 6])
    got = count_before(inc_keys, inc_time, inc_signal, q_keys, q_time, 2)
    np.testing.assert_array_equal(got, [[0, 0], [1, 1], [2, 1], [0, 0], [0, 0], [1, 0]])


def test_count_before_with_two_key_columns():
    inc = [np.array([1, 1, 2]), np.array([5, 6, 5])]  # (surface, item)
    got = count_before(inc, np.array([1, 1, 1]), np.zeros(3, np.int64), [np.array([1, 2, 1]), np.array([5, 5, 7])],
                       np.array([2, 2, 2]), 1)
    np.testing.assert_array_equal(got[:, 0], [1, 1, 0])


def test_a_label_that_arrives_after_the_example_is_not_counted():
    """An impression at t0 clicked (known at t0 + 2h) and converted (known at t0 + 5h):
    queries at t0, t0 + 1h, t0 + 3h, t0 + 6h, t0 + 2 days and t0 + 40 days."""
    t0 = 100 * DAY
    rows = {"event_time": np.array([t0]), "click": np.array([1]), "click_known": np.array([t0 + 2 * 3_600_000_000]),
            "conversion": np.array([1]), "conversion_time": np.array([t0 + 5 * 3_600_000_000])}
    q = np.array([t0, t0 + 3_600_000_000, t0 + 3 * 3_600_000_000, t0 + 6 * 3_600_000_000, t0 + 2 * DAY,
                  t0 + 40 * DAY])
    out = counts_for_kind("item", rows, [np.array([3])], [np.full(len(q), 3)], q)
    np.testing.assert_array_equal(out[count_column("item", "all", "impressions")], [0, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(out[count_column("item", "all", "clicks")], [0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(out[count_column("item", "all", "conversions")], [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(out[count_column("item", "1d", "impressions")], [0, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(out[count_column("item", "30d", "impressions")], [0, 1, 1, 1, 1, 0])


# ---- a build's counts against a brute-force recount ----

@pytest.fixture(scope="module")
def tied_dataset(tmp_path_factory):
    """Simulator events with delayed clicks and conversions, example-only rows, and every
    event time floored to the 10 minutes: many rows of one item, advertiser or user share
    an instant with an example."""
    from gem.data.simulate import SimulatorConfig, simulate

    base = tmp_path_factory.mktemp("counters") / "sim"
    simulate(SimulatorConfig(users=150, items=120, days=4, topics=6, advertisers=12, seed=7, click_bias=-1.5,
                             conversion_bias=0.5, click_delay_hours=3.0, conversion_delay_hours=6.0, workers=1),
             base, progress=False)
    out = base.parent / "tied"

    def change(frame: pd.DataFrame) -> pd.DataFrame:
        step = pd.Timedelta(minutes=10)
        floored = frame["event_time"].dt.floor(step)
        ids = frame["event_id"].to_numpy()
        role = np.where(frame["is_ad"] & (ids % 6 == 0), "example", None)
        return frame.assign(event_time=floored, role=role)

    rewrite_events(base, out, change)
    return out


@pytest.fixture(scope="module")
def tied_features(tied_dataset, tmp_path_factory) -> Path:
    from gem.features.build import build_features

    out = tmp_path_factory.mktemp("counters-out") / "f"
    build_features(tied_dataset, out, tiny_cfg(max_seq_len=16, counters=True))
    return out


def stored_counts(features_dir: Path) -> pd.DataFrame:
    frames = []
    for shard in sorted((features_dir / "shards").iterdir()):
        ex = read_examples(shard, read_segment(shard))
        frames.append(pd.DataFrame({"example_id": ex["example_id"], **{c: ex[c] for c in COUNT_COLUMNS}}))
    return pd.concat(frames).set_index("example_id")


def brute_counts(events: pd.DataFrame, items: pd.DataFrame, example: pd.Series) -> dict[str, int]:
    """Every count column of one example, by scanning the labelled rows."""
    ads = events[events["is_ad"]].merge(items, on="item_id", how="left")
    t = int(example["event_time"])
    attrs = items.set_index("item_id").loc[int(example["item_id"])]
    same = {"item": ads["item_id"] == example["item_id"],
            "advertiser": ads["advertiser_id"] == attrs["advertiser_id"],
            "category": ads["category_id"] == attrs["category_id"],
            "surface_item": (ads["item_id"] == example["item_id"]) & (ads["surface"] == example["surface"]),
            "user": ads["user_id"] == example["user_id"], GLOBAL: np.ones(len(ads), bool)}
    known = {"impressions": (ads["event_time"], np.ones(len(ads), bool)),
             "clicks": (ads["click_time"], ads["click"] == 1),
             "conversions": (ads["conversion_time"], (ads["conversion"] == 1) & (ads["conversion_time"] >= 0))}
    out = {}
    for kind, key in same.items():
        for h in HORIZONS:
            lo = -np.inf if HORIZONS[h] is None else t - HORIZONS[h]
            for signal, (when, has) in known.items():
                hit = key & has & (when < t) & (when >= lo)
                out[count_column(kind, h, signal)] = int(hit.sum())
    return out


def test_counts_equal_a_brute_force_recount(tied_dataset, tied_features):
    events = raw_events(tied_dataset)
    items = pq.read_table(tied_dataset / "items.parquet").to_pandas()[["item_id", "advertiser_id", "category_id"]]
    stored = stored_counts(tied_features)
    by_id = events.set_index("event_id")
    rng = np.random.default_rng(0)
    sample = rng.choice(stored.index.to_numpy(), size=150, replace=False)
    exercised = {"same_instant": 0, "pending_click": 0, "pending_conversion": 0, "hidden": 0}
    ads = events[events["is_ad"]]
    for eid in sample:
        ex = by_id.loc[int(eid)]
        want = brute_counts(events, items, ex)
        have = stored.loc[int(eid)]
        for column, value in want.items():
            assert have[column] == value, (eid, column, have[column], value)
        t = int(ex["event_time"])
        item_rows = ads[ads["item_id"] == ex["item_id"]]
        exercised["same_instant"] += int(((item_rows["event_time"] == t) & (item_rows.index != eid)).sum())
        exercised["pending_click"] += int(((item_rows["click"] == 1) & (item_rows["event_time"] < t)
                                           & (item_rows["click_time"] >= t)).sum())
        exercised["pending_conversion"] += int(((item_rows["conversion"] == 1) & (item_rows["event_time"] < t)
                                                & (item_rows["conversion_time"] >= t)).sum())
        exercised["hidden"] += int(((item_rows["role"] == "example") & (item_rows["event_time"] < t)).sum())
    # the sample met every rule: ties at the example's instant, labels still pending, example-only rows
    assert all(v > 0 for v in exercised.values()), exercised
    assert (stored[count_column("item", "all", "clicks")] > 0).mean() > 0.3


def test_counters_reach_the_models_as_dense_features(tied_features):
    loader = FeatureLoader(tied_features, batch_size=512, shuffle=False)
    assert loader.spec.dense[-len(COUNTER_FEATURES):] == list(COUNTER_FEATURES)
    got = collect(loader)
    stored = stored_counts(tied_features).loc[got.ids]
    dense = got.dense[:, len(loader.spec.dense) - len(COUNTER_FEATURES):]
    col = list(COUNTER_FEATURES)
    g_imp, g_clk = (stored[count_column(GLOBAL, "all", s)].to_numpy() for s in SIGNALS[:2])
    seen, imp1 = (stored[count_column("item", h, "impressions")].to_numpy().astype(float) for h in ("all", "1d"))
    share = seen / np.maximum(g_imp, 1)
    np.testing.assert_allclose(dense[:, col.index("cnt_item_all_share")], np.log1p(1e6 * share), rtol=1e-5)
    traffic = stored[count_column(GLOBAL, "1d", "impressions")].to_numpy()
    recent = (imp1 + 1000 * share) / (traffic + 1000)
    trend = np.where(seen > 0, np.clip(np.log(np.maximum(recent, 1e-12) / np.maximum(share, 1e-12)), -3, 3), 0)
    np.testing.assert_allclose(dense[:, col.index("cnt_item_1d_trend")], trend, rtol=1e-4, atol=1e-5)
    assert (trend != 0).mean() > 0.5
    imp, clk = (stored[count_column("user", "7d", s)].to_numpy() for s in SIGNALS[:2])
    prior = (g_clk + 1.0) / (g_imp + 2.0)
    rate = (clk + 10 * prior) / (imp + 10)
    lift = np.log(rate / (1 - rate)) - np.log(prior / (1 - prior))
    np.testing.assert_allclose(dense[:, col.index("cnt_user_7d_ctr_lift")], lift, rtol=1e-4, atol=1e-5)
    assert np.isfinite(dense).all() and len(KINDS) * len(HORIZONS) * 3 + 2 == dense.shape[1]


def test_a_shard_computes_its_example_inputs_once_as_each_batch_would(tied_features, monkeypatch):
    """The loader computes each shard's per-example inputs (counter features, dense
    features, ids, labels) once and takes each batch's rows: bit for bit what computing
    them from the batch's own examples gives, in any batch order."""
    from gem.features import loader as loader_module

    made, checked = [], []
    compute, gather = loader_module._example_inputs, loader_module.gather

    def counted(spec, shard):
        made.append(len(shard.examples["rank_end"]))
        return compute(spec, shard)

    def checked_gather(spec, shard, idx):
        got = gather(spec, shard, idx)
        alone = loader_module.ShardData({k: v[idx] for k, v in shard.examples.items()}, shard.history)
        for name, want in compute(spec, alone).items():
            assert got[name].dtype == want.dtype and np.array_equal(got[name], want), name
        checked.append(len(idx))
        return got

    monkeypatch.setattr(loader_module, "_example_inputs", counted)
    monkeypatch.setattr(loader_module, "gather", checked_gather)
    loader = FeatureLoader(tied_features, batch_size=37, shuffle=True, seed=3)
    loader.set_epoch(1)
    batches = list(loader)
    assert len(made) <= len(loader.shard_names) < len(batches)  # once per shard, not per batch
    assert sum(checked) == sum(b.batch_size for b in batches) and batches[0].dense.shape[1] > 10


def test_a_build_without_counters_keeps_the_old_dense_features(conv_features):
    spec = FeatureLoader(conv_features, batch_size=8).spec
    assert not any(name.startswith("cnt_") for name in spec.dense) and len(spec.dense) == 6


def test_feast_serves_each_entitys_latest_counts(tied_dataset, tmp_path):
    """The online store, materialized at the window end, serves every kind's counts as an
    example at that instant would read them (a brute-force recount at the same time)."""
    from gem.data.contract import Manifest
    from gem.features.feast_repo import DEFAULT_REPO, apply, copy_repo, materialize
    from gem.features.feast_sources import export

    end = Manifest.read(tied_dataset).end
    repo = copy_repo(DEFAULT_REPO, tmp_path / "repo")
    export(tied_dataset, repo, recent_k=4, parts=("users", "items", "counters"))
    apply(repo, definitions_repo=DEFAULT_REPO)
    store = materialize(repo, end=end)
    events = raw_events(tied_dataset)
    items = pq.read_table(tied_dataset / "items.parquet").to_pandas()[["item_id", "advertiser_id", "category_id"]]
    ads = events[events["is_ad"]]
    at = pd.Series({"event_time": int(end.timestamp() * 1_000_000)})
    rows = ads.sample(12, random_state=1)
    for _, row in rows.iterrows():
        want = brute_counts(events, items, pd.concat([at, row[["item_id", "user_id", "surface"]]]))
        attrs = items.set_index("item_id").loc[int(row["item_id"])]
        keys = {"item": {"item_id": int(row["item_id"])}, "user": {"user_id": int(row["user_id"])},
                "advertiser": {"advertiser_id": int(attrs["advertiser_id"])},
                "category": {"category_id": int(attrs["category_id"])},
                "surface_item": {"surface": row["surface"], "item_id": int(row["item_id"])}}
        for kind, entity in keys.items():
            names = [count_column(kind, h, s) for h in HORIZONS for s in SIGNALS]
            names += [count_column(GLOBAL, h, s) for h in HORIZONS for s in SIGNALS]
            got = store.get_online_features(features=[f"{kind}_counters:{n}" for n in names],
                                            entity_rows=[entity]).to_dict()
            for name in names:
                assert got[name][0] == want[name], (kind, entity, name, got[name][0], want[name])
    assert want[count_column("item", "all", "clicks")] >= 0 and want[count_column(GLOBAL, "all", "clicks")] > 0


def test_a_bucket_period_without_examples_still_builds(tied_dataset, tmp_path):
    """More user buckets than the fixture fills: a shard without examples reads no counts
    and still has every count column, so every shard has one schema."""
    from gem.features.build import build_features

    out = tmp_path / "sparse"
    build_features(tied_dataset, out, tiny_cfg(max_seq_len=8, counters=True, num_buckets=256))
    empty = [d for d in sorted((out / "shards").iterdir())
             if pq.read_metadata(d / "examples.parquet").num_rows == 0]
    assert empty, "no shard without examples: the case is not exercised"
    for shard in empty[:3] + sorted((out / "shards").iterdir())[:3]:
        assert set(COUNT_COLUMNS) <= set(pq.read_schema(shard / "examples.parquet").names)
    assert FeatureLoader(out, batch_size=64).num_examples > 0


def test_counter_features_follow_their_definitions_column_by_column():
    """Every named feature against its definition, computed one row at a time in plain
    Python (the vectorized function fills a float32 table column by column)."""
    import math

    from gem.features import counters as c

    rng = np.random.default_rng(3)
    counts = {col: rng.integers(0, 50, size=6) for col in c.COUNT_COLUMNS}
    for col in c.COUNT_COLUMNS:  # the log's counts exceed any key's; one row before its first conversion
        if col.startswith("n_global_"):
            counts[col] = counts[col] + 500
    counts[c.count_column(c.GLOBAL, "all", "conversions")][0] = 0

    def logit(p):
        p = min(max(p, 1e-6), 1 - 1e-6)
        return math.log(p) - math.log1p(-p)

    def expected(row, name):
        n = {col: float(v[row]) for col, v in counts.items()}
        g_imp, g_clk, g_conv = (n[c.count_column(c.GLOBAL, "all", s)] for s in c.SIGNALS)
        ctr0, cvr0 = (g_clk + 1) / (g_imp + 2), (g_conv + 1) / (g_clk + 2)
        if name == "cnt_global_all_ctr_logit":
            return logit(ctr0)
        if name == "cnt_global_all_cvr_logit":
            return logit(cvr0) if g_conv > 0 else 0.0
        kind, h, stat = next((k, h, name[len(f"cnt_{k}_{h}_"):]) for k in c.KINDS for h in c.HORIZONS
                             if name.startswith(f"cnt_{k}_{h}_"))
        imp, clk, conv = (n[c.count_column(kind, h, s)] for s in c.SIGNALS)
        share = n[c.count_column(kind, "all", "impressions")] / max(g_imp, 1)
        if stat == "share":
            return math.log1p(1e6 * share)
        if stat == "trend":
            if share == 0:
                return 0.0
            traffic = n[c.count_column(c.GLOBAL, h, "impressions")]
            recent = (imp + c.TREND_PRIOR_TRAFFIC * share) / (traffic + c.TREND_PRIOR_TRAFFIC)
            return min(max(math.log(max(recent, 1e-12) / max(share, 1e-12)), -c.TREND_CLIP), c.TREND_CLIP)
        if stat == "ctr_lift":
            return logit((clk + c.CTR_PRIOR_WEIGHT * ctr0) / (imp + c.CTR_PRIOR_WEIGHT)) - logit(ctr0)
        return logit((conv + c.CVR_PRIOR_WEIGHT * cvr0) / (clk + c.CVR_PRIOR_WEIGHT)) - logit(cvr0) if g_conv else 0.0

    for kinds in (c.KINDS, ("user",), ("item", "advertiser")):
        names = c.counter_names(kinds)
        table = c.counter_features(counts, kinds)
        assert table.dtype == np.float32 and table.shape == (6, len(names))
        for j, name in enumerate(names):
            want = np.array([expected(row, name) for row in range(6)], dtype=np.float32)
            np.testing.assert_allclose(table[:, j], want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert table[0, names.index("cnt_global_all_cvr_logit")] == 0.0
