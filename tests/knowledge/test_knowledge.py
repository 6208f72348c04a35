"""Knowledge generation: schema, tagging, faithfulness to the teacher, Feast point-in-time."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from gem.data.contract import TASKS
from gem.features.loader import FeatureLoader
from gem.knowledge.generate import (
    ITEM_EMBEDDING,
    MANIFEST,
    OWN_COLUMNS,
    PREDICTIONS,
    SURFACE_COLUMNS,
    USER_EMBEDDING,
    generate_knowledge,
)
from gem.knowledge.teacher import load_teacher, teacher_outputs
from gem.knowledge.windows import example_keys
from tests.students.fixtures import TEACHER_NAME, WINDOWS


def test_schema_counts_and_tags(world):
    manifest = json.loads((world.knowledge["student"] / MANIFEST).read_text())
    predictions = pq.read_table(world.knowledge["student"] / PREDICTIONS).to_pandas()
    n = FeatureLoader(world.features["student"], batch_size=64, shuffle=False).num_examples
    assert manifest["counts"]["examples"] == len(predictions) == n > 0
    assert manifest["teacher_version"] == f"models:/{TEACHER_NAME}/1"
    expected = ["example_id", "user_id", "item_id", "surface", "event_timestamp", *OWN_COLUMNS,
                *SURFACE_COLUMNS, "teacher_version", "window_start", "window_end", "teacher_digest", "vocab_digest"]
    assert list(predictions.columns) == expected
    assert set(predictions["teacher_version"]) == {f"models:/{TEACHER_NAME}/1"}
    # the teacher itself (its weights) and its vocabularies: what a student checks (students/lineage.py)
    from gem.features.loader import load_feature_spec
    from gem.features.vocab import vocabulary_digest

    assert set(predictions["teacher_digest"]) == {manifest["teacher_digest"]} and len(manifest["teacher_digest"]) == 64
    assert set(predictions["vocab_digest"]) == {vocabulary_digest(load_feature_spec(world.features["student"])
                                                                  .vocab_digests)} == {manifest["vocab_digest"]}
    lo, hi = WINDOWS["student"]
    assert predictions["window_start"].iloc[0].startswith(lo) and predictions["window_end"].iloc[0].startswith(hi)
    assert predictions["example_id"].is_unique
    ts = predictions["event_timestamp"]
    assert ts.min() >= pd.Timestamp(lo, tz="UTC") and ts.max() < pd.Timestamp(hi, tz="UTC")
    assert np.isfinite(predictions[list(OWN_COLUMNS + SURFACE_COLUMNS)].to_numpy()).all()
    # the own-surface logits are the all-surface logits at the impression's surface
    for task in TASKS:
        own_surface = predictions.apply(lambda r, task=task: r[f"teacher_logit_{r['surface']}_{task}"], axis=1)
        np.testing.assert_allclose(predictions[f"teacher_logit_{task}"], own_surface, rtol=1e-6)
    for name, key, column in ((USER_EMBEDDING, "user_id", "teacher_user_embedding"),
                              (ITEM_EMBEDDING, "item_id", "teacher_item_embedding")):
        table = pq.read_table(world.knowledge["student"] / name).to_pandas()
        assert {key, "event_timestamp", column, "teacher_version", "window_start", "window_end"} <= set(table.columns)
        assert {len(v) for v in table[column]} == {manifest["embedding_dim"]}
    # raw contract ids (Feast's entity keys), checked against the contract event log
    import pyarrow.dataset as ds

    events = ds.dataset(world.data / "events", format="parquet").to_table(
        columns=["event_id", "user_id", "item_id"]).to_pandas().set_index("event_id")
    truth = events.loc[predictions["example_id"]]
    assert (truth["user_id"].to_numpy() == predictions["user_id"].to_numpy()).all()
    known = predictions["item_id"].to_numpy() >= 0  # -1: an item the teacher's vocabulary never saw
    assert known.mean() > 0.5
    assert (truth["item_id"].to_numpy()[known] == predictions["item_id"].to_numpy()[known]).all()
    from gem.features.vocab import Vocabularies

    vocab = set(Vocabularies.read(world.features["student"]).values["item_id"].to_pylist())
    assert not set(truth["item_id"].to_numpy()[~known]) & vocab


def test_knowledge_equals_a_fresh_teacher_forward(world):
    teacher = load_teacher(world.teacher_uri, world.tracking_uri)
    predictions = pq.read_table(world.knowledge["student"] / PREDICTIONS).to_pandas().set_index("example_id")
    batch = next(iter(FeatureLoader(world.features["student"], batch_size=32, shuffle=True, seed=3)))
    with torch.no_grad():
        own, every, _, _ = teacher_outputs(teacher.model, batch)
    rows = predictions.loc[batch.example_id.numpy()]
    np.testing.assert_allclose(rows[list(OWN_COLUMNS)].to_numpy(), own.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rows[list(SURFACE_COLUMNS)].to_numpy(), every.reshape(32, -1).numpy(),
                               rtol=1e-4, atol=1e-4)


def test_point_in_time_retrieval_through_feast(world):
    from gem.knowledge.feast import historical_knowledge

    predictions = pq.read_table(world.knowledge["eval"] / PREDICTIONS).to_pandas()
    users = pd.concat([pq.read_table(k / USER_EMBEDDING).to_pandas() for k in world.knowledge.values()])
    keys = example_keys(world.features["eval"]).sample(60, random_state=0).reset_index(drop=True)
    got = historical_knowledge(world.repo, keys)
    assert list(got["example_id"]) == list(keys["example_id"])  # same order as asked
    expected = predictions.set_index("example_id").loc[keys["example_id"]]
    np.testing.assert_allclose(got["teacher_logit_click"].to_numpy(), expected["teacher_logit_click"], rtol=1e-6)
    assert set(got["teacher_version"]) == {f"models:/{TEACHER_NAME}/1"}
    for _, row in got.iterrows():  # the user embedding is the latest one strictly before the impression
        key = keys.loc[keys["example_id"] == row["example_id"]].iloc[0]
        earlier = users[(users["user_id"] == key["user_id"]) & (users["event_timestamp"] < key["event_timestamp"])]
        if earlier.empty:
            assert not np.any(row["teacher_user_embedding"])
        else:
            latest = earlier.sort_values("event_timestamp").iloc[-1]["teacher_user_embedding"]
            np.testing.assert_allclose(row["teacher_user_embedding"], latest, rtol=1e-6)
    # before any knowledge exists, nothing leaks back from the future
    early = keys.head(5).assign(event_timestamp=pd.Timestamp("2025-12-01", tz="UTC"))
    none = historical_knowledge(world.repo, early)
    assert none["teacher_logit_click"].isna().all()
    assert not np.any(np.stack(none["teacher_user_embedding"].to_list()))


def test_generate_cli_with_local_teacher_replaces_output(world, tmp_path):
    from gem_app.cli import main

    out = tmp_path / "k"
    args = ["knowledge", "generate", "--model", str(world.teacher_dir), "--data", str(world.features["eval"]),
            "--out", str(out), "--preset", "tiny"]
    assert main(args) == 0
    (out / "stale.txt").write_text("from an earlier run")
    assert main(args) == 0  # its own earlier output: replaced (a foreign folder is refused)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["teacher_version"].startswith("local:") and manifest["counts"]["examples"] > 0
    assert not (out / "stale.txt").exists()  # replaced as a whole (atomic rename)
    assert not list(tmp_path.glob(".k.*"))  # no temp folders left behind


def test_teacher_spec_mismatch_is_refused(world, tmp_path):
    teacher = load_teacher(world.teacher_dir)
    teacher.model.spec.sparse = {**teacher.model.spec.sparse, "item_id": 3}
    try:
        with pytest.raises(ValueError, match="another feature spec"):
            generate_knowledge(teacher, world.features["eval"], tmp_path / "bad")
    finally:
        teacher.model.spec.sparse = load_teacher(world.teacher_dir).spec.sparse
    assert not (tmp_path / "bad").exists()


def test_embeddings_are_read_as_of_the_last_materialization(world):
    """Daily knowledge cadence: a request reads the newest embedding written before the
    last midnight materialization, never one of its own day; per impression is the
    labelled upper bound that reads the row just before it."""
    import datetime as dt

    import numpy as np
    import pandas as pd

    from gem.knowledge.feast import historical_knowledge
    from gem.knowledge.windows import example_keys

    keys = example_keys(world.features["eval"]).sort_values("example_id").head(300).reset_index(drop=True)
    daily = historical_knowledge(world.repo, keys, predictions=False, refresh_every=dt.timedelta(days=1))
    live = historical_knowledge(world.repo, keys, predictions=False)
    midnight = keys["event_timestamp"].dt.floor("1D")
    assert (pd.to_datetime(daily["knowledge_as_of"], utc=True) < midnight).all()
    users = pd.concat([pd.read_parquet(k / "user_embedding.parquet") for k in world.knowledge.values()])
    users["event_timestamp"] = pd.to_datetime(users["event_timestamp"], utc=True)
    for i in range(0, len(keys), 7):
        rows = users[(users["user_id"] == keys.loc[i, "user_id"]) & (users["event_timestamp"] < midnight[i])]
        expected = (np.asarray(rows.sort_values("event_timestamp").iloc[-1]["teacher_user_embedding"])
                    if len(rows) else np.zeros_like(daily.loc[i, "teacher_user_embedding"]))
        np.testing.assert_allclose(daily.loc[i, "teacher_user_embedding"], expected, rtol=1e-6)
    changed = [not np.allclose(a, b) for a, b in zip(daily["teacher_user_embedding"], live["teacher_user_embedding"])]
    assert any(changed)  # the per-impression read sees the same day's rows: an upper bound, not what serving gets


def test_the_knowledge_stage_covers_a_lead_so_the_first_student_day_reads_embeddings(world, tmp_path):
    """Under a daily cadence a request on the student window's first day reads what the
    midnight materialization holds: with no knowledge before the window that is nothing
    (zeros), while the evaluation day reads real embeddings. The pipeline's knowledge
    stage therefore also covers the teacher window's last days (the lead)."""
    import datetime as dt

    from gem.knowledge import prepare_repo
    from gem.knowledge.feast import historical_knowledge
    from gem_app.stages.context import RunContext
    from gem_app.stages.knowledge import knowledge

    ctx = RunContext(pipeline_run_id="lead-test", tracking_root=str(world.root))  # the world's store
    keys = example_keys(world.features["student"])
    read = {}
    for lead in ("", str(world.features["teacher"])):
        repo = prepare_repo(tmp_path / f"feast{bool(lead)}", world.data)
        result = knowledge(world.teacher_uri, [str(world.features["student"])], str(tmp_path / f"k{bool(lead)}"),
                           str(repo), ctx, preset="tiny", lead_from=lead)
        got = historical_knowledge(repo, keys, predictions=False, refresh_every=dt.timedelta(days=1))
        read[bool(lead)] = np.stack(got["teacher_user_embedding"].to_list())
        if lead:
            manifest = json.loads((tmp_path / "kTrue" / "lead" / MANIFEST).read_text())
            assert result.knowledge[0].endswith("lead")
            assert manifest["window"]["end"].startswith(WINDOWS["teacher"][1])
            ts = pq.read_table(tmp_path / "kTrue" / "lead" / PREDICTIONS).to_pandas()["event_timestamp"]
            assert ts.max() < pd.Timestamp(WINDOWS["teacher"][1], tz="UTC")  # only the lead's rows
    assert not np.abs(read[False]).any()  # nothing written before the student window's midnight
    assert (np.abs(read[True]).sum(axis=1) > 0).mean() > 0.5  # most users read an embedding


