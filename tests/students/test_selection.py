"""Students chosen on validation (issue 43): a validation part by time, a grid searched on
its label loss only, Platt recalibration folded into the served model, and the distill
stage's record of it all (real MLflow, real Feast, the tiny world)."""

from __future__ import annotations

import json
import math

import mlflow
import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from gem.config import from_dict, with_point
from gem_app.stages.context import RunContext
from students.config import DistillConfig
from students.data import attach_knowledge, load_table
from students.selection import binary_ne, recalibrate, select, teacher_ne, validation_split
from students.train import predict

STUDENT = {"embedding_dim": 8, "history_len": 4, "mlp_hidden": [16, 8]}


@pytest.fixture(scope="module")
def tables(world):
    cfg = from_dict(DistillConfig, {"student": STUDENT})
    train, spec = load_table(world.features["student"], cfg.student)
    holdout, _ = load_table(world.features["eval"], cfg.student)
    return attach_knowledge(train, world.repo), attach_knowledge(holdout, world.repo), spec


def _cfg(**extra) -> DistillConfig:
    return from_dict(DistillConfig, {"student": STUDENT, "optim": {"epochs": 3, "batch_size": 64, "patience": 1},
                                     "surfaces": ["feed"], "transfer": {"kd": {"weight": 0.5}}, **extra})


def _distill_feed(world, tmp_path, run_id: str, overrides: list[str], fresh_from: str = ""):
    """The distill stage on the tiny world's feed surface (real MLflow, real Feast), tracked
    under ``tmp_path``; returns its result."""
    from gem_app.stages.distill import distill

    ctx = RunContext(pipeline_run_id=run_id, tracking_root=str(tmp_path))
    try:
        return distill("feed", str(world.features["student"]), str(world.features["eval"]), str(world.repo),
                       world.teacher_uri, str(tmp_path / "students"), ctx, preset="default", overrides=overrides,
                       fresh_from=fresh_from)
    finally:
        mlflow.set_tracking_uri("")


def test_validation_is_the_newest_share_by_time(tables):
    train, _, _ = tables
    fit, valid = validation_split(train, 0.25)
    assert len(fit) + len(valid) == len(train)
    assert int(fit.event_time_us.max()) < int(valid.event_time_us.min())  # strictly after, one cut
    assert 0.15 < len(valid) / len(train) < 0.35
    assert fit.window_us[1] == valid.window_us[0]
    with pytest.raises(ValueError, match="share"):
        validation_split(train, 1.0)


