"""train: pretrain GEM on the teacher window (or continue the champion's weights) and
register it as ``gem_teacher`` (an MLflow pyfunc model, gem/training/pyfunc.py) with its
data lineage and a description that says what it is and how to load it. Its gate is
the next step (gem_app/stages/gate.py ``gate_teacher``).

The launcher runs training in this process, under torchrun here, or as a Kubeflow
Trainer TrainJob. Killed mid-way and rerun, the stage resumes the same MLflow run from
the last checkpoint; rerun after it finished with the same inputs, it returns the
recorded result.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from gem import registry, tracking
from gem.training.eval_predictions import EVAL_PREDICTIONS
from gem.training.tracking import MODEL_NAME_TAG
from gem.utils.evidence import auc_text
from gem.utils.paths import shown
from gem.utils.progress import figure
from gem_app.stages.context import Reuse, RunContext, StageResult, fault_point, record_path
from gem_app.stages.features import features_lineage


@dataclass(kw_only=True)
class TrainResult(StageResult):
    run_id: str
    model_version: str
    model_uri: str
    metrics: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    # the holdout predictions the training run kept (gem.training.eval_predictions): its gate
    # reads them instead of scoring the same weights again when the digests match; "" if none
    eval_predictions: str = ""


def _run_id(out_dir: Path, key: dict, ctx: RunContext, window: str, digest: str, init_from: str) -> str:
    """The MLflow run of this training (created once per key, resumed after a kill)."""
    import mlflow

    started = Reuse(record_path(out_dir, "train-run"), key)
    if record := started.get():
        return record["run_id"]
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(ctx.experiment)
    run_id = client.create_run(experiment.experiment_id, run_name="train", tags={
        **tracking.source_tags(), "mlflow.parentRunId": ctx.parent_run_id,
        tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id, tracking.TAG_STAGE: "train", tracking.TAG_DATA_WINDOW: window,
        tracking.TAG_DATA_DIGEST: digest, MODEL_NAME_TAG: registry.TEACHER_MODEL,
        **({"gem.init_from": init_from} if init_from else {})}).info.run_id
    started.put({"run_id": run_id})
    return run_id


def _log_inputs(run_id: str, init_from: str) -> None:
    """The starting weights as the run's model input (the trainer logs the features
    windows as its datasets)."""
    from gem_app.stages.context import log_model_input

    if init_from:
        log_model_input(init_from, run_id)


def _log_holdout(run_id: str, metrics: dict[str, float]) -> None:
    """The teacher's holdout figures (click, every surface) under the names every model's
    run shares (gem.tracking.HOLDOUT_FIGURES), tagged as the teacher's over every surface."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, RunTag

    figures = {k: metrics[f"eval/{k}/all/click"] for k in ("auc", "ne", "calibration", "positives", "negatives")
               if f"eval/{k}/all/click" in metrics}
    now = int(time.time() * 1000)
    MlflowClient().log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in tracking.holdout_metrics(
        figures).items()], tags=[RunTag(tracking.TAG_SURFACE, "all"), RunTag(tracking.TAG_MODEL_ROLE, "teacher")])


def _launch(how, features: str, eval_features: str, out: str, preset: str, overrides: list[str], init_from: str,
            run_id: str) -> tuple[dict[str, float], int]:
    import mlflow

    from gem.training.config import load_train_config
    from gem.training.trainer import train as run_training
    from gem_app.launch import run_torchrun, submit_trainjob, train_args, trainjob_manifest

    if how.kind == "local":
        cfg, model_cfg = load_train_config(preset, overrides)
        os.environ["MLFLOW_RUN_ID"] = run_id
        try:
            result = run_training(features, out, cfg, model_cfg, eval_features=eval_features or None, resume=True,
                                  init_from=init_from or None)
        finally:
            os.environ.pop("MLFLOW_RUN_ID", None)
        return {k: float(v) for k, v in result.eval_metrics.items()}, result.steps
    args = train_args(features, eval_features, out, preset, overrides, init_from)
    env = {"MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}
    if how.kind == "torchrun":
        run_torchrun(how.nproc, args, env)
    else:
        manifest = trainjob_manifest(f"gem-pretrain-{run_id[:12]}", os.environ.get("GEM_IMAGE", "gem:latest"),
                                     args, nodes=how.nodes, gpus_per_node=how.gpus, env=env)
        submit_trainjob(manifest)
    logged = mlflow.MlflowClient().get_run(run_id).data.metrics
    return {k: float(v) for k, v in logged.items() if k.startswith("eval/")}, _steps_done(out)


def _steps_done(out: str) -> int:
    """Steps of a run trained elsewhere: the trainer's last checkpoint (written when it
    finishes) is named by its step."""
    from gem.training.checkpoint import Checkpointer

    latest = Checkpointer(Path(out) / "checkpoints").latest()
    if latest is None:
        raise RuntimeError(f"{out}: the training run left no checkpoint; it did not finish")
    return int(latest.name.removeprefix("step_"))


def _registered_version(name: str, run_id: str):
    """The version already registered from this run (a rerun after a kill between
    registration and the completion record must not register it twice)."""
    from mlflow import MlflowClient

    versions = MlflowClient().search_model_versions(f"name='{name}' and run_id='{run_id}'")
    return versions[0] if versions else None


def _logged_model_uri(run_id: str) -> str:
    """The newest model the run logged (``models:/<id>``): a TrainJob restarted after it
    had finished logs the same weights once more, and ``runs:/<id>/model`` is then
    ambiguous to MLflow."""
    import mlflow

    run = mlflow.MlflowClient().get_run(run_id)
    models = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id], output_format="list",
        filter_string=f"source_run_id = '{run_id}' AND name = '{registry.TEACHER_MODEL}'",
        order_by=[{"field_name": "creation_time", "ascending": False}])
    models = [m for m in models if str(m.status) == "READY"]  # the filter has no status
    if not models:
        raise RuntimeError(f"training run {run_id} finished without logging its model (log_model=false?)")
    return f"models:/{models[0].model_id}"


