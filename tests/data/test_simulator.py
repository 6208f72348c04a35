"""The simulator: deterministic, contract-valid, learnable from history, per-surface,
long-tailed, drifting, with rare delayed conversions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from sklearn.metrics import roc_auc_score

from gem.data.simulate import SimulatorConfig, simulate
from gem.data.validate import validate_dataset

CFG = dict(users=1500, items=1500, days=8, topics=12, advertisers=60, seed=3, users_per_chunk=600)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    out = tmp_path_factory.mktemp("sim") / "ds"
    simulate(SimulatorConfig(**CFG), out, progress=False)
    events = ds.dataset(out / "events", partitioning="hive").to_table().to_pandas()
    items = pd.read_parquet(out / "items.parquet")
    events = events.merge(items[["item_id", "category_id"]], on="item_id")
    events["day"] = (events.event_time - events.event_time.min().floor("D")).dt.days
    return out, events


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*.parquet") if "_validation" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_deterministic_for_a_seed_and_independent_of_workers(tmp_path):
    small = dict(CFG, users=400, days=3, users_per_chunk=150)
    simulate(SimulatorConfig(**small, workers=1), tmp_path / "a", progress=False)
    simulate(SimulatorConfig(**small, workers=2), tmp_path / "b", progress=False)
    simulate(SimulatorConfig(**dict(small, seed=4), workers=1), tmp_path / "c", progress=False)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


def test_output_passes_validation(world):
    root, events = world
    report = validate_dataset(root, report_dir=root.parent / "report")
    assert report.processed_rows["events"] == len(events)
    assert sum(report.quarantined_rows.values()) == 0


def test_activity_is_long_tailed(world):
    _, events = world
    per_user = events.groupby("user_id").size()
    assert 8 <= per_user.median() <= 100
    assert per_user.max() >= 20 * per_user.median()


def test_conversions_are_rare_delayed_and_follow_clicks(world):
    _, events = world
    ads = events[events.is_ad]
    ctr, cvr = ads.click.mean(), ads.conversion.mean()
    assert 0.01 < ctr < 0.15 and 0 < cvr < ctr / 4
    conv = events[events.conversion == 1]
    assert (conv.click == 1).all() and conv.is_ad.all()
    assert (conv.conversion_time > conv.event_time).all()
    assert set(events.event_type[events.is_ad]) == {"impression"}
    assert {"view", "like", "share"} <= set(events.event_type[~events.is_ad])


def _history_auc(events: pd.DataFrame, train_days: list[int], test_day: int) -> float:
    """AUC of a history-only predictor: the user's smoothed click rate on the category."""
    train = events[events.day.isin(train_days)]
    rate = train.groupby(["user_id", "category_id"]).click.agg(["sum", "count"])
    prior = train.click.mean()
    score = (rate["sum"] + 5 * prior) / (rate["count"] + 5)
    test = events[events.day == test_day]
    predicted = test.set_index(["user_id", "category_id"]).index.map(score).to_numpy(dtype=float)
    predicted = np.nan_to_num(predicted, nan=prior)
    return roc_auc_score(test.click, predicted)


def test_clicks_are_learnable_from_history(world):
    _, events = world
    assert _history_auc(events, [0, 1, 2, 3], 4) > 0.6


def test_interest_drifts_so_old_models_go_stale(world):
    _, events = world
    fresh = _history_auc(events, [0, 1], 2)
    stale = _history_auc(events, [0, 1], 7)
    assert fresh - stale > 0.01


def test_same_user_behaves_differently_per_surface(world):
    _, events = world
    heavy = events.groupby("user_id").size().nlargest(200).index
    ev = events[events.user_id.isin(heavy)]
    pref = ev.groupby(["user_id", "surface", "category_id"]).click.mean().unstack("surface")
    corr = pref[["feed", "video"]].dropna().corr().iloc[0, 1]
    assert corr < 0.9  # correlated (same person) but not identical


def test_rejects_bad_config(tmp_path):
    with pytest.raises(ValueError, match="users=0: must be >= 1"):
        simulate(SimulatorConfig(users=0), tmp_path / "x", progress=False)
