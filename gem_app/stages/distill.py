"""distill: one surface's vertical student through the configured transfer methods, the
no-teacher student on the same rows for the lift, both scored on the holdout; the
transfer student is registered as a new version of ``student_<surface>``.

Reuse: the recorded result is returned only for the same teacher version, the same
train/eval features (content digests) and the same resolved config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from gem import registry, tracking
from gem.utils.progress import figure
from gem_app.stages.context import Reuse, RunContext, StageResult, fault_point, log_model_input, tracked
from gem_app.stages.features import features_lineage, log_features_input

GATE_TASK = "click"  # the gate compares click AUC and NE on the holdout
KNOWLEDGE_VIEWS = "teacher_predictions,teacher_user_embedding,teacher_item_embedding"


@dataclass(kw_only=True)
class DistillResult(StageResult):
    surface: str
    model_name: str
    version: str
    teacher_version: str
    methods: list[str]
    metrics: dict[str, dict[str, float]]  # "student" / "no_teacher" -> auc, ne, calibration
    lift: dict[str, float]
    flops_per_example: float = 0.0
    history: dict[str, list[float]] = field(default_factory=dict)


def distill_config(preset: str, surface: str | None = None, overrides: list[str] | None = None,
                   path: str | Path | None = None):
    from gem.config import load_config
    from students.config import DistillConfig

    cfg = load_config(DistillConfig, section="students", preset=preset, path=path, overrides=overrides).validate()
    return replace(cfg, surfaces=[surface]) if surface else cfg


def student_tables(cfg, train_features: str | None, eval_features: str, feast_repo: str):
    """(train table, spec), (eval table, spec) with the teacher's knowledge joined point-in-time."""
    from students.data import attach_knowledge, load_table

    tr = cfg.transfer
    needs_preds = bool(tr.kd.weight or tr.adapter.weight or tr.hierarchical.weight)

    def load(path: str):
        table, spec = load_table(path, cfg.student)
        if tr.needs_teacher():
            table = attach_knowledge(table, feast_repo, predictions=needs_preds, embeddings=tr.representation.enabled)
        return table, spec

    train = load(train_features) if train_features else (None, None)
    return train, load(eval_features)


def gate_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Click AUC/NE/calibration of one surface; NaN where the holdout has no positives
    (a degenerate surface is reported, not crashed on)."""
    nan = float("nan")
    return {"auc": float(metrics.get(f"auc/{GATE_TASK}", nan)), "ne": float(metrics.get(f"ne/{GATE_TASK}", nan)),
            "calibration": float(metrics.get(f"calibration/{GATE_TASK}", nan))}


def distill(surface: str, train_features: str, eval_features: str, feast_repo: str, teacher_uri: str,
            out: str, ctx: RunContext, preset: str = "pipeline", overrides: list[str] | None = None,
            teacher_version: str = "") -> DistillResult:
    import mlflow

    from gem.config import flatten
    from gem.knowledge.teacher import load_teacher
    from gem.utils.digest import value_digest
    from students.config import TransferConfig
    from students.distill import distill as run_distill
    from students.registry import log_student

    cfg = distill_config(preset, surface, overrides)
    window, train_digest = features_lineage(train_features)
    reuse = Reuse(Path(out) / f"{surface}.json", {
        "teacher": teacher_version or teacher_uri, "train": train_digest, "eval": features_lineage(eval_features)[1],
        "config": value_digest(flatten(cfg))})
    if done := reuse.get():
        return DistillResult(**done)
    tracking_uri = ctx.configure()
    pending = Reuse(Path(out) / f".{surface}.pending.json", reuse.key)
    if (record := pending.get()) and (version := _registered_from(record["run_id"], surface)):
        return DistillResult(**reuse.put({**record["result"], "version": version}))  # killed after registering
    (train, spec), (holdout, _) = student_tables(cfg, train_features, eval_features, feast_repo)
    teacher = load_teacher(teacher_uri, tracking_uri) if cfg.transfer.sharing != "off" else None
    teacher_version = train.teacher_version or teacher_version or (teacher.version if teacher else teacher_uri)
    with tracked(ctx, f"distill-{surface}", tags={tracking.TAG_SURFACE: surface,
                                                  tracking.TAG_TEACHER_VERSION: teacher_version,
                                                  tracking.TAG_FEATURE_VIEWS: KNOWLEDGE_VIEWS}):
        mlflow.log_params({k: str(v)[:500] for k, v in flatten(cfg).items()})
        log_features_input(train_features, "training")
        log_features_input(eval_features, "evaluation")
        log_model_input(teacher_version)
        baseline = run_distill(train, holdout, spec, replace(cfg, transfer=TransferConfig())).students[surface]
        student = run_distill(train, holdout, spec, cfg, teacher_model=teacher.model if teacher else None
                              ).students[surface]
        figures = {"student": gate_metrics(student.metrics), "no_teacher": gate_metrics(baseline.metrics)}
        lift = {"auc": figures["student"]["auc"] - figures["no_teacher"]["auc"],
                "ne": figures["no_teacher"]["ne"] - figures["student"]["ne"]}
        mlflow.log_metrics({f"eval/{who}/{k}": v for who, m in figures.items() for k, v in m.items()})
        mlflow.log_metrics({f"eval/lift/{k}": v for k, v in lift.items()})
        for who, res in (("student", student), ("no_teacher", baseline)):
            for epoch, loss in enumerate(res.train_loss):
                mlflow.log_metric(f"train/{who}/loss", loss, step=epoch)
        unregistered = DistillResult(surface=surface, model_name=registry.student_model(surface), version="",
                                     teacher_version=teacher_version, methods=list(student.methods), metrics=figures,
                                     lift=lift, flops_per_example=float(student.flops_per_example or 0.0))
        Path(out).mkdir(parents=True, exist_ok=True)
        pending.put({"run_id": mlflow.active_run().info.run_id,
                     "result": json.loads(json.dumps(unregistered.as_dict(), default=str))})
        version = log_student(student, registry.student_model(surface), teacher_version,
                              extra_tags={tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id,
                                          tracking.TAG_DATA_WINDOW: window})
        fault_point("distill:registered")
    result = replace(unregistered, version=version)
    figure("surface", surface)
    figure("student AUC", figures["student"]["auc"])
    figure("lift AUC", lift["auc"])
    reuse.put(json.loads(json.dumps(result.as_dict(), default=str)))
    return result


def _registered_from(run_id: str, surface: str) -> str:
    """The version a killed attempt registered from its run, if it got that far (a rerun
    must not register the same student twice)."""
    from mlflow import MlflowClient

    name = registry.student_model(surface)
    versions = MlflowClient().search_model_versions(f"name='{name}' and run_id='{run_id}'")
    return str(versions[0].version) if versions else ""


def distill_plan(ctx: str, surfaces: list[str], available: list[str], **job) -> list[dict]:
    """One job per surface for the students' ParallelFor; a surface the data lacks is a
    clear error naming the surfaces that exist."""
    missing = sorted(set(surfaces) - set(available))
    if missing:
        raise ValueError(f"surfaces {missing} are not in this dataset; it has {sorted(available)}")
    return [{"ctx": ctx, "surface": s, **job} for s in (surfaces or available)]  # default: the data's surfaces