def test_the_lead_ends_where_an_overlapping_student_window_starts(world, tmp_path):
    """``--student-overlap-days``: the students' window starts inside the teacher's; the
    lead covers the days before that start (not rows the student window already has), and
    none when the overlap reaches the teacher's first day."""
    import datetime as dt
    import shutil

    from gem.data.contract import parse_utc
    from gem_app.stages.knowledge import _windows

    teacher = str(world.features["teacher"])
    t_start, t_end = (parse_utc(x) for x in WINDOWS["teacher"])

    def student_from(start: dt.datetime) -> str:
        folder = tmp_path / start.strftime("s%Y%m%d%H")
        shutil.copytree(world.features["student"], folder)
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["window"]["start"] = start.isoformat()
        (folder / "manifest.json").write_text(json.dumps(manifest))
        return str(folder)

    plain = _windows([str(world.features["student"])], teacher, 1)
    assert plain[0][1:] == ("lead", (t_end - dt.timedelta(days=1)).isoformat(), t_end.isoformat())
    start = t_end - dt.timedelta(hours=12)
    lead = _windows([student_from(start)], teacher, 1)[0]
    assert lead[1:] == ("lead", (start - dt.timedelta(days=1)).isoformat(), start.isoformat())
    assert [w[1] for w in _windows([student_from(t_start)], teacher, 1)] == [f"s{t_start:%Y%m%d%H}"]


