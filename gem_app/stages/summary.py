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

COLUMNS = ("surface", "teacher AUC", "teacher NE", "student AUC", "student NE", "student - teacher AUC",
           "student - teacher NE", "no-teacher AUC", "lift AUC", "lift NE", "student", "decision", "why")


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
    chosen = row.get("selection", {}).get("student", {})  # the distill step's selection of this student
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
            **_gate_lift(row),
            # student - teacher on the same holdout rows, paired (the distill step's)
            **{f"vs_teacher_{k}": _figure(row.get("vs_teacher", {}).get(k))
               for k in ("auc", "auc_lo", "auc_hi", "ne", "ne_lo", "ne_hi", "rows")},
            "recalibrated": bool(chosen.get("recalibrated", False)), "chosen": chosen.get("point"),
            # the student's window reached into the teacher's days: "all" trained on them, "fresh" did not
            "rows": chosen.get("rows", ""),
            "student": (f"{row['model_name']} v{row['version']}" if row.get("version") else "none trained")
            + (" (recalibrated)" if chosen.get("recalibrated") else ""),
            "promoted": bool(row.get("promoted", False)),
            # False: kept without the challenger alias (no better than a constant on the holdout)
            "offered": bool(row.get("gate", {}).get("offered", True)),
            "decision": row.get("decision", ""), "why": row.get("why", "")}


def _gate_lift(row: dict) -> dict:
    """The gate's paired interval of the AUC lift over the no-teacher reference."""
    verdicts = (row.get("gate") or {}).get("surfaces") or [{}]
    figures = verdicts[0].get("challenger") or {}
    return {f"lift_auc_{end}": _figure(figures.get(f"vs_no_teacher_auc_lift_{end}")) for end in ("lo", "hi")}


# the parent run's table of surfaces (MLflow's artifact view shows and compares it)
TABLE = ("surface", "teacher_auc", "teacher_ne", "student_auc", "student_ne", "no_teacher_auc", "lift_auc",
         "lift_auc_lo", "lift_auc_hi", "vs_teacher_auc", "vs_teacher_auc_lo", "vs_teacher_auc_hi", "decision")


def headline(teacher: dict, rows: list[dict]) -> dict[str, float]:
    """The run's figures on its parent run, so that two pipeline runs compare side by
    side: the teacher's holdout AUC and NE (click), the students' mean AUC and lift over
    the surfaces that have them, and how many surfaces got each decision."""
    from gem_app.promotion import OUTCOMES

    m = teacher.get("metrics", {})
    out = {"teacher/holdout_auc": _figure(m.get("eval/auc/all/click")),
           "teacher/holdout_ne": _figure(m.get("eval/ne/all/click"))}
    for name, key in (("students/mean_auc", "student_auc"), ("students/mean_lift", "lift_auc")):
        values = [r[key] for r in rows if r.get(key) is not None]
        out[name] = sum(values) / len(values) if values else None
    for outcome in OUTCOMES:
        out[f"decisions/{outcome.replace(' ', '_')}"] = float(sum(r.get("decision") == outcome for r in rows))
    out["decisions/none_trained"] = float(sum(r.get("student") == "none trained" for r in rows))
    out["decisions/not_offered"] = float(sum(r.get("offered") is False for r in rows))
    if any(r.get("rows") for r in rows):  # the window reached into the teacher's days
        out["students/on_teacher_days"] = float(sum(r.get("rows") == "all" for r in rows))
    return {k: float(v) for k, v in out.items() if v is not None}


def _float(value) -> float:
    figure = _figure(value)
    return math.nan if figure is None else figure


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def markdown_table(run_id: str, teacher_uri: str, rows: list[dict], teacher_gate: dict | None = None) -> str:
    from gem_app.promotion import shown_outcome

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
        vs = [_with_interval(auc_text(r.get("vs_teacher_auc"), *held, sign=True), r, "auc"),
              _with_interval(_signed(r.get("vs_teacher_ne")), r, "ne")]
        lines.append("| " + " | ".join([r["surface"], *figures[:4], *vs, figures[4], *lifts, r["student"],
                                        shown_outcome(r["decision"], r.get("offered", True)) or "-",
                                        _cell(r["why"]) or "-"]) + " |")
    on_teacher_days = [r["surface"] for r in rows if r.get("rows") == "all"]
    reached = sum(bool(r.get("rows")) for r in rows)  # students whose window reached into the teacher's days
    if reached:
        lines += ["", "Students trained on the teacher's days as well: "
                      + (", ".join(on_teacher_days) if on_teacher_days else "none")
                      + (f" ({len(on_teacher_days)} of {reached}; the others on their own window only)"
                         if len(on_teacher_days) < reached else "")]
    pooled = pooled_vs_teacher(rows)
    if pooled:
        lines += ["", f"Students vs teacher, pooled over {pooled['surfaces']} surfaces "
                      f"({pooled['rows']:,} holdout rows, row-weighted): "
                      f"AUC {pooled['auc']:+.4f} [{pooled['auc_lo']:+.4f}, {pooled['auc_hi']:+.4f}], "
                      f"NE {pooled['ne']:+.4f} [{pooled['ne_lo']:+.4f}, {pooled['ne_hi']:+.4f}] "
                      "(student - teacher; 95% intervals)"]
    return "\n".join(lines) + "\n"


