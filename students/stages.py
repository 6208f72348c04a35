"""Pipeline stages of the transfer side: distill one surface's student, gate it against
the champion on the same holdout, promote. Thin kfp components wrap each function."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from gem import tracking
from gem.promotion import GateConfig, apply_decision, decide, decision_from_dict
from gem.stages import RunContext, stage, without_nulls

GATE_TASK = "click"  # the gate compares click AUC and NE on the holdout


def student_model_name(surface: str) -> str:
    return f"student_{surface}"


def _config(preset: str, surface: str, overrides: list[str] | None = None):
    from gem.config import load_config
    from students.config import DistillConfig

    cfg = load_config(DistillConfig, section="students", preset=preset, overrides=overrides).validate()
    return replace(cfg, surfaces=[surface])


def _tables(cfg, train_features: str | None, eval_features: str, feast_repo: str):
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


def distill_stage(surface: str, train_features: str, eval_features: str, feast_repo: str, teacher_uri: str,
                  out: str, ctx: RunContext, preset: str = "pipeline") -> dict:
    """Train the surface's student with the configured transfer methods and, for the lift,
    the no-teacher student on the same data; evaluate both on the holdout; register the
    transfer student (tagged with its teacher version) as a new challenger version."""
    import mlflow

    from gem.config import flatten
    from gem.knowledge.teacher import load_teacher
    from students.config import TransferConfig
    from students.distill import distill
    from students.registry import log_student

    result_file = Path(out) / f"{surface}.json"
    if result_file.is_file():  # rerun of a finished stage: reuse its registered version
        return json.loads(result_file.read_text())
    cfg = _config(preset, surface)
    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    (train, spec), (holdout, _) = _tables(cfg, train_features, eval_features, feast_repo)
    teacher = load_teacher(teacher_uri, mlflow.get_tracking_uri()) if cfg.transfer.sharing != "off" else None
    teacher_version = train.teacher_version or (teacher.version if teacher else teacher_uri)
    with stage(ctx, f"distill-{surface}", tags={tracking.TAG_SURFACE: surface,
                                                tracking.TAG_TEACHER_VERSION: teacher_version,
                                                tracking.TAG_FEATURE_VIEWS: "teacher_predictions,teacher_user_embedding,"
                                                                            "teacher_item_embedding"}):
        mlflow.log_params({k: str(v)[:500] for k, v in flatten(cfg).items()})
        baseline = distill(train, holdout, spec, replace(cfg, transfer=TransferConfig())).students[surface]
        student = distill(train, holdout, spec, cfg, teacher_model=teacher.model if teacher else None).students[surface]
        figures = {"student": _gate_metrics(student.metrics), "no_teacher": _gate_metrics(baseline.metrics)}
        lift = {"auc": figures["student"]["auc"] - figures["no_teacher"]["auc"],
                "ne": figures["no_teacher"]["ne"] - figures["student"]["ne"]}
        mlflow.log_metrics({f"{who}.{k}": v for who, m in figures.items() for k, v in m.items()})
        mlflow.log_metrics({f"lift.{k}": v for k, v in lift.items()})
        version = log_student(student, student_model_name(surface), teacher_version,
                              extra_tags={tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id,
                                          tracking.TAG_DATA_WINDOW: _window(train_features)})
    result = {"surface": surface, "model_name": student_model_name(surface), "version": version,
              "teacher_version": teacher_version, "methods": student.methods, "metrics": figures, "lift": lift,
              "flops_per_example": student.flops_per_example}
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.write_text(json.dumps(result, indent=2, default=str))
    return without_nulls(result)


def _gate_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {"auc": float(metrics[f"auc/{GATE_TASK}"]), "ne": float(metrics[f"ne/{GATE_TASK}"]),
            "calibration": float(metrics.get(f"calibration/{GATE_TASK}", float("nan")))}


def _window(features: str) -> str:
    window = json.loads((Path(features) / "manifest.json").read_text()).get("window", {})
    return f"{window.get('start')}..{window.get('end')}"


def evaluate_registered(model_uri: str, surface: str, eval_features: str, feast_repo: str,
                        preset: str = "pipeline") -> dict[str, float]:
    """Click AUC / NE / calibration of a registered student on the surface's holdout."""
    import mlflow.pytorch

    from gem.data.contract import SURFACES, TASKS
    from students.train import evaluate, predict

    cfg = _config(preset, surface)
    _, (holdout, _) = _tables(cfg, None, eval_features, feast_repo)
    part = holdout.subset(holdout.surface == SURFACES.index(surface))
    model = mlflow.pytorch.load_model(model_uri, map_location="cpu")
    metrics = evaluate(predict(model, part), part, list(SURFACES), list(TASKS))
    return _gate_metrics({k.replace(f"/{surface}/", "/"): v for k, v in metrics.items() if f"/{surface}/" in k})


def gate_stage(surface: str, challenger_version: str, eval_features: str, feast_repo: str, ctx: RunContext,
               gate: GateConfig | None = None, preset: str = "pipeline") -> dict:
    """Challenger and champion evaluated on the same holdout; the decision (not applied)."""
    from gem.promotion import CHAMPION, champion_version

    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    name = student_model_name(surface)
    gate = gate or GateConfig()
    with stage(ctx, f"gate-{surface}", tags={tracking.TAG_SURFACE: surface}):
        challenger = evaluate_registered(f"models:/{name}/{challenger_version}", surface, eval_features, feast_repo, preset)
        champion = None
        if champion_version(name):
            champion = evaluate_registered(f"models:/{name}@{CHAMPION}", surface, eval_features, feast_repo, preset)
        decision = decide(name, challenger_version, {surface: challenger}, {surface: champion} if champion else None, gate)
    return without_nulls(decision.to_dict())


def promote_stage(decision: dict, ctx: RunContext) -> dict:
    """Apply a gate decision: move the champion alias only if the challenger won; record
    the decision and its figures either way."""
    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    parsed = decision_from_dict(decision)
    with stage(ctx, f"promote-{parsed.model_name}"):
        apply_decision(parsed)
    return without_nulls({"model_name": parsed.model_name, "version": parsed.challenger_version,
                          "promoted": parsed.promote, "champion_before": parsed.champion_version,
                          "summary": parsed.summary()})
