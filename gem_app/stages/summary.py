"""summary: per surface, teacher and student AUC/NE on the holdout, the no-teacher
student, the transfer lift and the run's gate decision with its reason ("why"); the
teacher's decision above the table. Written to the workspace and, as the description
of the pipeline's parent run, to MLflow; closes the parent run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from gem.utils.atomic import write_json, write_text
from gem.utils.evidence import auc_text
from gem_app.stages.context import RunContext, StageResult, finish_pipeline

COLUMNS = ("surface", "teacher AUC", "teacher NE", "student AUC", "student NE", "no-teacher AUC", "lift AUC",
           "lift NE", "student", "decision", "why")


@dataclass(kw_only=True)
class SummaryResult(StageResult):
    markdown: str
    rows: list[dict] = field(default_factory=list)


def _figure(value) -> float | None:
    """A figure as summary.json keeps it: None where it was not computed (kfp carries a
    missing figure as "", the training metrics leave it out)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _row(teacher: dict, row: dict) -> dict:
    s = row["surface"]
    m, student, no_teacher = teacher["metrics"], row["metrics"]["student"], row["metrics"]["no_teacher"]
    return {"surface": s,
            "teacher_auc": _figure(m.get(f"eval/auc/{s}/click")), "teacher_ne": _figure(m.get(f"eval/ne/{s}/click")),
            # what each AUC rests on (an AUC short of evidence is shown "n/a (k positives)")
            "teacher_positives": _figure(m.get(f"eval/positives/{s}/click")),
            "teacher_negatives": _figure(m.get(f"eval/negatives/{s}/click")),
            "holdout_positives": _figure(student.get("positives")),
            "holdout_negatives": _figure(student.get("negatives")),
            "student_auc": _figure(student.get("auc")), "student_ne": _figure(student.get("ne")),
            "no_teacher_auc": _figure(no_teacher.get("auc")), "no_teacher_ne": _figure(no_teacher.get("ne")),
            "lift_auc": _figure(row["lift"].get("auc")), "lift_ne": _figure(row["lift"].get("ne")),
            "student": f"{row['model_name']} v{row['version']}" if row.get("version") else "none trained",
            "promoted": bool(row.get("promoted", False)),
            "decision": row.get("decision", ""), "why": row.get("why", "")}


def _float(value) -> float:
    figure = _figure(value)
    return math.nan if figure is None else figure


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def markdown_table(run_id: str, teacher_uri: str, rows: list[dict], teacher_gate: dict | None = None) -> str:
    gate = teacher_gate or {}
    verdict = f": **{gate['outcome']}**: {_cell(gate.get('reason', ''))}" if gate.get("outcome") else ""
    lines = [f"# GEM pipeline run {run_id}", "", f"Teacher: {teacher_uri} (holdout, click task){verdict}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        seen = (r.get("teacher_positives"), r.get("teacher_negatives"))
        held = (r.get("holdout_positives"), r.get("holdout_negatives"))
        figures = [auc_text(r["teacher_auc"], *seen), f"{_float(r['teacher_ne']):.4f}",
                   auc_text(r["student_auc"], *held), f"{_float(r['student_ne']):.4f}",
                   auc_text(r["no_teacher_auc"], *held)]
        lifts = [auc_text(r["lift_auc"], *held, sign=True), f"{_float(r['lift_ne']):+.4f}"]
        lines.append("| " + " | ".join([r["surface"], *figures, *lifts, r["student"], r["decision"] or "-",
                                        _cell(r["why"]) or "-"]) + " |")
    return "\n".join(lines) + "\n"


def summary(teacher: dict, promoted: dict, workspace: str, ctx: RunContext) -> SummaryResult:
    """``teacher``: the train step's result; ``promoted``: the promote step's (the run's
    decisions as applied)."""
    rows = [_row(teacher, r) for r in sorted(promoted.get("surfaces", []), key=lambda r: r["surface"])]
    teacher_gate = promoted.get("teacher") or {}
    markdown = markdown_table(ctx.pipeline_run_id, teacher.get("model_uri", ""), rows, teacher_gate)
    payload = {"pipeline_run_id": ctx.pipeline_run_id, "teacher": {**teacher, "gate": teacher_gate},
               "surfaces": rows}
    write_json(payload, Path(workspace) / "summary.json")
    write_text(markdown, Path(workspace) / "summary.md")
    ctx.configure()
    import mlflow

    mlflow.MlflowClient().log_text(ctx.parent_run_id, markdown, "summary.md")
    finish_pipeline(ctx, payload, description=markdown)
    return SummaryResult(markdown=markdown, rows=rows)