def test_a_window_inside_a_shard_gets_only_its_own_examples(world, tmp_path):
    """start/end narrower than the build's window (here inside its shards): the teacher
    runs, and knowledge is written, for exactly the window's impressions."""
    lo, hi = WINDOWS["teacher"]
    day2 = "2026-01-02"
    manifest = generate_knowledge(world.teacher_uri, world.features["teacher"], tmp_path / "k", start=day2,
                                  tracking_uri=world.tracking_uri)
    predictions = pq.read_table(tmp_path / "k" / PREDICTIONS).to_pandas()
    keys = example_keys(world.features["teacher"])
    expected = keys[keys["event_timestamp"] >= pd.Timestamp(day2, tz="UTC")]
    assert 0 < len(expected) < len(keys)  # the window is narrower than the build
    assert sorted(predictions["example_id"]) == sorted(expected["example_id"])
    assert manifest["counts"]["examples"] == len(expected)
    assert manifest["window"]["start"].startswith(day2) and manifest["window"]["end"].startswith(hi)
    assert lo < day2


def test_a_window_without_impressions_writes_empty_tables(world, tmp_path):
    """A lead or window with no impression in [start, end) (a sparse log's quiet days)
    gives empty knowledge tables with the full schema, not a crash."""
    keys = example_keys(world.features["teacher"])
    first = keys["event_timestamp"].min()
    assert first > first.floor("D")  # the first day's shard has quiet time before its first impression
    start, end = first.floor("D").isoformat(), first.isoformat()
    manifest = generate_knowledge(world.teacher_uri, world.features["teacher"], tmp_path / "k", start=start, end=end,
                                  tracking_uri=world.tracking_uri)
    assert manifest["counts"] == {"examples": 0, PREDICTIONS: 0, USER_EMBEDDING: 0, ITEM_EMBEDDING: 0}
    predictions = pq.read_table(tmp_path / "k" / PREDICTIONS)
    assert predictions.num_rows == 0 and set(OWN_COLUMNS) | set(SURFACE_COLUMNS) <= set(predictions.column_names)
    assert pq.read_table(tmp_path / "k" / USER_EMBEDDING).num_rows == 0