def test_validation_keeps_to_the_fresh_rows_of_a_window_that_overlaps_the_teachers(tables):
    """``--student-overlap-days``: the rows before the teacher's end (``fresh_from``) always
    train; validation is the newest share of the rows after it."""
    from students.protocol import iso, to_us

    train, _, _ = tables
    times = np.sort(train.event_time_us.numpy())
    fresh_from = iso(int(times[len(times) // 2]))  # the older half plays the teacher's last days
    fit, valid = validation_split(train, 0.25, fresh_from=fresh_from)
    fresh = int((train.event_time_us >= to_us(fresh_from)).sum())
    assert len(fit) + len(valid) == len(train)
    assert int(valid.event_time_us.min()) >= to_us(fresh_from)
    assert 0.15 < len(valid) / fresh < 0.35  # a share of the fresh rows, not of the whole window
    assert len(valid) < len(validation_split(train, 0.25)[1])


def test_with_point_applies_dotted_overrides_and_checks_them():
    cfg = with_point(_cfg(), {"optim.lr": 0.001, "transfer.kd.weight": 0.3})
    assert cfg.optim.lr == 0.001 and cfg.transfer.kd.weight == 0.3 and cfg.optim.epochs == 3
    with pytest.raises(ValueError, match="lr"):
        with_point(_cfg(), {"optim.lr": -1.0})


def test_the_grid_is_chosen_on_validation_loss_alone(tables):
    train, holdout, spec = tables
    fit, valid = validation_split(train, 0.25)
    grid = [{"optim.lr": 1e-6}, {"optim.lr": 0.01}]  # a learning rate that cannot move against one that can
    chosen = select(fit, valid, holdout, spec, _cfg(), "feed", grid)
    losses = [t["valid_loss"] for t in chosen.trials]
    assert [t["point"] for t in chosen.trials] == grid
    assert chosen.point == grid[int(np.argmin(losses))]
    assert all(np.isfinite(t["valid_auc"]) and t["epochs_run"] >= 1 for t in chosen.trials)
    assert chosen.result.eval_probs is not None  # the holdout is scored, never read to choose
    assert "validation" in chosen.windows and "adapter_fit" not in chosen.windows


def test_refit_retrains_the_chosen_point_on_every_row(tables):
    from students.selection import refit

    train, holdout, spec = tables
    fit, valid = validation_split(train, 0.25)
    chosen = select(fit, valid, holdout, spec, _cfg(), "feed", [{}, {"optim.lr": 0.01}])
    rows = int((train.surface == list(train.surfaces).index("feed")).sum())
    assert chosen.result.train_examples < rows
    done = refit(chosen, train, holdout, spec, "feed")
    best = chosen.trials[[t["point"] for t in chosen.trials].index(chosen.point)]
    assert done["epochs"] == best["best_epoch"] + 1 and chosen.result.train_examples == rows == done["rows"]
    assert len(chosen.result.train_loss) == done["epochs"] and "validation" not in chosen.windows


def test_a_student_worse_than_the_base_rate_is_recalibrated_into_the_served_model(tables):
    train, holdout, spec = tables
    fit, valid = validation_split(train, 0.25)
    chosen = select(fit, valid, holdout, spec, _cfg(), "feed", [{}])
    model = chosen.result.model
    with torch.no_grad():  # break its calibration: every click probability far too high
        model.out.bias[0] += 4.0
    part = valid.subset(valid.surface == list(valid.surfaces).index("feed"))
    labels = part.labels[:, 0].numpy()
    assert binary_ne(labels, predict(model, part)[:, 0].numpy()) >= 1.0
    before_holdout = chosen.result.eval_probs.clone()
    info = recalibrate(chosen, valid, holdout, "feed", teacher_valid_ne=0.9)
    assert info["applied"] and info["valid_ne_after"] < 1.0 <= info["valid_ne_before"]
    # folded into the model itself: what the registry serves is the recalibrated student
    assert binary_ne(labels, predict(model, part)[:, 0].numpy()) == pytest.approx(info["valid_ne_after"], rel=1e-4)
    assert not torch.allclose(chosen.result.eval_probs, before_holdout)
    assert math.isfinite(chosen.result.metrics["ne/click"])
    # a teacher no better than the base rate is no reason to recalibrate
    again = select(fit, valid, holdout, spec, _cfg(), "feed", [{}])
    with torch.no_grad():
        again.result.model.out.bias[0] += 4.0
    assert not recalibrate(again, valid, holdout, "feed", teacher_valid_ne=1.2)["applied"]
    assert math.isfinite(teacher_ne(valid, "feed"))


def test_the_distill_stage_selects_records_and_compares_with_the_teacher(world, tmp_path):
    from gem_app.stages.distill import distill

    ctx = RunContext(pipeline_run_id="select-test", tracking_root=str(tmp_path))
    overrides = ["transfer.kd.weight=0.5", "transfer.representation.enabled=true", "optim.epochs=2",
                 "optim.batch_size=64", "optim.patience=1", "student.history_len=4",
                 "selection.validation_share=0.25",
                 "selection.grid=[{optim.lr: 0.003}, {transfer.kd.weight: 0.8}]",
                 "selection.no_teacher_grid=[{optim.lr: 0.003}, {optim.weight_decay: 0.3}]"]
    try:
        result = distill("feed", str(world.features["student"]), str(world.features["eval"]), str(world.repo),
                         world.teacher_uri, str(tmp_path / "students"), ctx, preset="default", overrides=overrides)
        assert result.selection["student"]["points"] == result.selection["no_teacher"]["points"] == 2
        assert result.selection["student"]["point"] in ({"optim.lr": 0.003}, {"transfer.kd.weight": 0.8})
        vs = result.vs_teacher
        assert vs["auc_lo"] <= vs["auc"] <= vs["auc_hi"] and vs["ne_lo"] <= vs["ne"] <= vs["ne_hi"]
        assert set(result.metrics["teacher"]) == {"auc", "ne"}
        client = MlflowClient(ctx.configure())
        runs = mlflow.search_runs(search_all_experiments=True, filter_string="params.`select.student.chosen` != ''",
                                  output_format="list")
        assert runs, "the distill run records its chosen point"
        run = runs[0]
        assert json.loads(run.data.params["select.student.chosen"]) == result.selection["student"]["point"]
        history = client.get_metric_history(run.info.run_id, "select/student/valid_loss")
        assert [m.step for m in history] == [0, 1]
        assert run.data.tags["select.student.recalibrated"] in ("true", "false")
        for key in ("eval/vs_teacher/auc", "eval/vs_teacher/auc_lo", "eval/teacher/auc"):
            assert key in run.data.metrics, key
        # refit on the whole student window for the chosen epochs (a recalibrated student is kept as validated)
        if run.data.tags["select.student.recalibrated"] == "false":
            assert 1 <= run.data.metrics["select/student/refit_epochs"] <= 2, run.data.metrics
            assert result.selection["student"]["refit"]["epochs"] >= 1
        else:
            assert "select/student/refit_epochs" not in run.data.metrics
    finally:
        mlflow.set_tracking_uri("")


def test_the_distill_stage_validates_on_the_rows_after_the_teachers_end(world, tmp_path, monkeypatch):
    """A student window that overlaps the teacher's (``fresh_from``, from the distill plan):
    the stage's validation part holds only rows from then on, and the recorded student is
    keyed on it (a run without it is another student)."""
    import students.selection as selection
    from gem_app.stages.distill import reuse_key
    from students.protocol import iso, to_us

    seen = []

    def spy(table, share, fresh_from=""):
        fit, valid = split(table, share, fresh_from=fresh_from)
        seen.append((fresh_from, int(valid.event_time_us.min())))
        return fit, valid

    split = selection.validation_split
    monkeypatch.setattr(selection, "validation_split", spy)
    train, _ = load_table(world.features["student"], from_dict(DistillConfig, {"student": STUDENT}).student)
    times = np.sort(train.event_time_us.numpy())
    fresh_from = iso(int(times[int(len(times) * 0.6)]))
    overrides = ["optim.epochs=1", "optim.batch_size=64", "student.history_len=4", "selection.validation_share=0.25",
                 "selection.grid=[{}]", "selection.no_teacher_grid=[{}]", "selection.calibrate=false"]
    result = _distill_feed(world, tmp_path, "fresh-test", overrides, fresh_from)
    # selection.older_rows' default: the grid on every row, the teacher's days among them
    assert result.selection["student"]["rows"] == result.selection["no_teacher"]["rows"] == "all"
    assert result.selection["student"]["points"] == 1
    feed = train.surface == list(train.surfaces).index("feed")
    assert result.selection["student"]["refit"]["rows"] == int(feed.sum())  # refit on the whole window
    assert seen and seen[0][0] == fresh_from and seen[0][1] >= to_us(fresh_from)
    assert seen[0][1] > int(split(train, 0.25)[1].event_time_us.min())  # later than the plain newest share
    cfg = from_dict(DistillConfig, {"student": STUDENT})
    args = (cfg, "feed", str(world.features["student"]), str(world.features["eval"]), str(world.repo), "t")
    assert reuse_key(*args, fresh_from) != reuse_key(*args) == reuse_key(*args, "")


def test_platt_recalibration_never_inverts_the_student_s_ranking():
    # issue 43: on MovieLens-1M an unconstrained Platt fit on a small validation part gave
    # a = -8.9, and the recalibrated student ranked its holdout at 0.28 instead of 0.72
    from students.selection import platt

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(300, generator=gen)
    against = (torch.rand(300, generator=gen) < torch.sigmoid(-2 * logits)).float()  # labels against the logits
    a, b = platt(logits, against)
    assert a > 0 and a < 0.05  # the best monotone map is nearly flat: the base rate, ranking kept
    assert abs(float(torch.sigmoid(a * logits + b).mean()) - float(against.mean())) < 0.02
    shifted = (torch.rand(300, generator=gen) < torch.sigmoid(logits - 2)).float()  # ranks well, too high
    a, b = platt(logits, shifted)
    assert 0.5 < a < 2.0 and b < -1.0  # a plain recalibration where the ranking holds


def _surface_model(fit, spec):
    from students.distill import build_student

    cfg = from_dict(DistillConfig, {"student": STUDENT}).student
    return build_student(cfg, spec, fit, representation=False, seed=3)


def test_validation_checked_inside_an_epoch_keeps_the_best_check_and_stops_by_epochs(tables):
    """optim.check_rows: validation is also read every that many rows inside an epoch; the
    weights of the best check are kept (their validation loss is the recorded one), the
    record says how many epochs' rows they had trained, patience still counts epochs, and
    a table no larger than check_rows trains exactly as with checks at epoch ends only."""
    from dataclasses import replace

    from students.config import OptimConfig
    from students.train import label_loss, train_student

    train, _, spec = tables
    fit, valid = validation_split(train, 0.25)
    base = OptimConfig(lr=0.01, batch_size=64, epochs=3, patience=1)

    fine = _surface_model(fit, spec)
    train_student(fine, fit, replace(base, check_rows=64), seed=1, valid=valid)
    sel = fine.selection
    assert label_loss(fine, valid) == pytest.approx(sel["valid_loss"])
    assert 0 < sel["best_epochs"] <= 3 and sel["best_epoch"] == math.ceil(sel["best_epochs"]) - 1
    assert sel["epochs_run"] <= min(3, math.ceil(sel["best_epochs"]) + 1)  # stopped one epoch's rows after the best
    assert sel["checks"] > sel["epochs_run"] + 1 and len(fit) > 2 * 64  # read inside the epochs too

    coarse, same = _surface_model(fit, spec), _surface_model(fit, spec)
    train_student(coarse, fit, base, seed=1, valid=valid)
    train_student(same, fit, replace(base, check_rows=len(fit)), seed=1, valid=valid)
    assert coarse.selection["best_epochs"] == coarse.selection["best_epoch"] + 1
    assert coarse.selection["checks"] == coarse.selection["epochs_run"]
    assert same.selection == coarse.selection
    for a, b in zip(coarse.state_dict().values(), same.state_dict().values()):
        assert torch.equal(a, b)


def test_stop_epochs_trains_that_many_epochs_rows(tables, monkeypatch):
    """A refit of a point chosen mid-epoch: optim.stop_epochs = 1.5 runs one epoch and half
    of the next; a whole number runs as that many epochs."""
    from dataclasses import replace

    import students.train as train_mod
    from students.config import OptimConfig

    train, _, spec = tables
    fit, _ = validation_split(train, 0.25)
    rows, real = [], train_mod.distill_loss

    def counting(out, labels, terms):
        rows.append(len(labels))
        return real(out, labels, terms)

    monkeypatch.setattr(train_mod, "distill_loss", counting)
    base = OptimConfig(lr=0.01, batch_size=64, epochs=2)
    half = _surface_model(fit, spec)
    assert len(train_mod.train_student(half, fit, replace(base, stop_epochs=1.5), seed=1)) == 2
    assert sum(rows) == pytest.approx(1.5 * len(fit), abs=64)
    rows.clear()
    whole, plain = _surface_model(fit, spec), _surface_model(fit, spec)
    train_mod.train_student(whole, fit, replace(base, stop_epochs=2.0), seed=1)
    assert sum(rows) == 2 * len(fit)
    train_mod.train_student(plain, fit, base, seed=1)
    for a, b in zip(whole.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)


def test_a_point_best_within_its_first_epoch_is_refit_for_that_share_of_the_rows(tables, monkeypatch):
    """On a table of 10^5 rows a surface validation is often best a fifth of the way into
    the first epoch (optim.check_rows); the refit trains that share of the whole window's
    rows, not a whole epoch (it trained at least one, 3-6x what validation chose, on the
    MovieLens-1M window that reaches the teacher's first day)."""
    import students.train as train_mod
    from students.selection import refit

    train, holdout, spec = tables
    fit, valid = validation_split(train, 0.25)
    chosen = select(fit, valid, holdout, spec, _cfg(), "feed", [{}])
    chosen.result.selection["best_epochs"] = 0.25
    rows, real = [], train_mod.distill_loss

    def counting(out, labels, terms):
        rows.append(len(labels))
        return real(out, labels, terms)

    monkeypatch.setattr(train_mod, "distill_loss", counting)
    done = refit(chosen, train, holdout, spec, "feed")
    assert done["epochs"] == 0.25
    assert sum(rows) == pytest.approx(0.25 * done["rows"], abs=_cfg().optim.batch_size)


def _older_and_fresh(tables):
    from students.protocol import iso

    train, holdout, spec = tables
    times = np.sort(train.event_time_us.numpy())
    fresh_from = iso(int(times[len(times) // 2]))  # the older half plays the teacher's last days
    fit, valid = validation_split(train, 0.25, fresh_from=fresh_from)
    return fit, valid, holdout, spec, fresh_from


@pytest.mark.parametrize("older", ["useful", "inverted"])
def test_the_teachers_days_stay_among_the_rows_only_where_validation_says_so(tables, older):
    """``selection.older_rows: choose``: the point chosen on the fresh rows trains again on
    every row, and the teacher's days are kept where that lowers the validation loss. Older
    rows with their labels (and the teacher's logits) inverted teach the opposite of the
    fresh ones, and validation refuses them."""
    from students.data import split_at
    from students.protocol import to_us
    from students.selection import with_older_rows

    fit, valid, holdout, spec, fresh_from = _older_and_fresh(tables)
    fresh = split_at(fit, to_us(fresh_from))[1]
    if older == "inverted":
        before = fit.event_time_us < to_us(fresh_from)
        fit = fit.subset(torch.arange(len(fit)))  # a copy
        fit.labels[before] = 1.0 - fit.labels[before]
        fit.labels[before, 1] = 0.0  # no conversion without a click
        fit.teacher_logits[before] = -fit.teacher_logits[before]
    chosen = select(fresh, valid, holdout, spec, _cfg(), "feed", [{}])
    fresh_loss, fresh_rows = chosen.trials[0]["valid_loss"], chosen.result.train_examples
    kept = with_older_rows(chosen, fit, valid, holdout, spec, "feed")
    trial = chosen.trials[-1]
    assert len(chosen.trials) == 2 and trial["rows"] == "all" and trial["point"] == chosen.point
    assert kept == (trial["valid_loss"] < fresh_loss) and chosen.rows == ("all" if kept else "fresh")
    assert kept == (older == "useful"), chosen.trials
    assert (chosen.result.train_examples > fresh_rows) == kept  # the winner's own rows


def test_the_distill_stage_searches_the_grid_on_the_fresh_rows_and_records_the_rows_it_chose(world, tmp_path):
    from gem_app.stages.distill import distill

    fit, _, _, _, fresh_from = _older_and_fresh(
        (load_table(world.features["student"], from_dict(DistillConfig, {"student": STUDENT}).student)[0], None, None))
    ctx = RunContext(pipeline_run_id="rows-test", tracking_root=str(tmp_path))
    overrides = ["optim.epochs=1", "optim.batch_size=64", "student.history_len=4", "selection.validation_share=0.25",
                 "selection.grid=[{}, {optim.lr: 0.01}]", "selection.no_teacher_grid=[{}, {optim.lr: 0.01}]",
                 "selection.older_rows=choose"]
    try:
        result = distill("feed", str(world.features["student"]), str(world.features["eval"]), str(world.repo),
                         world.teacher_uri, str(tmp_path / "students"), ctx, preset="default", overrides=overrides,
                         fresh_from=fresh_from)
        run = mlflow.search_runs(search_all_experiments=True, filter_string="params.`select.student.rows` != ''",
                                 output_format="list")[0]
        history = MlflowClient(ctx.configure()).get_metric_history(run.info.run_id, "select/student/valid_loss")
    finally:
        mlflow.set_tracking_uri("")
    for who in ("student", "no_teacher"):
        chose = result.selection[who]
        assert chose["points"] == 3 and chose["rows"] in ("all", "fresh")  # the grid, then the winner on every row
        assert run.data.params[f"select.{who}.rows"] == chose["rows"]
    assert [m.step for m in history] == [0, 1, 2]


def test_older_rows_fresh_never_trains_on_the_teachers_days(world, tmp_path):
    """``selection.older_rows: fresh``: the grid and the refit keep to the rows after the
    teacher's end, however far back the student window reaches."""
    from students.protocol import to_us

    train, _ = load_table(world.features["student"], from_dict(DistillConfig, {"student": STUDENT}).student)
    fresh_from = _older_and_fresh((train, None, None))[-1]
    overrides = ["optim.epochs=1", "optim.batch_size=64", "student.history_len=4", "selection.validation_share=0.25",
                 "selection.grid=[{}]", "selection.no_teacher_grid=[{}]", "selection.calibrate=false",
                 "selection.older_rows=fresh"]
    result = _distill_feed(world, tmp_path, "fresh-rows-test", overrides, fresh_from)
    feed = train.surface == list(train.surfaces).index("feed")
    fresh = int((feed & (train.event_time_us >= to_us(fresh_from))).sum())
    assert 0 < fresh < int(feed.sum())
    for who in ("student", "no_teacher"):
        chose = result.selection[who]
        assert chose["rows"] == "fresh" and chose["points"] == 1 and chose["refit"]["rows"] == fresh
