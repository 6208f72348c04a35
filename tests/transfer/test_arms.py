"""Model selection in the benchmark (benchmarks/transfer/arms.py) on the tiny world: the
grid point is chosen on the validation slice, the evaluation window cannot move it, and
the other seeds rerun the chosen point; capacity-matched baselines are as wide as the
arm they match."""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks.transfer.arms import ArmConfig, run_arm
from gem.config import from_dict
from gem.data.contract import parse_utc
from students.config import StudentModelConfig
from students.data import attach_knowledge, load_table, split_at

STUDENT = {"embedding_dim": 8, "history_len": 4, "mlp_hidden": [16]}
BASE = {"student": STUDENT, "optim": {"epochs": 2, "patience": 1, "batch_size": 64}, "surfaces": ["feed", "video"]}


@pytest.fixture(scope="module")
def tables(world):
    cfg = from_dict(StudentModelConfig, STUDENT)
    student, spec = load_table(world.features["student"], cfg)
    evaluation, _ = load_table(world.features["eval"], cfg)
    train, valid = split_at(student, int(parse_utc("2026-01-03T18:00:00+00:00").timestamp() * 1e6))
    parts = {"train": train, "validation": valid, "evaluation": evaluation}
    return {k: attach_knowledge(t, world.repo) for k, t in parts.items()}, spec


def test_the_grid_point_is_chosen_on_validation_and_the_evaluation_window_cannot_move_it(tables):
    parts, spec = tables
    arms = {"no_teacher": ArmConfig(), "kd": ArmConfig(transfer={"kd": {"weight": 0.5}}, grid=[
        {"transfer.kd.weight": 0.2, "transfer.kd.temperature": 1.0},
        {"transfer.kd.weight": 0.8, "transfer.kd.temperature": 2.0}])}
    result = run_arm("kd", arms["kd"], arms, parts, spec, BASE, [0, 1], teacher_id="t0")
    losses = [t["valid_loss"] for t in result.trials]
    assert result.point == result.trials[losses.index(min(losses))]["point"]
    assert set(result.runs) == {0, 1} and set(result.runs[1]) == {"feed", "video"}
    flipped = copy.copy(parts["evaluation"])
    flipped.labels = 1 - parts["evaluation"].labels  # any use of evaluation labels would change the choice
    again = run_arm("kd", arms["kd"], arms, {**parts, "evaluation": flipped}, spec, BASE, [0, 1], teacher_id="t0")
    assert again.point == result.point and again.trials == result.trials
    a, b = result.runs[1]["feed"], again.runs[1]["feed"]
    assert torch.equal(torch.from_numpy(a.probs), torch.from_numpy(b.probs))  # the same students


def test_capacity_matched_baseline_is_as_wide_as_the_arm(tables):
    parts, spec = tables
    arms = {"no_teacher": ArmConfig(), "representation": ArmConfig(transfer={"representation": {"enabled": True}}),
            "nt_representation": ArmConfig(capacity_of="representation")}
    width = int(parts["train"].teacher_emb.shape[1])
    rep = run_arm("representation", arms["representation"], arms, parts, spec, BASE, [0], teacher_id="t0",
                  teacher_dims=(width, 16))
    matched = run_arm("nt_representation", arms["nt_representation"], arms, parts, spec, BASE, [0],
                      teacher_dims=(width, 16))
    plain = run_arm("no_teacher", arms["no_teacher"], arms, parts, spec, BASE, [0])
    r, m, p = (x.runs[0]["feed"].size for x in (rep, matched, plain))
    assert r["teacher_emb_dim"] == width and m["extra_id_dim"] * 2 == width and m["teacher_emb_dim"] == 0
    assert p["extra_id_dim"] == 0 and m["parameters"] > p["parameters"]


def test_a_world_trains_students_only_on_its_student_surfaces_and_a_cut_world_on_the_newest_rows(tables):
    """benchmarks/transfer/experiment.run_arms: the teacher-only surfaces get no student and
    no figure; a row-cut world trains on each surface's newest rows with the same teacher."""
    import math

    from benchmarks.transfer.experiment import ExperimentConfig, PreparedWorld, run_arms
    from benchmarks.transfer.worlds import DatasetConfig, TeacherRun, World
    from students.config import OptimConfig

    parts, spec = tables
    arms = {"no_teacher": ArmConfig(), "kd": ArmConfig(transfer={"kd": {"weight": 0.5}})}
    cfg = ExperimentConfig(arms=arms, student=from_dict(StudentModelConfig, STUDENT), bootstrap=50,
                           optim=from_dict(OptimConfig, BASE["optim"]))
    world = World("gap0", 0, {}, {}, teachers=[TeacherRun("t0", 0, "uri", "1", None)])
    prepared = PreparedWorld(world, spec, parts, {"t0": {"1d": parts}}, {"t0": {}}, (0, 0), ["video"],
                             {"feed": "too few"})
    ds = DatasetConfig(name="tiny", source="simulator")
    full = run_arms(ds, cfg, prepared, ["no_teacher", "kd"], [0], headline=False)
    assert {s for runs in full.evidence.runs.values() for ran in runs.values() for s in ran} == {"video"}
    assert set(full.evidence.runs["kd"]) == {("t0", 0)} and full.surfaces == ["video"]
    cut = run_arms(ds, cfg, prepared.cut("rows30", 0.3), ["no_teacher", "kd"], [0], headline=False)
    rows = full.examples_by_surface["train"]
    assert cut.examples_by_surface["train"] == {s: math.ceil(0.3 * n) if n else 0 for s, n in rows.items()}
    assert cut.examples["evaluation"] == full.examples["evaluation"] and cut.world.name == "rows30"
    assert set(cut.evidence.runs["kd"]) == {("t0", 0)} and full.world.name == "gap0"