def test_one_thread_tuner_over_several_windows_tries_the_threads_once(world, tmp_path):
    """The knowledge stage shares one tuner between its windows: the trial steps (some
    with the slower thread count) happen once, and the knowledge is the same."""
    from gem.knowledge.config import KnowledgeConfig
    from gem.training.threads import ThreadTuner

    tuner = ThreadTuner(choices=(2, 1), trial_steps=2, recheck_every=1000)
    cfg = KnowledgeConfig(batch_size=64)
    teacher = load_teacher(world.teacher_uri, world.tracking_uri)
    steps = []
    for name in ("student", "eval"):
        generate_knowledge(teacher, world.features[name], tmp_path / name, cfg, tuner=tuner)
        steps.append(tuner.steps)
        fixed = generate_knowledge(teacher, world.features[name], tmp_path / f"{name}-fixed",
                                   KnowledgeConfig(batch_size=64, threads=1))
        assert fixed["counts"]["examples"] > 64  # several batches
        np.testing.assert_allclose(pq.read_table(tmp_path / name / PREDICTIONS).to_pandas()[list(OWN_COLUMNS)],
                                   pq.read_table(tmp_path / f"{name}-fixed" / PREDICTIONS).to_pandas()[
                                       list(OWN_COLUMNS)], rtol=1e-5, atol=1e-6)
    assert 0 < steps[0] < steps[1]  # both windows' batches went through the one tuner
    # the default's trial steps come only from the first round: one round over both windows
    # (2 steps of each choice, or 1 when one step each was decisive; 1 thread may be tried
    # again later if the default's steps grow dearer, as on a loaded machine)
    assert len(tuner.cost[2]) in (1, 2) and len(tuner.cost[1]) >= len(tuner.cost[2])


def test_the_teacher_forward_reports_its_batches_to_the_pipeline_console(world, monkeypatch, capsys):
    # a long knowledge stage (MovieLens-1M's whole window: minutes) showed no bar in the
    # pipeline's console: the teacher's batches are its progress
    from gem.knowledge.generate import run_teacher
    from gem.utils.progress import EVENT_PREFIX

    monkeypatch.setenv("GEM_PROGRESS", "events")
    teacher = load_teacher(world.teacher_uri, world.tracking_uri)
    loader = FeatureLoader(world.features["student"], batch_size=64, shuffle=False)
    out = run_teacher(teacher, loader)
    events = [json.loads(line.split(EVENT_PREFIX, 1)[1]) for line in capsys.readouterr().out.split("\n")
              if EVENT_PREFIX in line]
    assert events and {e["desc"] for e in events} == {f"teacher on {world.features['student'].name}"}
    assert events[-1].get("done") and events[-1]["n"] == events[-1]["total"] == len(loader)
    assert len(out["example_id"]) == loader.num_examples