def _signed(value) -> str:
    figure = _figure(value)
    return "n/a" if figure is None else f"{figure:+.4f}"


def _with_interval(text: str, row: dict, metric: str) -> str:
    lo, hi = _figure(row.get(f"vs_teacher_{metric}_lo")), _figure(row.get(f"vs_teacher_{metric}_hi"))
    return text if text.startswith("n/a") or lo is None or hi is None else f"{text} [{lo:+.4f}, {hi:+.4f}]"


def pooled_vs_teacher(rows: list[dict]) -> dict:
    """Student - teacher AUC and NE over the surfaces with students and an AUC on enough
    evidence: the holdout-row-weighted mean of the per-surface paired differences, its
    interval from theirs (surfaces' rows are disjoint: standard errors combined as
    independent); {} when no surface has one."""
    keys = [f"vs_teacher_{m}{end}" for m in ("auc", "ne") for end in ("", "_lo", "_hi")]
    used = [r for r in rows if r.get("vs_teacher_rows") and r.get("student_auc") is not None
            and all(r.get(k) is not None for k in keys)]
    if not used:
        return {}
    weights = [float(r["vs_teacher_rows"]) for r in used]
    total = sum(weights)
    out = {"surfaces": len(used), "rows": int(total)}
    for metric in ("auc", "ne"):
        mean = sum(w * r[f"vs_teacher_{metric}"] for w, r in zip(weights, used)) / total
        var = sum((w / total) ** 2 * ((r[f"vs_teacher_{metric}_hi"] - r[f"vs_teacher_{metric}_lo"]) / 3.92) ** 2
                  for w, r in zip(weights, used))
        out.update({metric: mean, f"{metric}_lo": mean - 1.96 * math.sqrt(var),
                    f"{metric}_hi": mean + 1.96 * math.sqrt(var)})
    return out


def summary(teacher: dict, promoted: dict, workspace: str, ctx: RunContext) -> SummaryResult:
    """``teacher``: the train step's result; ``promoted``: the promote step's (the run's
    decisions as applied)."""
    rows = [_row(teacher, r) for r in sorted(promoted.get("surfaces", []), key=lambda r: r["surface"])]
    teacher_gate = promoted.get("teacher") or {}
    markdown = markdown_table(ctx.pipeline_run_id, teacher.get("model_uri", ""), rows, teacher_gate)
    payload = {"pipeline_run_id": ctx.pipeline_run_id, "teacher": {**teacher, "gate": teacher_gate},
               "surfaces": rows, "vs_teacher_pooled": pooled_vs_teacher(rows),
               "recalibrated": [r["surface"] for r in rows if r["recalibrated"]]}
    write_json(payload, Path(workspace) / "summary.json")
    write_text(markdown, Path(workspace) / "summary.md")
    ctx.configure()
    import mlflow

    client = mlflow.MlflowClient()
    client.log_text(ctx.parent_run_id, markdown, "summary.md")
    pooled = payload["vs_teacher_pooled"]  # two pipeline runs compare on how much of the teacher reached students
    for key in ("auc", "auc_lo", "auc_hi", "ne", "ne_lo", "ne_hi", "surfaces"):
        if key in pooled:
            client.log_metric(ctx.parent_run_id, f"students_vs_teacher/{key}", float(pooled[key]))
    client.log_metric(ctx.parent_run_id, "students/recalibrated", float(len(payload["recalibrated"])))
    for key, value in headline(teacher, rows).items():
        client.log_metric(ctx.parent_run_id, key, value)
    client.log_table(ctx.parent_run_id, {c: [r.get(c) for r in rows] for c in TABLE}, "surfaces.json")
    if rows:
        from gem_app.stages.plots import surfaces_figure

        client.log_figure(ctx.parent_run_id, surfaces_figure(rows), "plots/surfaces_lift_vs_teacher.png")
    finish_pipeline(ctx, payload, description=markdown)
    return SummaryResult(markdown=markdown, rows=rows)
