"""The Feast repo against a real local Feast: apply, materialize, online/offline parity."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gem.features.feast_repo import DEFAULT_REPO, apply, copy_repo, load_definitions, materialize
from gem.features.feast_sources import export
from tests.features.conftest import raw_events

RECENT = ["user_recent_behavior:recent_item_ids", "user_recent_behavior:recent_event_types",
          "user_recent_behavior:recent_surfaces", "user_recent_behavior:history_count"]
ATTRS = ["user_attributes:age_bucket", "user_attributes:country"]
K = 8


def fresh_clone(tmp_path: Path) -> Path:
    """The repo as a fresh clone has it: definitions only, no data/."""
    repo = tmp_path / "feature_repo"
    shutil.copytree(DEFAULT_REPO, repo, ignore=shutil.ignore_patterns("data", "__pycache__"))
    assert not (repo / "data").exists()
    return repo


def test_definitions_import_without_side_effects():
    before = sorted(p.name for p in DEFAULT_REPO.iterdir() if p.name != "__pycache__")
    objects = load_definitions(DEFAULT_REPO)
    after = sorted(p.name for p in DEFAULT_REPO.iterdir() if p.name != "__pycache__")
    assert before == after
    names = {type(o).__name__ + ":" + o.name for o in objects}
    assert {"Entity:user", "Entity:item", "FeatureView:user_attributes", "FeatureView:item_attributes",
            "FeatureView:user_recent_behavior"} <= names
    services = {n.split(":")[1] for n in names if n.startswith("FeatureService:")}
    assert {"gem_pretraining_v1", "feed_vertical_v1", "video_vertical_v1", "stories_vertical_v1",
            "messaging_vertical_v1"} <= services


@pytest.fixture(scope="module")
def applied_repo(conv_dataset, tmp_path_factory) -> Path:
    repo = copy_repo(DEFAULT_REPO, tmp_path_factory.mktemp("feast") / "repo")
    export(conv_dataset, repo, recent_k=K)
    apply(repo, definitions_repo=DEFAULT_REPO)
    return repo


def _norm(value):
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_norm(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


def test_online_serves_what_offline_retrieval_gives_at_the_same_time(applied_repo, conv_dataset):
    events = raw_events(conv_dataset)
    rng = np.random.default_rng(0)
    users = rng.choice(events["user_id"].unique(), size=25, replace=False).tolist()
    start = pd.Timestamp("2026-01-01", tz="UTC")
    checked, nonempty = 0, 0
    for hours in (9.25, 40.5, 83.75):  # three materialization times, none on an event
        when = (start + pd.Timedelta(hours=hours) + pd.Timedelta(microseconds=1)).to_pydatetime()
        store = materialize(applied_repo, end=when)
        online = store.get_online_features(features=RECENT + ATTRS,
                                           entity_rows=[{"user_id": int(u)} for u in users]).to_dict()
        entity = pd.DataFrame({"user_id": users, "event_timestamp": [pd.Timestamp(when)] * len(users)})
        offline = store.get_historical_features(entity_df=entity, features=RECENT + ATTRS).to_df()
        offline = offline.set_index("user_id").loc[users]
        when_us = int(pd.Timestamp(when).value // 1000)
        for i, user in enumerate(users):
            for ref in RECENT + ATTRS:
                name = ref.split(":")[1]
                assert _norm(online[name][i]) == _norm(offline[name].iloc[i]), (user, when, name)
            mine = events[(events["user_id"] == user) & (events["event_time"] <= when_us)]
            want = mine["item_id"].tail(K).tolist()
            assert (_norm(online["recent_item_ids"][i]) or []) == want, (user, when)
            assert (_norm(online["history_count"][i]) or 0) == len(mine)
            checked += 1
            nonempty += bool(want)
    assert checked == 75 and nonempty > 40


@pytest.mark.parametrize("config", ["feature_store.yaml", "feature_store.cluster.yaml"])
def test_materialize_asks_for_the_latest_row_per_entity_and_writes_in_batches(config):
    # without these Feast pulls every row of the range into pandas and writes the
    # online store in one batch: memory that grows with the whole log
    import yaml

    settings = yaml.safe_load((DEFAULT_REPO / config).read_text())["materialization"]
    assert settings["pull_latest_features"] is True
    assert 0 < settings["online_write_batch_size"] <= 100_000


def test_materialize_reads_the_sources_under_the_memory_limit(applied_repo, monkeypatch):
    import duckdb
    import ibis

    from gem.features.feast_sources import MEMORY_LIMIT

    limits, read_parquet = [], ibis.read_parquet

    def reading(*args, **kwargs):  # Feast's duckdb offline store reads each source here
        limits.append(ibis.get_backend().raw_sql("SELECT current_setting('memory_limit')").fetchone()[0])
        return read_parquet(*args, **kwargs)

    monkeypatch.setattr(ibis, "read_parquet", reading)
    before = ibis.options.default_backend
    materialize(applied_repo, end=pd.Timestamp("2026-01-02T12:00:00Z").to_pydatetime())
    want = duckdb.connect(config={"memory_limit": MEMORY_LIMIT}).execute(
        "SELECT current_setting('memory_limit')").fetchone()[0]
    assert len(limits) == 8 and set(limits) == {want}, limits  # users, items, recent behaviour, 5 counter views
    assert ibis.options.default_backend is before
    assert not (applied_repo / "data" / ".offline.spill").exists()


def test_training_attributes_come_from_point_in_time_retrieval(applied_repo, conv_dataset):
    from gem.features.attributes import fetch_attributes

    users = pd.read_parquet(conv_dataset / "users.parquet").head(5)
    times = np.full(len(users), int(pd.Timestamp("2026-01-02", tz="UTC").value // 1000))
    frame = fetch_attributes(applied_repo, users["user_id"].to_numpy(), np.ones(len(users), dtype=np.int64), times)
    assert frame["age_bucket"].tolist() == users["age_bucket"].tolist()
    # an entity time before the attribute rows' stamp finds nothing: nulls, not a future row
    early = fetch_attributes(applied_repo, users["user_id"].to_numpy(), np.array([1, 2, 3, 4, 999_999]),
                             np.full(len(users), int(pd.Timestamp("2025-06-01", tz="UTC").value // 1000)))
    assert early["age_bucket"].isna().all() and early["category_id"].isna().all()


def test_cli_feast_apply_and_materialize_from_a_fresh_clone(conv_dataset, tmp_path, capsys):
    from gem_app.cli import main

    repo = fresh_clone(tmp_path)
    assert main(["features", "materialize", "--repo", str(repo), "--end", "2026-01-03T00:00:00Z"]) == 2
    assert main(["features", "feast-apply", "--data", str(conv_dataset), "--repo", str(repo), "--preset", "tiny"]) == 0
    assert main(["features", "materialize", "--repo", str(repo), "--end", "2026-01-03T00:00:00Z"]) == 0
    capsys.readouterr()
    # the plain Feast CLI works on the same repo, run from inside it as Feast expects
    feast = Path(sys.executable).with_name("feast")
    done = subprocess.run([str(feast), "feature-services", "list"], cwd=repo, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gem_pretraining_v1" in done.stdout and "messaging_vertical_v1" in done.stdout
    from gem.features.feast_repo import open_store

    served = open_store(repo).get_online_features(features=RECENT[:1], entity_rows=[{"user_id": 1}]).to_dict()
    assert served["recent_item_ids"][0], "materialize left the online store empty"