def train(features: str, eval_features: str, out: str, preset: str, ctx: RunContext,
          overrides: list[str] | None = None, init_from: str = "", launcher: str = "local") -> TrainResult:
    """Train GEM on ``features`` (from ``init_from``'s weights when given) and register it."""
    import mlflow

    from gem.config import flatten
    from gem.training.config import load_train_config
    from gem.utils.digest import value_digest
    from gem_app.launch import Launcher

    out_dir = Path(out)
    window, digest = features_lineage(features)
    tracking_uri = ctx.configure()
    extra = [f"tracking_uri={tracking_uri}", f"experiment={ctx.experiment}", "run_name=train"]
    all_overrides = [*extra, *(overrides or [])]
    cfg, model_cfg = load_train_config(preset, all_overrides)
    settings = {k: v for k, v in {**flatten(cfg), **flatten(model_cfg)}.items() if "tracking" not in k}
    key = {"features": digest, "eval": features_lineage(eval_features)[1] if eval_features else "",
           "config": value_digest(settings), "init_from": init_from, "launcher": launcher}
    reuse = Reuse(record_path(out_dir, "train"), key)
    if done := reuse.get():
        return TrainResult(**done)
    run_id = _run_id(out_dir, key, ctx, window, digest, init_from)
    _log_inputs(run_id, init_from)
    fault_point("train:start")
    metrics, steps = _launch(Launcher.parse(launcher), features, eval_features, out, preset, all_overrides,
                             init_from, run_id)
    _log_holdout(run_id, metrics)
    version = _registered_version(registry.TEACHER_MODEL, run_id) or mlflow.register_model(
        _logged_model_uri(run_id), registry.TEACHER_MODEL,
        tags={tracking.TAG_DATA_WINDOW: window, tracking.TAG_DATA_DIGEST: digest,
              tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id,
              registry.FEATURES_DIR_TAG: shown(features, ctx.tracking_root)})
    describe_teacher(str(version.version), window=window, digest=digest, run_id=run_id, init_from=init_from,
                     features=features, holdout=holdout_text(metrics, eval_features))
    fault_point("train:registered")
    kept = out_dir / EVAL_PREDICTIONS
    result = TrainResult(run_id=run_id, model_version=str(version.version),
                         model_uri=registry.model_uri(registry.TEACHER_MODEL, version.version),
                         metrics=metrics, steps=steps, eval_predictions=str(kept) if kept.is_file() else "")
    reuse.put(result.as_dict())
    figure("steps", steps)
    figure("holdout AUC", auc_text(metrics.get("eval/auc/all/click"), metrics.get("eval/positives/all/click"),
                                   metrics.get("eval/negatives/all/click")))
    figure("version", result.model_version)
    return result


def holdout_text(metrics: dict, eval_features: str) -> str:
    """The teacher's holdout figures (click, every surface) in one sentence, '' without."""
    m = {k: metrics.get(f"eval/{k}/all/click") for k in ("auc", "ne", "calibration", "count", "positives", "negatives")}
    if not eval_features or m["ne"] is None:
        return ""
    window = features_lineage(eval_features)[0]
    return (f"Holdout {window} (click, every surface): AUC {auc_text(m['auc'], m['positives'], m['negatives'])}, "
            f"NE {m['ne']:.4f}, calibration {m['calibration']:.3f}, on {int(m['count'] or 0):,} examples "
            f"({int(m['positives'] or 0):,} clicks).")


def describe_teacher(version: str, *, window: str, digest: str, run_id: str, init_from: str, features: str,
                     holdout: str = "") -> None:
    """What the teacher version is, its holdout figures and how to load it, on the version
    and the model."""
    from mlflow import MlflowClient

    from gem.training.pyfunc import load_instructions

    client = MlflowClient()
    name = registry.TEACHER_MODEL
    start = f", continued from `{init_from}`" if init_from else ""
    client.update_model_version(name, version, description=(
        f"GEM teacher pretrained on the window {window} (features `{Path(features).name}`, digest {digest}) by run "
        f"{run_id}{start}.\n\n" + (f"{holdout}\n\n" if holdout else "")
        + load_instructions(registry.model_uri(name, version))))
    client.update_registered_model(name, description=(
        "GEM: the ads foundation model (sequence and non-sequence features across surfaces and objectives). "
        "Each version is pretrained on a teacher window (tags `gem.data_window`, `gem.data_digest`); `@champion` "
        "is the version the students learn from, moved only by the gate; a version lists its students (tags "
        "`gem.students.<model>`).\n\n" + load_instructions(f"models:/{name}@champion")))

