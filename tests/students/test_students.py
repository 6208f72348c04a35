"""Students: size, transfer methods, adapter window, KD-0 equivalence, registry, serving."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from gem.config import from_dict
from gem.knowledge.teacher import load_teacher
from gem.model import forward_flops_per_example
from students.config import DistillConfig, StudentModelConfig
from students.data import attach_knowledge, load_table
from students.distill import distill
from tests.students.fixtures import TEACHER_NAME

STUDENT = {"embedding_dim": 8, "history_len": 4, "mlp_hidden": [16, 8]}
METHODS = {
    "kd": {"kd": {"weight": 0.5, "temperature": 2.0}},
    "adapter": {"adapter": {"weight": 0.5}},
    "representation": {"representation": {"enabled": True}},
    "sharing": {"sharing": "finetune"},
    "hierarchical": {"hierarchical": {"weight": 0.5, "epochs": 1}},
}


@pytest.fixture(scope="module")
def tables(world):
    cfg = from_dict(StudentModelConfig, STUDENT)
    train, spec = load_table(world.features["student"], cfg)
    evaluation, _ = load_table(world.features["eval"], cfg)
    return attach_knowledge(train, world.repo), attach_knowledge(evaluation, world.repo), spec


@pytest.fixture(scope="module")
def teacher(world):
    return load_teacher(world.teacher_uri, world.tracking_uri)


def _cfg(transfer: dict | None = None, **extra) -> DistillConfig:
    raw = {"student": STUDENT, "optim": {"epochs": 2, "batch_size": 64}, "surfaces": ["feed", "video"],
           "transfer": copy.deepcopy(transfer or {}), **extra}
    return from_dict(DistillConfig, raw)


def _eval_probs(out, table, surface="feed"):
    from students.train import predict

    return predict(out.students[surface].model, table.subset(table.surface == 0))


def test_student_flops_at_most_5_percent_of_teacher(tables, teacher):
    train, _, spec = tables
    teacher_flops = forward_flops_per_example(teacher.model, mean_len=float(spec.max_seq_len) / 2)
    every = {"kd": {"weight": 0.2}, "adapter": {"weight": 0.2}, "representation": {"enabled": True},
             "sharing": "frozen", "hierarchical": {"weight": 0.2, "epochs": 1}}
    for transfer in ({}, every):
        out = distill(train, None, spec, _cfg(transfer, surfaces=["feed"]), teacher_model=teacher.model)
        ratio = out.students["feed"].flops_per_example / teacher_flops
        assert 0 < ratio <= 0.05, f"student/teacher FLOPs {ratio:.4f} for transfer={transfer}"


def test_kd_with_weight_zero_is_the_no_teacher_student(tables, teacher):
    train, evaluation, spec = tables
    base = distill(train, evaluation, spec, _cfg())
    zero = distill(train, evaluation, spec, _cfg({"kd": {"weight": 0.0, "temperature": 3.0}}))
    for surface in base.students:
        a, b = base.students[surface].model.state_dict(), zero.students[surface].model.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert base.students[surface].metrics == zero.students[surface].metrics
    assert base.students["feed"].metrics["auc/click"] > 0  # it was evaluated


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_method_trains_and_changes_the_student(tables, teacher, method):
    train, evaluation, spec = tables
    base = distill(train, evaluation, spec, _cfg())
    out = distill(train, evaluation, spec, _cfg(METHODS[method]), teacher_model=teacher.model)
    res = out.students["feed"]
    assert res.methods == [method]
    assert all(np.isfinite(res.train_loss)) and res.train_loss[-1] < res.train_loss[0] * 1.5
    assert {"auc/click", "ne/click", "calibration/click"} <= set(res.metrics)
    assert not torch.allclose(_eval_probs(out, evaluation), _eval_probs(base, evaluation))
    assert res.teacher_version == f"models:/{TEACHER_NAME}/1"
    if method == "sharing":
        assert "item_id" in res.shared_tables
    if method == "hierarchical":  # GEM -> two domain models (halves of the surfaces) -> vertical students
        assert set(out.domain_models) == {"feed+video", "stories+messaging"}


def test_methods_combine(tables, teacher):
    train, evaluation, spec = tables
    combined = {"kd": {"weight": 0.2}, "adapter": {"weight": 0.3}, "representation": {"enabled": True},
                "sharing": "frozen", "hierarchical": {"weight": 0.2, "epochs": 1}}
    out = distill(train, evaluation, spec, _cfg(combined), teacher_model=teacher.model)
    res = out.students["feed"]
    assert res.methods == ["kd", "adapter", "representation", "sharing", "hierarchical"]
    bags = teacher.model.inputs.sparse.ebc.embedding_bags
    for key in res.shared_tables:  # frozen: still GEM's rows after training
        assert torch.equal(res.model.tables[key].weight, bags[f"t_{key}"].weight)


def test_adapter_is_fit_on_the_newest_window_only(tables):
    from students.adapter import newest
    from students.distill import fit_adapter

    train, _, _ = tables
    # newest = last 6 hours; every head fit, however few its labels (test_adapter.py: the floor)
    cfg = _cfg({"adapter": {"weight": 0.5, "newest_periods": 1, "min_labels": 1}}, period_days=0.25)
    window_end = (int(train.event_time_us.max()) // (86_400 * 10**6) + 1) * 86_400 * 10**6
    newest_start = window_end - 6 * 3600 * 10**6
    adapter = fit_adapter(train, cfg, STUDENT.get("dense_features", StudentModelConfig().dense_features))
    assert adapter.fit_window["start_us"] >= newest_start
    assert adapter.fit_window["examples"] == len(newest(train, 1, 0.25)) < len(train)
    old = train.event_time_us < newest_start
    flipped = copy.copy(train)
    flipped.labels = train.labels.clone()
    flipped.labels[old] = 1 - flipped.labels[old]  # older labels must not matter
    again = fit_adapter(flipped, cfg, StudentModelConfig().dense_features)
    assert torch.allclose(adapter(train), again(train), equal_nan=True)
    flipped.labels[~old] = 1 - flipped.labels[~old]  # the newest ones do
    changed = fit_adapter(flipped, cfg, StudentModelConfig().dense_features)
    assert not torch.allclose(adapter(train), changed(train), equal_nan=True)


def test_registry_links_student_to_teacher_version(tables, world):
    import mlflow

    from students.registry import log_student, teacher_of

    train, evaluation, spec = tables
    out = distill(train, evaluation, spec, _cfg({"kd": {"weight": 0.5}}, surfaces=["feed"]))
    mlflow.set_tracking_uri(world.tracking_uri)
    mlflow.set_experiment("transfer-tests")
    with mlflow.start_run(run_name="student-feed") as run:
        version = log_student(out.students["feed"], "student-test-feed", train.teacher_version)
    assert teacher_of("student-test-feed", version, world.tracking_uri) == f"models:/{TEACHER_NAME}/1"
    client = mlflow.MlflowClient(world.tracking_uri)
    assert client.get_run(run.info.run_id).data.tags["teacher_version"] == f"models:/{TEACHER_NAME}/1"
    teacher_mv = client.get_model_version(TEACHER_NAME, "1")
    assert teacher_mv.run_id  # the tag resolves to a real registered teacher
    from students.store import load_student

    loaded = load_student(f"models:/student-test-feed/{version}")  # files, digests checked, no pickle
    x = evaluation.subset(evaluation.surface == 0).inputs()
    assert torch.allclose(loaded(x).logits, out.students["feed"].model(x).logits)


def test_serving_scores_a_request_from_the_feast_online_store(tables, world):
    from gem.data.contract import parse_utc
    from gem.features.feast_repo import materialize
    from students.latency import measure, measure_concurrent
    from students.serving import Scorer

    train, evaluation, spec = tables
    out = distill(train, evaluation, spec, _cfg({"representation": {"enabled": True}}, surfaces=["feed"]))
    model = out.students["feed"].model
    end = parse_utc("2026-01-05")
    materialize(world.repo, end)
    scorer = Scorer(model, world.repo, world.features["teacher"], surface="feed")
    user = int(evaluation.user_raw[0])
    items = sorted({int(i) for i in train.item_raw.tolist() if i >= 0})[:20]
    probs = scorer.score(user, items, end)
    assert probs.shape == (20, 2) and bool(((probs > 0) & (probs < 1)).all())
    x = scorer.inputs(user, items, end)
    assert x.teacher_emb is not None and bool(x.teacher_emb[:, :8].abs().sum() > 0)  # user embedding served
    timing = measure(scorer, [user], items, requests=5, candidates=20, now=end, warmup=1)
    assert timing["end_to_end"]["p99_ms"] >= timing["score_only"]["p99_ms"] > 0

    # the peer: the user's rows through the Feast SDK, the same item table: the same inputs
    users = sorted({int(u) for u in evaluation.user_raw.tolist()})[:5]
    sdk = Scorer(model, world.repo, world.features["teacher"], surface="feed", cache_items=True, user_reads="sdk")
    mine = Scorer(model, world.repo, world.features["teacher"], surface="feed", cache_items=True)
    for u in users:
        a, b = mine.inputs(u, items, end), sdk.inputs(u, items, end)
        for name in ("sparse", "history", "dense", "surface", "teacher_emb"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (u, name)
    both = measure_concurrent(lambda: Scorer(model, world.repo, world.features["teacher"], surface="feed",
                                             cache_items=True, user_reads="sdk"),
                              users, items, threads=3, requests=12, candidates=20, now=end, warmup=1)
    assert both["requests"] == 12 and sum(both["per_thread_requests"]) == 12 and both["p99_ms"] > 0

    cached = Scorer(model, world.repo, world.features["teacher"], surface="feed", cache_items=True)
    cached.preload_items(items[:10], end)
    reference = scorer.inputs(user, items, end)
    for order in (items, items[::-1], items[5:7] * 3):
        a, b = scorer.inputs(user, order, end), cached.inputs(user, order, end)
        for name in ("sparse", "history", "dense", "surface", "teacher_emb"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert len(cached._item_row) == len(items)  # the rest was read on first use
    cached._item_emb[:] = 0  # stale table; a refresh reads the online store again
    cached.refresh_items(end)
    assert torch.equal(cached.inputs(user, items, end).teacher_emb, reference.teacher_emb)


def test_online_reader_matches_feast_get_online_features(tables, world):
    """Same values as the SDK for present and absent rows; rows past the view's ttl (30 days)
    read as missing, as offline retrieval has them, where the SDK still serves them."""
    import datetime as dt

    from gem.data.contract import parse_utc
    from gem.features.feast_repo import materialize, open_store
    from students.online import OnlineReader

    train, evaluation, _ = tables
    end = parse_utc("2026-01-05")
    materialize(world.repo, end)
    store = open_store(world.repo)
    views = {"user_attributes": ["country", "device"], "teacher_user_embedding": ["teacher_user_embedding"]}
    reader = OnlineReader(store, views, join_key="user_id")
    users = sorted({int(u) for u in evaluation.user_raw.tolist()})[:15] + [10**9]  # the last one is unknown
    refs = [f"{v}:{f}" for v, fs in views.items() for f in fs]
    expired = 0
    for now in (end, end + dt.timedelta(days=60)):
        sdk = store.get_online_features(features=refs, entity_rows=[{"user_id": u} for u in users]).to_dict()
        for view, features in views.items():
            rows = reader.read(view, users, now)
            for f in features:
                ours = [r[f] if r else None for r in rows]
                if now > end and view == "teacher_user_embedding":
                    expired += sum(v is not None for v in sdk[f])  # the SDK ignores the ttl
                    assert ours == [None] * len(users)
                else:
                    assert ours == sdk[f], (view, f)
    assert expired > 0 and reader.read("user_attributes", [10**9], end) == [None]
    with pytest.raises(KeyError, match="no feature"):
        OnlineReader(store, {"user_attributes": ["nope"]}, join_key="user_id")


def test_distill_cli_registers_students(world, tmp_path):
    import mlflow

    from gem_app.cli import main

    out = tmp_path / "run"
    assert main(["distill", "--train", str(world.features["student"]), "--eval", str(world.features["eval"]),
                 "--repo", str(world.repo), "--out", str(out), "--teacher", world.teacher_uri,
                 "--set", "transfer.kd.weight=0.5",
                 "--set", "surfaces=[feed]", "--set", "optim.epochs=1"]) == 0
    client = mlflow.MlflowClient(f"sqlite:///{(out / 'mlflow.db').resolve()}")
    mv = client.get_model_version("student_feed", "1")
    assert mv.tags["teacher_version"] == f"models:/{TEACHER_NAME}/1" and mv.tags["methods"] == "kd"


def test_teacher_score_is_gems_two_tower_term(tables, teacher):
    from students.model import teacher_score

    train, _, _ = tables
    user, item = train.teacher_emb.chunk(2, dim=1)
    expected = teacher.model.two_tower.score(user, item)
    assert torch.allclose(teacher_score(train.teacher_emb)[:, 0], expected, atol=1e-6)
    assert float(expected.abs().mean()) > 0  # the knowledge carries the term, not zeros


@pytest.mark.parametrize("inputs", ["score", "both"])
def test_student_reads_the_teacher_score(tables, teacher, inputs, tmp_path):
    from students.store import load_student, save_student
    from students.train import predict

    train, evaluation, spec = tables
    rep, width = {"representation": {"enabled": True}}, train.teacher_emb.shape[1]
    base = distill(train, evaluation, spec, _cfg(rep), teacher_model=teacher.model)
    out = distill(train, evaluation, spec, _cfg(rep, student={**STUDENT, "teacher_inputs": inputs}),
                  teacher_model=teacher.model)
    model = out.students["feed"].model
    extra = {"score": 1 - width, "both": 1}[inputs]  # the score replaces or joins the E embedding inputs
    assert model.in_dim - base.students["feed"].model.in_dim == extra
    assert not torch.allclose(_eval_probs(out, evaluation), _eval_probs(base, evaluation))
    feed = evaluation.subset(evaluation.surface == 0)
    assert torch.equal(predict(load_student(save_student(model, tmp_path / "student")), feed), predict(model, feed))


def test_unknown_teacher_inputs_refused():
    from students.model import VerticalStudent

    cfg = from_dict(StudentModelConfig, {**STUDENT, "teacher_inputs": "logits"})
    with pytest.raises(ValueError, match="teacher_inputs"):
        VerticalStudent(cfg, {"item_id": 5, "user_id": 5}, 0, 16)


def test_a_teacher_embedding_dimension_constant_in_training_cannot_drive_the_student_to_certainty(
        tables, teacher, monkeypatch):
    # Ciao, students on the teacher's whole window: dimensions nearly constant over the
    # training rows (std floored at 1e-3) gave holdout rows z-scores of 10^3 and the
    # student probabilities of exactly 0 on clicked rows (holdout NE 2.87)
    import students.model as student_model
    from students.train import predict

    train, evaluation, spec = tables
    flat = copy.copy(train)
    flat.teacher_emb = train.teacher_emb.clone()
    flat.teacher_emb[:, 0] = 0.25  # constant over the training window
    out = distill(flat, evaluation, spec, _cfg({"representation": {"enabled": True}}), teacher_model=teacher.model)
    model = out.students["feed"].model
    assert float(model.emb_std[0]) == pytest.approx(1e-3)
    feed = evaluation.subset(evaluation.surface == 0)
    feed.teacher_emb = feed.teacher_emb.clone()
    feed.teacher_emb[:, 0] = 0.25
    served = predict(model, feed)[:, 0]  # p(click)
    feed.teacher_emb[:, 0] = 0.25 + 10.0  # 10^4 floored standard deviations away
    far = predict(model, feed)[:, 0]
    assert torch.isfinite(far).all() and float(far.min()) > 1e-3 and float(far.max()) < 1 - 1e-3
    assert float((far - served).abs().max()) < 0.5
    monkeypatch.setattr(student_model, "EMB_Z_LIMIT", float("inf"))  # unclipped, as it was
    assert float((predict(model, feed)[:, 0] - served).abs().max()) > float((far - served).abs().max())
