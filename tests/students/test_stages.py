"""The pipeline's distill and gate stages on the tiny world (real MLflow, real Feast):
reuse only for the same inputs, a new teacher retrains, lineage on every student, and
the paired gate's evidence and refusals."""

from __future__ import annotations

import mlflow
import pytest
from mlflow import MlflowClient

from gem import registry
from gem_app.stages.context import RunContext
from tests.students.fixtures import TEACHER_NAME

OVERRIDES = ["transfer.kd.weight=0.5", "transfer.representation.enabled=true", "optim.epochs=1",
             "optim.batch_size=64", "student.history_len=4"]


@pytest.fixture(scope="module")
def stage_run(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    ctx = RunContext(pipeline_run_id="stage-test", tracking_root=str(root))
    yield root, ctx
    mlflow.set_tracking_uri("")


def _distill(world, root, ctx, repo=None, teacher_uri=None):
    from gem_app.stages.distill import distill

    return distill("feed", str(world.features["student"]), str(world.features["eval"]), str(repo or world.repo),
                   teacher_uri or world.teacher_uri, str(root / "students"), ctx, preset="default",
                   overrides=OVERRIDES)


def test_reuse_needs_the_same_inputs_and_a_new_teacher_retrains(world, stage_run, tmp_path):
    from gem.knowledge import generate_knowledge, prepare_repo, register_knowledge

    root, ctx = stage_run
    first = _distill(world, root, ctx)
    assert first.version == "1" and first.teacher_version == f"models:/{TEACHER_NAME}/1"
    assert _distill(world, root, ctx).version == "1"  # same inputs: reused, nothing registered again
    client = MlflowClient(ctx.configure())
    tags = client.get_model_version("student_feed", "1").tags
    for key in ("teacher_version", "teacher_window", "knowledge_window", "knowledge_cadence", "train_window",
                "validation_window", "adapter_fit_window", "evaluation_window"):
        assert f"lineage.{key}" in tags, key
    assert tags["lineage.knowledge_cadence"] == "1d" and tags["lineage.evaluation_window"].startswith("2026-01-04")
    assert tags["lineage.knowledge_window"].startswith("2026-01-01")  # from the teacher's last day on

    # a new teacher (another registered version) writes its own knowledge: the students retrain
    mlflow.set_tracking_uri(world.tracking_uri)
    source = MlflowClient(world.tracking_uri).get_model_version(TEACHER_NAME, "1").source
    new = mlflow.register_model(source, TEACHER_NAME).version
    new_uri = f"models:/{TEACHER_NAME}/{new}"
    dirs = [tmp_path / f"k_{w}" for w in ("teacher", "student", "eval")]
    for window, folder in zip(("teacher", "student", "eval"), dirs):
        generate_knowledge(new_uri, world.features[window], folder, tracking_uri=world.tracking_uri)
    repo = prepare_repo(tmp_path / "feast", world.data)
    register_knowledge(repo, dirs)
    ctx.configure()
    second = _distill(world, root, ctx, repo=repo, teacher_uri=new_uri)
    assert second.version == "2" and second.teacher_version == new_uri


def test_paired_gate_reads_the_no_teacher_evidence_and_refuses_a_tie(world, stage_run):
    from gem_app.promotion import GateConfig, apply_decision, decision_from_dict
    from gem_app.stages.gate import gate

    root, ctx = stage_run
    version = _distill(world, root, ctx).version
    cfg = GateConfig(bootstrap=200)
    first = gate("feed", version, str(world.features["eval"]), str(world.repo), ctx, cfg, preset="default")
    verdict = first["surfaces"][0]
    assert "vs no_teacher" in verdict["reason"] and "no predictions" not in verdict["reason"]
    assert "vs_no_teacher_auc_lift_lo" in verdict["challenger"] and not first["champion_version"]
    # make it champion by hand, then gate the same model again: a tie never passes
    ctx.configure()
    MlflowClient().set_registered_model_alias("student_feed", registry.CHAMPION, version)
    tie = decision_from_dict(gate("feed", version, str(world.features["eval"]), str(world.repo), ctx, cfg,
                                  preset="default"))
    assert not tie.promote and "vs champion: lose" in tie.surfaces[0].reason
    assert tie.surfaces[0].challenger["vs_champion_auc_lift"] == 0.0
    assert not apply_decision(tie).promote
