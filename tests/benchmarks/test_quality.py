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
