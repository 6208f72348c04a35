"""The quality benchmark's reference models on a tiny simulator time split: they train,
score the held-out day better than chance, and the benchmark writes its nested JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks.quality import baselines
from benchmarks.quality import bench as qb

SIM = ["--sim-users", "1000", "--sim-items", "800", "--sim-days", "4"]


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("quality")
    # the benchmark's simulator size: smaller splits leave too few clicks to learn from
    assert qb.make_dataset("simulator", root / "data") == ""
    windows = qb.choose_split(root / "data", 0.1)
    train_dir, eval_dir = qb.build_split(root / "data", root, windows, max_seq_len=32)
    return windows, baselines.load_examples(train_dir), baselines.load_examples(eval_dir)


def test_split_holds_out_the_last_day(split):
    windows, train, test = split
    assert windows["eval_days"] == 1 and windows["train_days"] == 7
    assert windows["cut"].startswith("2026-01-08")
    assert len(train) > 3 * len(test) > 0
    # the eval build reuses the train vocabularies: every id fits the train tables
    assert test.cardinality == train.cardinality
    assert (test.sparse < np.array([train.cardinality[n] for n in train.sparse_names])).all()
    # histories: right-padded, lengths as the loader gave them, item ids in range
    pos = np.arange(train.history.shape[1])
    assert ((train.history != 0) <= (pos[None, :] < train.history_len[:, None])).all()
    assert train.history_len.max() <= 32 and train.history.max() < train.cardinality["item_id"]


def test_metrics():
    y = np.array([0, 0, 1, 1, 0, 1, 0, 0], dtype=np.float32)
    assert math.isclose(baselines.normalized_entropy(y, np.full(len(y), y.mean())), 1.0, rel_tol=1e-9)
    assert baselines.normalized_entropy(y, np.where(y > 0, 0.9, 0.1)) < 0.5
    assert baselines.auc(y, y * 0.5 + 0.2) == 1.0


def test_reference_models_beat_chance(split):
    _, train, test = split
    y = test.labels[:, 0]
    lr = baselines.score(y, baselines.lr_ids(train, test))
    ctr = baselines.score(y, baselines.item_ctr(train, test))
    assert lr["auc"] > 0.6 and ctr["auc"] > 0.56, (lr, ctr)
    assert lr["ne"] < 1.02 and ctr["ne"] < 1.02, (lr, ctr)
    for kind in ("din", "wukong"):
        res = baselines.train_fuxictr(kind, train, test, epochs=1, batch_size=256, max_len=32)
        assert res["pred"].shape == (len(test),) and np.isfinite(res["pred"]).all()
        assert res["train_examples_seen"] == len(train)
        figures = baselines.score(y, res["pred"])
        assert figures["auc"] > 0.57, (kind, figures)
        assert figures["ne"] < 1.05, (kind, figures)


def test_bench_writes_nested_json(tmp_path):
    qb.main(["--datasets", "simulator", "--models", "item_ctr,lr_ids",
             *SIM, "--results-dir", str(tmp_path)])
    result = json.loads((tmp_path / "quality.json").read_text())
    sim = result["simulator"]
    for model in ("item_ctr", "lr_ids"):
        assert 0.5 < sim[model]["auc"] <= 1.0 and 0 < sim[model]["ne"] < 1.05
        assert sim[model]["examples_per_s"] > 0 and "conversion_auc" in sim[model]
    assert sim["best_by_auc"] in ("item_ctr", "lr_ids")
    sizes = result["sizes"]["datasets"]["simulator"]
    assert sizes["train_examples"] > sizes["eval_examples"] > 0
    assert result["machine"]["cores"] >= 1


def test_missing_real_data_is_skipped_with_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(qb, "SHARED", tmp_path / "absent")
    assert "not found" in qb.make_dataset("movielens100k", tmp_path / "ml")
    assert "not found" in qb.make_dataset("taobao", tmp_path / "tb")


def test_surface_wins_needs_both_auc_and_ne_per_surface():
    gem = {"auc_feed": 0.70, "ne_feed": 0.90, "auc_video": 0.60, "ne_video": 0.99}
    dlrm = {"auc_feed": 0.65, "ne_feed": 0.95, "auc_video": 0.61, "ne_video": 0.98}
    wins = qb.surface_wins(gem, dlrm)
    assert {s: (w["auc"], w["ne"]) for s, w in wins.items()} == {"feed": (True, True), "video": (False, False)}
    assert wins["feed"]["auc_margin"] == pytest.approx(0.05) and wins["video"]["ne_margin"] == pytest.approx(0.01)
    assert qb.surface_wins({}, dlrm) == {}


def test_over_seeds_reports_means_spreads_and_each_seed():
    runs = {0: {"auc": 0.70, "ne": 0.92, "auc_feed": 0.6, "steps": 5, "config": "x"},
            1: {"auc": 0.72, "ne": 0.90, "auc_feed": 0.8, "steps": 5, "config": "x"}}
    out = qb.over_seeds(runs.__getitem__, 2)
    assert out["auc"] == pytest.approx(0.71) and out["ne"] == pytest.approx(0.91)
    assert out["auc_feed"] == pytest.approx(0.7) and out["auc_feed_std"] == pytest.approx(0.1414, abs=1e-4)
    assert out["auc_by_seed"] == [0.70, 0.72] and out["seeds"] == 2 and out["steps"] == 5 and out["config"] == "x"


# ---- the peers' protocol (benchmarks/quality/peers.py) on a tiny simulated dataset ----

@pytest.fixture(scope="module")
def peers_data(tmp_path_factory):
    from benchmarks.quality import peers
    from gem.data.simulate import SimulatorConfig, simulate

    root = tmp_path_factory.mktemp("peers")
    simulate(SimulatorConfig(users=800, items=300, days=4, seed=0, workers=1), root / "sim", progress=False)
    features, skipped = peers.prepare(str(root / "sim"), root / "work" / "sim", max_seq_len=16, shared=root)
    assert skipped == ""
    return root, peers.ExampleStore.from_features(features)


def test_peers_features_are_rebuilt_when_the_dataset_folder_changes(tmp_path):
    import shutil

    from benchmarks.quality import peers
    from gem.data.simulate import SimulatorConfig, simulate
    from gem.utils.digest import tree_digest

    def prepared(seed=None):
        if seed is not None:  # another world in the same folder
            shutil.rmtree(tmp_path / "sim", ignore_errors=True)
            simulate(SimulatorConfig(users=200, items=100, days=3, seed=seed, workers=1), tmp_path / "sim",
                     progress=False)
        features, _ = peers.prepare(str(tmp_path / "sim"), tmp_path / "work", max_seq_len=8, shared=tmp_path)
        return tree_digest(features), features.with_name(f".{features.name}.built.json").stat().st_mtime_ns

    first = prepared(seed=0)
    assert prepared() == first  # reused
    assert prepared(seed=1)[0] != first[0]


def _parts(store):
    from benchmarks.quality import peers

    parts, info = peers.split_parts(store, quantiles=(0.8, 0.9))
    return parts, info, {p: np.flatnonzero(parts == p) for p in ("train", "validation", "test")}


def test_peers_split_is_a_global_time_split_at_the_quantiles(peers_data):
    from benchmarks.quality import peers

    _, store = peers_data
    assert store.spec.history_labels is False  # label-blind histories
    parts, info, rows = _parts(store)
    t = store.time_us
    assert t[rows["train"]].max() < info["cuts_us"][0] <= t[rows["validation"]].min()
    assert t[rows["validation"]].max() < info["cuts_us"][1] <= t[rows["test"]].min()
    assert abs(len(rows["train"]) / len(store) - 0.8) < 0.02 and abs(len(rows["test"]) / len(store) - 0.1) < 0.02
    sizes = peers.check_split(store, parts, info)
    assert sizes["train_examples"] + sizes["validation_examples"] + sizes["test_examples"] == len(store)
    # the same split given explicitly: two cut points, or a file of example ids
    again, _ = peers.split_parts(store, cuts_iso=info["cuts"])
    assert (again == parts).all()
    import pandas as pd

    path = peers_data[0] / "split.csv"
    pd.DataFrame({"example_id": store.example_id, "part": parts}).to_csv(path, index=False)
    from_file, file_info = peers.split_parts(store, split_file=str(path))
    assert (from_file == parts).all() and file_info["kind"] == "file"
    with pytest.raises(ValueError, match="two time cut points"):
        peers.split_parts(store, cuts_iso=info["cuts"][:1])


def test_peers_split_check_catches_a_leak(peers_data):
    from benchmarks.quality import peers

    _, store = peers_data
    parts, info, rows = _parts(store)
    leaked = parts.copy()
    leaked[rows["test"][0]] = "train"  # a test example in train
    with pytest.raises(AssertionError, match="train reaches past cut 0"):
        peers.check_split(store, leaked, info)


def test_peers_ids_unseen_in_train_map_to_unknown(peers_data):
    _, store = peers_data
    _, _, rows = _parts(store)
    known, shares = store.known_only(rows["train"])
    col = list(store.spec.sparse).index("item_id")
    train_items = set(known.sparse[rows["train"], col].tolist())
    later = known.sparse[np.r_[rows["validation"], rows["test"]], col]
    seq = list(store.spec.sequence).index("seq_item_id")
    history_items = set(known.sequence[seq].tolist())
    from gem.features.jagged import ragged_arange

    in_train_hist = set(known.sequence[seq, ragged_arange(known.offsets[rows["train"]],
                                                          known.lengths[rows["train"]])].tolist())
    assert set(later.tolist()) <= train_items | in_train_hist | {0}
    assert history_items <= train_items | in_train_hist | {0}
    assert (known.sparse[rows["train"]] == store.sparse[rows["train"]]).all()  # train rows unchanged
    assert 0 <= shares["user_id"] < 1


class _Spy:
    """Stands in for a deep model: records the rows it trains on and predicts; grid
    point lr_scale=1 is perfect on validation and reversed on test, lr_scale=0.5 the
    opposite, so selection on the test part would pick the other point."""

    calls: list = []

    def __init__(self, labels, test_rows, point):
        self.labels, self.test_rows, self.good_on_val = labels, set(test_rows.tolist()), point.lr_scale == 1.0
        self.config = point.name()

    def train_epoch(self, order, batch_size):
        _Spy.calls.append(("train", order.copy()))
        return 0.5

    def flops_per_example(self, rows):
        return 0.0

    def predict(self, rows, batch_size):
        _Spy.calls.append(("predict", rows.copy()))
        y = self.labels[rows]
        on_test = rows[0] in self.test_rows
        return np.where(self.good_on_val != on_test, y * 0.8 + 0.1, 0.9 - y * 0.8)


def test_peers_training_reads_train_rows_and_selects_on_validation(peers_data, monkeypatch):
    from benchmarks.quality import peers

    _, store = peers_data
    _, _, rows = _parts(store)
    labels = store.labels[:, 0]
    monkeypatch.setattr(peers, "FuxiRun", lambda kind, ex, point, seed, settings, steps, root:
                        _Spy(labels, rows["test"], point))
    _Spy.calls = []
    settings = peers.RunSettings(max_epochs=2, batch_size=64)
    grid = [peers.GridPoint(lr_scale=0.5), peers.GridPoint(lr_scale=1.0)]
    res = peers.run_model("fuxictr_dnn", store, rows, seeds=2, grid=grid, settings=settings,
                          cache=peers.RunCache(None), data_key="t", log=lambda *_: None)
    assert res["selected"]["point"]["lr_scale"] == 1.0  # the validation's choice, not the test's
    for r in res["seeds"]:
        assert baselines.auc(labels[rows["test"]], r["test_pred"]) == 0.0  # what validation chose scores badly
    trained = np.concatenate([rows_ for kind, rows_ in _Spy.calls if kind == "train"])
    assert set(trained.tolist()) == set(rows["train"].tolist())  # every train row, nothing else
    predicted = [set(rows_.tolist()) for kind, rows_ in _Spy.calls if kind == "predict"]
    test_set, val_set = set(rows["test"].tolist()), set(rows["validation"].tolist())
    assert all(p == val_set or p == test_set for p in predicted)
    # 2 grid points + 1 more seed, test scored once per run (after its first, best epoch)
    assert sum(p == test_set for p in predicted) == 3 and sum(p == val_set for p in predicted) == 6


def test_peers_bench_writes_beside_todays_figures(peers_data, tmp_path):
    root, _ = peers_data
    (tmp_path / "quality.json").write_text(json.dumps({"simulator": {"gem": {"auc": 0.7}}}))
    result = qb.main(["--protocol", "peers", "--datasets", str(root / "sim"), "--models", "item_ctr,lr_ids,gem",
                      "--max-epochs", "1", "--grid-lr-scale", "1", "--seeds", "2", "--replicates", "50",
                      "--max-seq-len", "16", "--batch-size", "128", "--work-dir", str(root / "work"),
                      "--results-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "quality.json").read_text())
    assert saved["simulator"] == {"gem": {"auc": 0.7}}  # today's protocol untouched
    peers_out = saved["peers_protocol"]
    assert peers_out["machine"]["cores"] >= 1 and peers_out["protocol"]["name"] == "peers"
    figs = peers_out["datasets"]["sim"]
    assert figs == json.loads(json.dumps(result["datasets"]["sim"]))
    for model in ("item_ctr", "lr_ids", "gem"):
        f = figs[model]
        lo, hi = f["auc_ci95"]
        assert 0 <= lo <= hi <= 1 and np.isfinite(f["ne"]) and np.isfinite(f["logloss"])
    assert len(figs["gem"]["auc_by_seed"]) == 2 and figs["gem"]["auc_std"] >= 0
    d = figs["lr_ids"]["gem_minus"]["auc"]
    assert d["lo"] <= d["mean"] <= d["hi"]
    assert figs["verdict"]["best_peer"] in ("item_ctr", "lr_ids")
    sizes = peers_out["sizes"]["sim"]
    assert sizes["train_examples"] > sizes["test_examples"] > 0 and sizes["split"]["kind"] == "quantiles"


def test_peers_grid_lets_a_model_read_no_history(peers_data, monkeypatch):
    from benchmarks.quality import peers

    _, store = peers_data
    _, _, rows = _parts(store)
    labels = store.labels[:, 0]
    seen = {}

    def run(kind, ex, point, seed, settings, steps, root):
        seen[(point.history, seed)] = int(ex.history_len.sum())
        return _Spy(labels, rows["test"], point)

    monkeypatch.setattr(peers, "FuxiRun", run)
    _Spy.calls = []
    grid = [peers.GridPoint(lr_scale=1.0, history=h) for h in (True, False)]
    res = peers.run_model("fuxictr_dnn", store, rows, seeds=2, grid=grid,
                          settings=peers.RunSettings(max_epochs=1, batch_size=64), cache=peers.RunCache(None),
                          data_key="t", log=lambda *_: None)
    assert seen[(True, 0)] > 0 and seen[(False, 0)] == 0  # the off point reads empty histories
    assert res["selected"]["point"]["history"] in (True, False)
    assert seen[(res["selected"]["point"]["history"], 1)] == seen[(res["selected"]["point"]["history"], 0)]
    assert peers.GridPoint(lr_scale=1.0).key() == {"lr_scale": 1.0, "weight_decay": 0.0}  # old cache keys hold
    assert peers.GridPoint(history=False).name().endswith("_nohist")


def test_diagnostics_rerun_the_protocol_with_one_change_and_keep_the_command(peers_data, tmp_path):
    from benchmarks.quality import diagnose

    root, _ = peers_data
    out = diagnose.main(["--only", "no_history", "--datasets", str(root / "sim"), "--seeds", "2", "--jobs", "1",
                         "--work-dir", str(root / "work"), "--results-dir", str(tmp_path), "--max-epochs", "1",
                         "--max-seq-len", "16", "--batch-size", "128", "--replicates", "50"])
    entry = json.loads((tmp_path / "quality.json").read_text())[diagnose.KEY]["no_history"]
    assert entry == json.loads(json.dumps(out["no_history"]))
    assert "--no-history" in entry["command"] and "--grid-history on" in entry["command"]
    gem = entry["datasets"]["sim"]["gem"]
    assert len(gem["auc_by_seed"]) == 2 and 0 <= gem["auc_ci95"][0] <= gem["auc"] <= gem["auc_ci95"][1] <= 1
    assert 0 <= gem["val_auc"] <= 1 and "gem_minus_auc" in entry["datasets"]["sim"]["lr_ids"]
    # a variant run elsewhere is taken from its results, with its own protocol record
    source = tmp_path / "earlier"
    source.mkdir()
    (source / "quality.json").write_text(json.dumps({"peers_protocol": {
        "written_at": "2026-12-02T07:00:00Z", "protocol": {"models": ["gem"]},
        "datasets": {"sim": {"gem": {"auc": 0.6, "auc_ci95": [0.5, 0.7], "auc_by_seed": [0.6], "ne": 0.9,
                                     "val_auc_by_seed": [0.65]}}}}}))
    diagnose.main(["--only", "reference", "--from", f"reference={source}", "--results-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "quality.json").read_text())[diagnose.KEY]
    assert set(saved) == {"no_history", "reference"} and saved["reference"]["collected_from"] == str(source)
    assert saved["reference"]["datasets"]["sim"]["gem"]["val_auc"] == 0.65
