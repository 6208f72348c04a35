"""Build outputs: determinism, atomicity, the shard API, storage, vocabularies, report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gem.data.contract import MANIFEST
from gem.features import shards as shards_module
from gem.features import storage
from gem.features.build import build_features, finalize_build, prepare_build
from gem.features.loader import FeatureLoader, load_feature_spec
from gem.features.segments import SHARD_FILES
from gem.features.shards import build_shard, list_shards
from tests.features.conftest import collect, raw_events, tiny_cfg


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_rebuilding_the_same_window_is_byte_identical(conv_dataset, conv_features, tmp_path):
    again = tmp_path / "again"
    build_features(conv_dataset, again, tiny_cfg(max_seq_len=48))
    first, second = files_of(conv_features), files_of(again)
    assert sorted(first) == sorted(second)
    assert len(first) > 10
    differing = [name for name in first if first[name] != second[name]]
    assert differing == []


def test_shards_built_separately_in_any_order_match_the_one_call_build(conv_dataset, conv_features, tmp_path):
    cfg = tiny_cfg(max_seq_len=48)
    plan = prepare_build(conv_dataset, tmp_path / "fanout", cfg)
    shards = list_shards(plan)
    assert len(shards) == plan.num_buckets * len(plan.example_days) == 8
    for key in reversed(shards):  # as a pipeline's parallel tasks might finish
        build_shard(plan, key)
    manifest = finalize_build(plan, cfg)
    assert manifest["digest"] == json.loads((conv_features / MANIFEST).read_text())["digest"]
    assert not plan.work_dir.exists()


def test_an_interrupted_build_leaves_no_shard_and_no_manifest(conv_dataset, tmp_path, monkeypatch):
    out = tmp_path / "interrupted"
    build_features(conv_dataset, out, tiny_cfg())
    original = shards_module.write_parquet
    calls = {"n": 0}

    def failing_write(table, path, encodings=None):
        calls["n"] += 1
        if calls["n"] == 5:  # the history file of the second shard
            raise KeyboardInterrupt("simulated kill")
        original(table, path, encodings)

    monkeypatch.setattr(shards_module, "write_parquet", failing_write)
    with pytest.raises(KeyboardInterrupt):
        build_features(conv_dataset, out, tiny_cfg(max_seq_len=16))
    assert calls["n"] == 5
    assert not (out / MANIFEST).exists()
    leftovers = [p.name for p in (out / "shards").iterdir() if p.name.startswith(".")]
    assert leftovers == [], "a temp shard directory survived the interruption"
    with pytest.raises(FileNotFoundError, match="not a finished features build"):
        FeatureLoader(out, batch_size=8)
    # every visible shard is whole: readable, with all its files
    for shard in (out / "shards").iterdir():
        assert sorted(p.name for p in shard.iterdir()) == list(SHARD_FILES)
        pq.read_table(shard / "history.parquet")
    # a SIGKILL leaves a hidden temp dir behind; the next build removes it
    killed = out / "shards" / ".b000-2026-01-02.tmp-99999"
    killed.mkdir()
    (killed / "examples.parquet").write_bytes(b"partial")
    monkeypatch.setattr(shards_module, "write_parquet", original)
    build_features(conv_dataset, out, tiny_cfg(max_seq_len=16))
    assert not killed.exists()
    assert FeatureLoader(out, batch_size=64).num_examples > 0


def test_atomic_dir_replaces_whole_or_not_at_all(tmp_path):
    final = tmp_path / "shard"
    with storage.atomic_dir(final) as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError):
        with storage.atomic_dir(final) as tmp:
            (tmp / "a").write_text("new")
            raise RuntimeError("crash")
    assert (final / "a").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["shard"]


def test_manifest_spec_counts_and_storage(conv_features):
    manifest = json.loads((conv_features / MANIFEST).read_text())
    spec = load_feature_spec(conv_features)
    assert spec.to_dict() == manifest["spec"]
    assert spec.max_seq_len == 48
    assert list(spec.sequence) == sorted(["seq_item_id", "seq_event_type", "seq_surface", "seq_is_ad", "seq_action"])
    counts = manifest["counts"]
    assert counts["examples"] == sum(s["examples"] for s in manifest["shards"]) > 500
    # stored once per shard: the history is far smaller than the sum of sequence lengths
    assert counts["history_events_stored"] < counts["sequence_elements"] / 2
    assert manifest["bytes"]["per_example"] < manifest["bytes"]["materialized_per_example"]
    for shard in manifest["shards"]:
        assert storage.dir_digest(conv_features / "shards" / shard["name"]) == shard["sha256"]


def test_ids_are_dense_and_in_range(conv_features):
    loader = FeatureLoader(conv_features, batch_size=256, shuffle=False)
    seen_nonzero = set()
    for batch in loader:
        for key, jt in list(batch.sparse.to_dict().items()) + list(batch.sequence.to_dict().items()):
            card = {**loader.spec.sparse, **loader.spec.sequence}[key]
            values = jt.values()
            assert int(values.min()) >= 0 and int(values.max()) < card, key
            if int(values.max()) > 0:
                seen_nonzero.add(key)
    assert seen_nonzero == set(loader.spec.sparse) | set(loader.spec.sequence)


def test_min_count_and_reused_vocabulary_report_unknown_ids(conv_dataset, conv_features, tmp_path):
    early = tmp_path / "early"
    build_features(conv_dataset, early, tiny_cfg(min_count=3), window_start="2026-01-01", window_end="2026-01-03")
    report = json.loads((early / "report.json").read_text())
    assert 0 < report["unknown_share"]["item_id"] < 0.5
    assert report["sequence_item_unknown_share"] > 0
    late = tmp_path / "late"
    build_features(conv_dataset, late, tiny_cfg(vocab_from=str(early)), window_start="2026-01-03",
                   window_end="2026-01-05", previous_report=early)
    assert load_feature_spec(late).sparse == load_feature_spec(early).sparse  # same ids as the model's tables
    late_report = json.loads((late / "report.json").read_text())
    assert late_report["unknown_share"]["item_id"] > 0
    drift = late_report["drift"]
    assert drift["previous_window"] == report["window"]
    assert drift["psi_sequence_length"] > 0  # later days have longer histories
    assert set(drift["by_surface"]) == {"feed", "video", "stories", "messaging"}


def test_report_contents(conv_features):
    report = json.loads((conv_features / "report.json").read_text())
    assert report["examples"] == sum(report["sequence_length"]["hist"])
    assert 0 < report["truncation_rate"] < 1
    assert sum(r["examples"] for r in report["label_rates"].values()) == report["examples"]
    assert all(0 < r["click_rate"] < 1 for r in report["label_rates"].values())
    assert report["drift"] is None


def test_report_is_logged_to_an_active_mlflow_run(conv_dataset, conv_features, tmp_path, monkeypatch):
    import mlflow

    from gem.features.report import log_to_mlflow, read_report

    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        experiment = mlflow.create_experiment("features-test", artifact_location=str(tmp_path / "artifacts"))
        with mlflow.start_run(experiment_id=experiment) as run:
            assert log_to_mlflow(read_report(conv_features))
        logged = mlflow.get_run(run.info.run_id)
        assert logged.data.metrics["features/truncation_rate"] == pytest.approx(
            read_report(conv_features)["truncation_rate"])
        assert "features/click_rate/feed" in logged.data.metrics
        artifacts = [a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "features")]
        assert artifacts == ["features/report.json"]
    finally:
        mlflow.set_tracking_uri(None)
    assert not log_to_mlflow(read_report(conv_features))  # no active run: nothing logged


def test_cli_build(conv_dataset, tmp_path, capsys):
    from gem_app.cli import main

    out = tmp_path / "cli"
    rc = main(["features", "build", str(conv_dataset), str(out), "--preset", "tiny", "--set", "max_seq_len=8",
               "--start", "2026-01-04T00:00:00Z"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["window"]["start"].startswith("2026-01-04")
    assert load_feature_spec(out).max_seq_len == 8
    assert summary["counts"]["examples"] == FeatureLoader(out, batch_size=64).num_examples > 0


def test_bad_window_is_rejected(conv_dataset, tmp_path):
    with pytest.raises(ValueError, match="must be before"):
        prepare_build(conv_dataset, tmp_path / "x", tiny_cfg(), window_start="2026-01-03", window_end="2026-01-02")


def test_multi_day_shards_hold_the_same_examples_and_sequences(conv_dataset, conv_features, tmp_path):
    out = tmp_path / "two-day"
    manifest = build_features(conv_dataset, out, tiny_cfg(max_seq_len=48, days_per_shard=2))
    assert [s["day"] for s in manifest["shards"][:2]] == ["2026-01-01", "2026-01-03"]
    daily = json.loads((conv_features / MANIFEST).read_text())
    assert manifest["counts"]["examples"] == daily["counts"]["examples"]
    # each event is stored in the segment of its own period, whatever the period length
    assert manifest["counts"]["history_events_stored"] == daily["counts"]["history_events_stored"]
    a = collect(FeatureLoader(out, batch_size=256, shuffle=False))
    b = collect(FeatureLoader(conv_features, batch_size=256, shuffle=False))
    assert sorted(a) == sorted(b)
    for eid in list(a)[::7]:
        for key, value in a[eid].items():
            np.testing.assert_array_equal(value, b[eid][key], err_msg=f"{eid} {key}")


def test_history_is_carried_across_day_shards_not_stored_again(conv_dataset, conv_features, tmp_path):
    events = raw_events(conv_dataset)
    daily = json.loads((conv_features / MANIFEST).read_text())
    assert len(daily["shards"]) == 8  # 2 buckets x 4 days, every user active on most days
    assert 0.8 * len(events) < daily["counts"]["history_events_stored"] <= len(events)
    # a later window: its events plus at most max_seq_len earlier events per user (the base)
    late = build_features(conv_dataset, tmp_path / "late", tiny_cfg(max_seq_len=16), window_start="2026-01-03")
    start_us = 1767398400 * 1_000_000  # 2026-01-03
    in_window = events["event_time"] >= start_us
    users = events.loc[in_window & events["is_ad"], "user_id"].nunique()
    stored = late["counts"]["history_events_stored"]
    assert int(in_window.sum()) < stored <= int(in_window.sum()) + 16 * users
    assert stored - int(in_window.sum()) > 2 * users  # the base is there


def test_pipeline_stages_rebuild_a_shard_or_build_of_an_older_layout(conv_dataset, conv_features, tmp_path):
    from gem_app.stages.features import _finished as _finished_features
    from gem_app.stages.features import features_shard as features_shard_stage

    plan = prepare_build(conv_dataset, tmp_path / "upgrade", tiny_cfg(max_seq_len=48))
    name = list_shards(plan)[0].name
    first = features_shard_stage(str(plan.out_dir), name)
    stats_file = plan.shards_dir / name / "stats.json"
    stats_file.write_text(json.dumps({**first, "format": "gem-features/1"}))
    assert features_shard_stage(str(plan.out_dir), name) == first  # rebuilt, not reused
    assert json.loads(stats_file.read_text()) == first
    manifest = json.loads((conv_features / MANIFEST).read_text())
    assert _finished_features(str(conv_features))["digest"] == manifest["digest"]
    old = tmp_path / "old"
    old.mkdir()
    (old / MANIFEST).write_text(json.dumps({**manifest, "format": "gem-features/1"}))
    assert _finished_features(str(old)) is None


def test_a_bucket_with_history_but_no_example_in_the_window_builds(conv_dataset, tmp_path):
    """A narrow window over many buckets: some bucket's users have events before the
    window and no impression inside it (a sparse multi-year log's daily windows)."""
    events = raw_events(conv_dataset)
    ads = events[events["is_ad"]].sort_values("event_time")
    t0 = int(ads["event_time"].iloc[-40])  # the window holds the last 40 impressions (and a few at the same time)
    start = np.datetime64(t0, "us").astype(str) + "+00:00"
    end = np.datetime64(int(events["event_time"].max()) + 1, "us").astype(str) + "+00:00"
    manifest = build_features(conv_dataset, tmp_path / "narrow", tiny_cfg(num_buckets=64), window_start=start,
                              window_end=end)
    expected = int((ads["event_time"] >= t0).sum())
    assert manifest["counts"]["examples"] == expected
    per_bucket = {}
    for shard in manifest["shards"]:
        per_bucket[shard["bucket"]] = per_bucket.get(shard["bucket"], 0) + shard["examples"]
    assert 0 in per_bucket.values() or len(per_bucket) < 64  # some bucket has no example
    assert len(collect(FeatureLoader(tmp_path / "narrow", batch_size=64, shuffle=False))) == expected


def test_a_shard_refuses_staged_events_that_changed_after_the_index(conv_dataset, tmp_path):
    """The shard takes its segment's events by their row in the index; rows that moved
    (a staged file gone or rewritten mid-build) are refused, never taken by position."""
    plan = prepare_build(conv_dataset, tmp_path / "changed", tiny_cfg(max_seq_len=48))
    key = list_shards(plan)[0]
    staged = sorted(plan.part_dir(key.bucket, plan.period_index(key.day)).glob("group=*.parquet"))
    assert staged
    table = pq.read_table(staged[0])
    pq.write_table(table.slice(1), staged[0])  # one event fewer: every later row shifts
    with pytest.raises(RuntimeError, match="differ from its index"):
        build_shard(plan, key)


def test_staging_files_each_cell_s_rows_sorted_by_user_time_and_event_id(conv_dataset, tmp_path):
    from gem.features.jagged import user_bucket
    from gem.features.staging import _write_buckets

    plan = prepare_build(conv_dataset, tmp_path / "staged", tiny_cfg(max_seq_len=48))
    raw = raw_events(conv_dataset)
    raw = raw[raw["event_time"] < plan.window_end_us].sample(frac=1.0, random_state=0)  # any input order
    columns = {c: raw[c].to_numpy() for c in ("user_id", "event_time", "event_id")}
    _write_buckets(plan, 99, columns)
    ids, files = [], sorted(plan.staging_dir.glob("bucket=*/*/group=00099.parquet"))
    for path in files:
        t = pq.read_table(path)
        user, time_, eid = (t.column(c).to_numpy() for c in ("user_id", "event_time", "event_id"))
        bucket, part = int(path.parent.parent.name.split("=")[1]), path.parent.name
        assert (user_bucket(user, plan.num_buckets) == bucket).all(), path
        assert (np.maximum(plan.part_of(time_), -1) == (-1 if part == "base" else int(part.split("=")[1]))).all()
        assert (np.lexsort((eid, time_, user)) == np.arange(len(user))).all(), path
        ids.append(eid)
    ids = np.concatenate(ids)
    assert len(files) > 1 and np.array_equal(np.sort(ids), np.sort(columns["event_id"])), "rows lost or doubled"
