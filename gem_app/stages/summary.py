"""summary: per surface, teacher and student AUC/NE on the holdout, the no-teacher
student, the transfer lift and the run's gate decision with its reason ("why"); the
teacher's decision above the table. Written to the workspace and, as the description
of the pipeline's parent run, to MLflow; closes the parent run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gem.utils.atomic import write_json, write_text
from gem_app.stages.context import RunContext, StageResult, finish_pipeline

COLUMNS = ("surface", "teacher AUC", "teacher NE", "student AUC", "student NE", "no-teacher AUC", "lift AUC",
           "lift NE", "student", "decision", "why")


@dataclass(kw_only=True)
class SummaryResult(StageResult):
    markdown: str
    rows: list[dict] = field(default_factory=list)


def _row(teacher: dict, row: dict) -> dict:
    s, nan = row["surface"], float("nan")
    return {"surface": s,
            "teacher_auc": teacher["metrics"].get(f"eval/auc/{s}/click", nan),
            "teacher_ne": teacher["metrics"].get(f"eval/ne/{s}/click", nan),
            "student_auc": row["metrics"]["student"]["auc"], "student_ne": row["metrics"]["student"]["ne"],
            "no_teacher_auc": row["metrics"]["no_teacher"]["auc"], "no_teacher_ne": row["metrics"]["no_teacher"]["ne"],
            "lift_auc": row["lift"]["auc"], "lift_ne": row["lift"]["ne"],
            "student": f"{row['model_name']} v{row['version']}", "promoted": bool(row.get("promoted", False)),
            "decision": row.get("decision", ""), "why": row.get("why", "")}


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def markdown_table(run_id: str, teacher_uri: str, rows: list[dict], teacher_gate: dict | None = None) -> str:
    gate = teacher_gate or {}
    verdict = f": **{gate['outcome']}**: {_cell(gate.get('reason', ''))}" if gate.get("outcome") else ""
    lines = [f"# GEM pipeline run {run_id}", "", f"Teacher: {teacher_uri} (holdout, click task){verdict}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        figures = [f"{_float(r[k]):.4f}" for k in ("teacher_auc", "teacher_ne", "student_auc", "student_ne",
                                                   "no_teacher_auc")]
        lifts = [f"{_float(r[k]):+.4f}" for k in ("lift_auc", "lift_ne")]
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
