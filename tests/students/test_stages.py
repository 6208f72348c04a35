"""The pipeline's distill and gate stages on the tiny world (real MLflow, real Feast):
reuse only for the same inputs, a new teacher retrains, lineage on every student, and
the paired gate's evidence and refusals."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
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
    for key in ("lineage.knowledge_window", "lineage.evaluation_window", "lineage.train_window"):
        assert ".." in tags[key] and "/" not in tags[key], tags[key]  # one spelling of a window everywhere

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
    # the tiny world's holdout is small: lower the evidence floor to reach the comparisons
    cfg = GateConfig(bootstrap=200, min_positives=1, min_negatives=1)
    first = gate("feed", version, str(world.features["eval"]), str(world.repo), ctx, cfg, preset="default")
    verdict = first.decision["surfaces"][0]
    assert "no predictions" not in verdict["reason"] and "vs_no_teacher_auc_lift_lo" in verdict["challenger"]
    assert not first.decision["champion_version"] and first.roc["fpr"]
    # its teacher lives in another registry: never the champion here, so never promoted
    assert first.decision["outcome"] == "keep" and "teacher gem-teacher-test" in first.decision["reason"]
    run = MlflowClient().get_run(first.decision["gate_run_id"])
    assert run.data.tags["mlflow.note.content"] == f"keep: {first.decision['reason']}"
    assert run.data.params["gate.min_positives"] == "1" and run.data.tags["gem.model"] == "student_feed"
    assert {"holdout/positives", "challenger/auc", "no_teacher/auc", "vs_no_teacher/auc_lift_lo"} <= set(
        run.data.metrics)
    # the same weights as a second version, gated against the first made champion: a tie never passes
    ctx.configure()
    client = MlflowClient()
    client.set_registered_model_alias("student_feed", registry.CHAMPION, version)
    twin = mlflow.register_model(client.get_model_version("student_feed", version).source, "student_feed").version
    tie = decision_from_dict(gate("feed", str(twin), str(world.features["eval"]), str(world.repo), ctx, cfg,
                                  preset="default").decision)
    assert not tie.promote and "vs champion: AUC lift +0.0000" in tie.surfaces[0].reason
    assert tie.surfaces[0].challenger["vs_champion_auc_lift"] == 0.0
    assert not apply_decision(tie).promote
    client.delete_registered_model_alias("student_feed", registry.CHAMPION)


def test_a_champion_student_loads_through_mlflow_pyfunc_and_scores_a_window(world, stage_run):
    """models:/student_feed@champion loads with mlflow.pyfunc (signature, input example,
    the weights digest-checked and read weights-only: an altered file is refused) and
    scores a features window as the gate does."""
    from gem.model.store import ModelStoreError
    from gem_app.promotion import PROMOTE, GateDecision, apply_decision
    from gem_app.stages.gate import holdout_predictions

    root, ctx = stage_run
    version = _distill(world, root, ctx).version
    ctx.configure()
    applied = apply_decision(GateDecision("student_feed", version, None, PROMOTE, "promoted by the test"))
    assert applied.promote
    model = mlflow.pyfunc.load_model("models:/student_feed@champion")
    inputs = model.metadata.get_input_schema().input_names()
    assert inputs == ["features", "feast_repo"] and "p_click" in model.metadata.get_output_schema().input_names()
    assert model.input_example is not None  # logged with an example, which MLflow scored once
    preds = model.predict(pd.DataFrame({"features": [str(world.features["eval"])], "feast_repo": [str(world.repo)]}))
    part, probs = holdout_predictions({"c": "models:/student_feed@champion"}, "feed", str(world.features["eval"]),
                                      str(world.repo), "default")
    assert len(preds) == len(part) > 0 and set(preds["surface"]) == {"feed"}
    assert np.allclose(preds["p_click"].to_numpy(), probs["c"], atol=1e-6)
    assert (preds["example_id"].to_numpy() == part.example_id.numpy()).all()
    client = MlflowClient()
    assert "mlflow.pyfunc.load_model" in client.get_registered_model("student_feed").description
    assert client.get_model_version("student_feed", version).tags["gate.decision"] == PROMOTE
    # the stored weights altered: loading refuses them (digest), nothing is unpickled
    mv = client.get_model_version("student_feed", version)
    stored = Path(mlflow.get_logged_model(mv.source.removeprefix("models:/")).artifact_location.removeprefix("file://"))
    weights = next(stored.rglob("weights.pt"))
    original = weights.read_bytes()
    try:
        weights.write_bytes(original[:-8] + bytes(8))
        with pytest.raises(ModelStoreError, match="does not match digests.json"):
            mlflow.pyfunc.load_model(f"models:/student_feed/{version}")
    finally:
        weights.write_bytes(original)
