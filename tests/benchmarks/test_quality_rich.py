"""The peers' protocol with label-aware histories, the sequence-native peers and the
scaling curves (benchmarks/quality: store, baselines, sequence_peers, scaling), on a
tiny simulated dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks.quality import baselines


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    from benchmarks.quality import peers
    from gem.data.simulate import SimulatorConfig, simulate

    root = tmp_path_factory.mktemp("rich")
    simulate(SimulatorConfig(users=600, items=200, days=4, seed=1, workers=1), root / "sim", progress=False)
    features, skipped = peers.prepare(str(root / "sim"), root / "work" / "sim", max_seq_len=16, shared=root,
                                      history="labels")
    assert skipped == "" and features.name == "features-labels-L16"
    store = peers.ExampleStore.from_features(features)
    parts, _ = peers.split_parts(store, quantiles=(0.8, 0.9))
    rows = {p: np.flatnonzero(parts == p) for p in ("train", "validation", "test")}
    return root, store, rows


def test_every_model_reads_the_labels_of_the_history(rich):
    _, store, _ = rich
    assert store.spec.history_labels
    ex = store.examples(16)
    action = store.sequence[list(store.spec.sequence).index("seq_action")]
    assert action.max() >= 1  # the history shows earlier clicks
    row = int(np.flatnonzero(store.lengths > 3)[0])  # the most recent events, as the item history
    lo, hi = store.offsets[row], store.offsets[row + 1]
    keep = min(16, hi - lo)
    assert (ex.history_action[row, :keep] == action[hi - keep:hi] + 1).all()
    assert (ex.history_action[row, keep:] == 0).all() and (ex.history_action > 0).sum() == ex.history_len.sum()
    facts, names = store.label_facts()
    assert facts.shape == (len(store), len(names)) and np.isfinite(facts).all()
    clicks = np.array([(action[a:b] > 0).sum() for a, b in zip(store.offsets[:-1], store.offsets[1:])])
    assert np.allclose(np.expm1(facts[:, 2]) + np.expm1(facts[:, 3]), clicks, atol=1e-3)
    assert ((0 < facts[:, 0]) & (facts[:, 0] < 1)).all()  # the prior click rate


def test_fuxictr_models_take_the_label_as_a_side_feature_of_each_item(rich, tmp_path):
    _, store, _ = rich
    ex = store.examples(16)
    fmap = baselines.fuxictr_feature_map(ex, tmp_path, max_len=16)
    assert baselines.ACTION in fmap.features
    (tmp_path / fmap.dataset_id).mkdir()
    model = baselines.make_din(fmap, tmp_path, seed=0)
    with torch.no_grad():  # a random init would map every action to ~0: make the label tables count
        for name, p in model.named_parameters():
            if "seq_action" in name:
                p.normal_(0, 1.0)
    model.eval()
    rows = np.flatnonzero(ex.history_len > 2)[:64]
    batch = next(baselines.fuxictr_batches(ex, 64, shuffle=False, order=rows))
    flipped = dict(batch)
    flipped[baselines.ACTION] = torch.where(batch[baselines.ACTION] > 0, 4 - batch[baselines.ACTION],
                                            batch[baselines.ACTION])  # no click <-> conversion
    with torch.no_grad():
        assert not torch.allclose(model(batch)["y_pred"], model(flipped)["y_pred"])


def test_lr_ids_reads_the_same_facts_as_numeric_columns():
    rng = np.random.default_rng(0)
    n = 600
    signal = rng.normal(size=n)
    labels = (signal > 0).astype(np.float32)[:, None]
    ex = baselines.Examples(sparse=np.zeros((n, 2), np.int64), sparse_names=["user_id", "item_id"],
                            cardinality={"user_id": 1, "item_id": 1}, history=np.zeros((n, 1), np.int64),
                            history_len=np.zeros(n, np.int64), dense=np.zeros((n, 0), np.float32), dense_names=[],
                            labels=labels, tasks=["click"], numeric=signal[:, None])
    from benchmarks.quality.store import take

    train, test = take(ex, np.arange(400)), take(ex, np.arange(400, n))
    assert baselines.auc(test.labels[:, 0], baselines.lr_ids(train, test)) > 0.99


@pytest.mark.slow(minutes=0.5)
def test_sequence_peers_append_the_target_and_learn(rich):
    from benchmarks.quality.runs import GridPoint, RunSettings
    from benchmarks.quality.sequence_peers import SequenceBatch, SequenceRun

    _, store, rows = rich
    some = rows["train"][:50]
    batch = SequenceBatch(store, some)
    lengths = store.lengths[some] + 1
    assert (torch.diff(batch.offsets).numpy() == lengths).all()
    item_col = list(store.spec.sparse).index("item_id")
    assert (batch.item[batch.target_at] == batch.sparse[:, item_col]).all()
    assert (batch.label[batch.target_at] == 0).all() and (batch.age[batch.target_at] == 0).all()
    history = torch.ones(len(batch.item), dtype=torch.bool)
    history[batch.target_at] = False
    assert (batch.label[history] >= 1).all() and (batch.age[history] >= 1).all()
    labels = store.labels[:, 0]
    for kind in ("bst", "hstu"):
        train, val = rows["train"][-400:], rows["validation"][:200]
        run = SequenceRun(kind, store, GridPoint(lr_scale=10.0), 0, RunSettings(max_epochs=3, batch_size=32), 13)
        before = run.predict(val, 256)
        loss = [run.train_epoch(train, 32) for _ in range(3)][-1]
        after = run.predict(val, 256)
        assert np.isfinite(loss) and ((after > 0) & (after < 1)).all() and not np.allclose(before, after)
        rate = labels[train].mean()  # it learns: its mean prediction moves to the click rate
        assert abs(after.mean() - rate) < 0.5 * abs(before.mean() - rate), kind
        # the history is read: the same examples without their histories score otherwise
        with_history = val[store.lengths[val] > 0][:32]
        run.store = store.without_history()
        assert np.abs(run.predict(with_history, 32) - after[np.isin(val, with_history)]).max() > 1e-4


def test_newest_keeps_the_latest_share_of_the_train_window():
    from benchmarks.quality.peers import newest

    time_us = np.array([5, 1, 9, 3, 7, 7])
    train = np.array([0, 1, 2, 3, 4, 5])
    assert newest(train, time_us, 0.5).tolist() == [2, 4, 5]
    assert newest(train, time_us, 1.0).tolist() == train.tolist()
    with pytest.raises(ValueError):
        newest(train, time_us, 0.0)


def _result(point: str, rows: int, preds: dict, labels, users) -> dict:
    return {"unit": {"part": "data", "point": point}, "labels": labels, "users": users,
            "sizes": {"train_examples_used": rows}, "predictions": preds,
            "figs": {m: {"selected": {"point": {"lr_scale": 1.0}}} for m in preds}}


def test_scaling_curve_measures_slopes_and_the_gap_to_the_simple_baselines():
    from benchmarks.quality.scaling import curve, slope

    assert np.allclose(slope(np.array([0.0, 1.0, 2.0]), np.array([[1.0, 2.0, 3.0], [3.0, 3.0, 3.0]])), [1.0, 0.0])
    rng = np.random.default_rng(0)
    n = 4000
    labels = (rng.random(n) < 0.5).astype(float)
    users = rng.integers(0, 300, n)
    noise = rng.normal(size=n)
    results = []
    for i, rows in enumerate((1000, 2000, 4000, 8000)):
        strength = 0.3 * (i + 1)  # "gem" sharpens with every doubling, "dlrm_baseline" half as fast
        preds = {"gem": [labels * strength + noise], "dlrm_baseline": [labels * (0.3 + 0.15 * i) + noise],
                 "lr_ids": [labels * 0.6 + noise], "bst": [labels * 0.75 + noise]}  # a peer GEM overtakes
        results.append(_result(f"{rows / 8000:g}", rows, preds, labels, users))
    out = curve(results, replicates=200)
    lead = out["gem_minus_best_peer"]  # DLRM is GEM's ablation, not a peer
    assert [g["best_peer"] for g in lead] == ["bst"] * 4 and set(out["gem_minus"]) == {"dlrm_baseline", "bst"}
    assert lead[0]["hi"] < 0 < lead[-1]["lo"] and out["gem_lead_does_not_shrink"]
    assert not out["gem_above_every_peer_everywhere"]
    gem, dlrm = out["models"]["gem"], out["models"]["dlrm_baseline"]
    assert out["train_rows"] == [1000, 2000, 4000, 8000]
    assert gem["slope_per_doubling"] > dlrm["slope_per_doubling"] > 0 and gem["slope_ci95"][0] > 0
    assert abs(out["models"]["lr_ids"]["slope_per_doubling"]) < 1e-9
    ratio = out["gem_slope_over_dlrm"]
    assert ratio["defined"] and 1.5 < ratio["mean"] < 3.0 and ratio["lo"] <= ratio["mean"] <= ratio["hi"]
    gaps = out["gem_minus_best_simple"]
    assert gaps[0]["mean"] < 0 < gaps[-1]["mean"] and out["gem_minus_best_simple_grows"]
    assert all(g["best_simple"] == "lr_ids" for g in gaps)


def test_size_curve_pairs_every_size_with_the_smallest():
    from benchmarks.quality.scaling import sizes_curve

    rng = np.random.default_rng(1)
    n = 4000
    labels = (rng.random(n) < 0.5).astype(float)
    users = rng.integers(0, 300, n)
    results = []
    for size, strength in (("tiny", 0.5), ("medium", 0.8), ("wide", 0.5)):
        preds = {"gem": [labels * strength + rng.normal(size=n) for _ in range(2)]}
        r = _result("1", 8000, preds, labels, users)
        r["unit"]["point"] = size
        r["figs"] = {"gem": {"auc": 0.7, "auc_ci95": [0.6, 0.8], "auc_by_seed": [0.7, 0.7], "examples_per_s": 1.0}}
        results.append(r)
    out = sizes_curve(results, replicates=200)
    assert "auc_minus_tiny" not in out["tiny"]
    assert out["medium"]["auc_minus_tiny"]["lo"] > 0 and out["medium"]["auc_minus_tiny"]["excludes_zero"]
    assert out["wide"]["auc_minus_tiny"]["lo"] < 0 < out["wide"]["auc_minus_tiny"]["hi"]


@pytest.mark.slow(minutes=0.5)
def test_scaling_run_writes_the_curve_the_rich_protocol_and_a_plot(rich, tmp_path):
    from benchmarks.quality import scaling

    root, _, _ = rich
    out = scaling.main(["--parts", "data", "--fractions", "0.5,1", "--dataset", str(root / "sim"), "--jobs", "1",
                        "--work-dir", str(root / "work"), "--results-dir", str(tmp_path), "--plot",
                        str(tmp_path / "scaling.png"), "--replicates", "50", "--models", "gem,dlrm_baseline,lr_ids",
                        "--seeds", "1", "--max-epochs", "1", "--grid-lr-scale", "1", "--max-seq-len", "16",
                        "--batch-size", "128"])
    saved = json.loads((tmp_path / "quality.json").read_text())
    assert saved["scaling"]["data"]["train_rows"] == out["data"]["train_rows"]
    assert out["data"]["train_rows"][0] < out["data"]["train_rows"][1]
    assert set(out["data"]["models"]) == {"gem", "dlrm_baseline", "lr_ids"}
    rich_figs = saved["peers_protocol_rich"]["datasets"]["sim"]
    assert rich_figs["gem"]["auc"] == pytest.approx(out["data"]["models"]["gem"]["auc"][-1])
    assert "label-aware" in saved["peers_protocol_rich"]["protocol"]["history"]
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_counters_reach_every_model_and_the_simple_baselines(rich):
    """--counters on: the build's counters are dense features of every row; item_ctr is
    the item's click rate so far from those same features (what it chooses on
    validation: its horizon); lr_ids reads them as extra columns beside its one-hot ids."""
    from benchmarks.quality import peers
    from gem.features.counters import COUNTER_FEATURES

    root, _, _ = rich
    features, _ = peers.prepare(str(root / "sim"), root / "work" / "sim", max_seq_len=16, shared=root,
                                history="blind", counters=True)
    assert features.name == "features-counters-L16"
    store = peers.ExampleStore.from_features(features)
    assert [n for n in store.spec.dense if n.startswith("cnt_")] == list(COUNTER_FEATURES)
    parts, _ = peers.split_parts(store, quantiles=(0.8, 0.9))
    rows = {p: np.flatnonzero(parts == p) for p in ("train", "validation", "test")}
    labels = store.labels[:, 0]
    out = peers._run_shallow("item_ctr", store, rows, labels)
    horizon = out["selected"]["point"]["horizon"]
    dense = list(store.spec.dense)
    logit = store.dense[rows["test"], dense.index(f"cnt_item_{horizon}_ctr_lift")] + \
        store.dense[rows["test"], dense.index("cnt_global_all_ctr_logit")]
    np.testing.assert_allclose(out["seeds"][0]["test_pred"], 1 / (1 + np.exp(-logit)), rtol=1e-6)
    assert set(out["selected"]["grid_val_auc"]) == {f"horizon={h}" for h in ("1d", "7d", "30d", "all")}
    assert "so far" in out["seeds"][0]["config"]
    lr = peers._run_shallow("lr_ids", store, rows, labels)
    assert baselines.auc(labels[rows["test"]], lr["seeds"][0]["test_pred"]) > 0.5


def test_rare_ids_map_to_unknown_with_a_minimum_train_count(rich):
    """Ids in fewer train rows than the minimum become 0 in every row (an item met in a
    train history keeps its id: its embedding is trained there)."""
    _, store, rows = rich
    user = list(store.spec.sparse).index("user_id")
    once, shares_1 = store.known_only(rows["train"], 1)
    often, shares_5 = store.known_only(rows["train"], 5)
    counts = np.bincount(store.sparse[rows["train"], user], minlength=store.spec.sparse["user_id"])
    kept = often.sparse[:, user]
    assert (counts[kept[kept > 0]] >= 5).all()  # every user left known has 5 train rows or more
    rare = (counts[store.sparse[:, user]] < 5) & (counts[store.sparse[:, user]] > 0)
    assert rare.any() and (kept[rare] == 0).all() and (once.sparse[rare, user] > 0).all()
    assert shares_5["user_id"] > shares_1["user_id"]


def test_length_curve_pairs_gains_over_the_same_test_rows():
    from benchmarks.quality.lengths import length_curve

    rng = np.random.default_rng(2)
    n = 4000
    labels = (rng.random(n) < 0.5).astype(float)
    users = rng.integers(0, 300, n)
    noise = rng.normal(size=n)
    results = []
    for length, (gem, bst) in {16: (0.4, 0.4), 64: (0.5, 0.5), 256: (0.9, 0.55)}.items():
        preds = {"gem": [labels * gem + noise], "bst": [labels * bst + noise]}
        figs = {m: {"auc": baselines.auc(labels, p[0]), "examples_per_s": 100.0 / length,
                    "flops_per_example": 1e4 * length} for m, p in preds.items()}
        results.append({"unit": {"point": str(length)}, "labels": labels, "users": users, "predictions": preds,
                        "figs": figs, "sizes": {"history_len_mean": {"test": min(length, 50)}}})
    out = length_curve(results[::-1], replicates=200)  # any order in, sorted by length out
    assert out["lengths"] == [16, 64, 256]
    gem = out["models"]["gem"]
    assert gem["flops_per_example"] == [1.6e5, 6.4e5, 2.56e6] and len(gem["gain"]) == 2
    assert gem["gain"][1]["from"] == 64 and gem["gain"][1]["lo"] > 0  # 64 -> 256 helps GEM, clearly
    assert out["gem_gain_64_256_minus"]["bst"]["lo"] > 0 and out["gem_gains_at_least_best_peer"]
    assert out["best_peer_gain_64_256"]["model"] == "bst"


def test_slope_ablations_pair_every_variant_with_the_reference():
    from benchmarks.quality.slope import VARIANTS, summarize, variant_units

    units = variant_units("movielens1m", ["reference", "counters"], [0.125, 1.0])
    assert [u.point for u in units][:2] == ["reference@1", "counters@1"]
    assert "--counters" in next(u for u in units if u.point == "counters@0.125").argv
    rng = np.random.default_rng(3)
    n = 3000
    labels = (rng.random(n) < 0.5).astype(float)
    users = rng.integers(0, 200, n)
    noise = rng.normal(size=n)
    done = []
    for variant, boost in (("reference", 0.0), ("counters", 0.6)):
        for i, (fraction, rows) in enumerate(((0.125, 1000), (1.0, 8000))):
            preds = {"gem": [labels * (0.4 + 0.3 * i + boost) + noise]}
            done.append({"unit": {"part": "ablation", "point": f"{variant}@{fraction:g}"}, "labels": labels,
                         "users": users, "predictions": preds,
                         "sizes": {"train_examples_used": rows} if fraction < 1 else {"train_examples": rows},
                         "figs": {"gem": {"val_auc_by_seed": [0.7 + i * 0.01 + boost / 10],
                                          "selected": {"point": {"lr_scale": 1.0}}}}})
    out = summarize(done, replicates=100)
    assert set(out) == {"reference", "counters"} and out["counters"]["what"] == VARIANTS["counters"][0]
    assert out["reference"]["train_rows"] == [1000, 8000]
    assert out["counters"]["val_auc"]["gem"] == pytest.approx([0.76, 0.77])
    diffs = out["counters"]["minus_reference"]["gem"]
    assert [d["fraction"] for d in diffs] == [0.125, 1.0] and all(d["lo"] > 0 for d in diffs)
    assert "minus_reference" not in out["reference"]
