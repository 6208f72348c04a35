"""A world's figures: per arm, pooled over the student surfaces (the mean of the
per-surface figures, as every lift in analysis.py) and per surface, each with its paired
interval; the staleness curve and the row-cut curve across worlds."""

from __future__ import annotations

import math

import numpy as np

from benchmarks.transfer.arms import TEACHER_FREE as BASELINE
from benchmarks.transfer.arms import capacity_baselines
from benchmarks.transfer.surfaces import is_cut

CURVE_ARMS = ("kd", "adapter", "combined")


def world_figures(res, cfg) -> dict:
    """Per arm: absolute AUC/NE and the lift over no_teacher (and over its capacity-matched
    baseline) with intervals; the configured differences; the combined/KD ratio; the same
    per student surface; the teachers' AUC (mean over the student surfaces, and per surface)."""
    ev, out = res.evidence, {"arms": {}, "differences": {}, "ratios": {}}
    matched = capacity_baselines(cfg.arms)
    for arm in res.arms:
        entry = {"auc": ev.absolute(arm, "auc"), "ne": ev.absolute(arm, "ne"), "label": cfg.arms[arm].label,
                 "selected": [{"teacher": r.teacher, "point": r.point, "trials": r.trials} for r in res.arms[arm]],
                 "size": _size(res.arms[arm]), "flops_per_example": _flops(res.arms[arm])}
        teacher_flops = res.world.timings.get("teacher_flops_per_example")
        entry["flops_ratio_to_teacher"] = entry["flops_per_example"] / teacher_flops if teacher_flops else None
        if arm != BASELINE:
            entry["lift_auc"] = ev.lift(arm, BASELINE, "auc")
            entry["lift_ne"] = ev.lift(arm, BASELINE, "ne")
        ref = cfg.arms[arm].capacity_baseline or matched.get(arm)
        if ref and ref in res.arms:
            entry["capacity_baseline"] = ref
            entry["lift_auc_vs_capacity"] = ev.lift(arm, ref, "auc")
            entry["lift_ne_vs_capacity"] = ev.lift(arm, ref, "ne")
        out["arms"][arm] = entry
    for name, (a, b) in cfg.differences.items():
        if a in res.arms and b in res.arms:
            out["differences"][name] = {"auc": ev.lift(a, b, "auc"), "ne": ev.lift(a, b, "ne")}
    for num in ("combined", "adapter"):
        if num in res.arms and "kd" in res.arms:
            out["ratios"][f"transfer_ratio_{num}"] = {
                metric: ev.ratio((num, BASELINE), ("kd", BASELINE), metric) for metric in ("auc", "ne")}
    students = res.surfaces or None
    out["teachers"] = {t.id: {"seed": t.seed, "version": t.version,
                              "auc_click_surface_mean": _surface_mean(res.teacher_metrics[t.id], "auc", students),
                              "ne_click_surface_mean": _surface_mean(res.teacher_metrics[t.id], "ne", students)}
                       for t in res.world.teachers}
    out["student_surfaces"] = list(res.surfaces)
    out["teacher_only_surfaces"] = dict(res.teacher_only)
    out["per_surface"] = per_surface_figures(res, cfg)
    out["windows"] = res.world.windows
    out["examples"] = res.examples
    out["timings_s"] = res.world.timings
    return out


def _compact(lift: dict) -> dict:
    return {k: v for k, v in lift.items() if k != "per_run"}


def per_surface_figures(res, cfg) -> dict:
    """surface -> rows per table, the teachers' AUC, and for a student surface every
    arm's AUC and lifts (over no_teacher and its capacity-matched baseline) and every
    configured difference, each with its interval from the same bootstrap as the pooled
    figures (the evaluation users of that surface)."""
    ev, matched, out = res.evidence, capacity_baselines(cfg.arms), {}
    rows = res.examples_by_surface
    evaluation_labels = ev.labels
    for surface in sorted({s for table in rows.values() for s in table} | set(res.surfaces)):
        entry = {"rows": {table: counts.get(surface, 0) for table, counts in rows.items()},
                 "teacher_auc": {t: _finite(m.get(f"auc/{surface}/click")) for t, m in res.teacher_metrics.items()},
                 "student": surface in res.surfaces}
        teacher = [v for v in entry["teacher_auc"].values() if v is not None]
        entry["teacher_auc_mean"] = float(np.mean(teacher)) if teacher else None
        if surface in res.surfaces:
            index = next((ran[surface][0] for runs in ev.runs.values() for ran in runs.values() if surface in ran),
                         None)  # the surface's evaluation rows, as every run of it scored them
            if index is not None:
                clicks = int(evaluation_labels[index].sum())
                entry["rows"]["evaluation_clicks"], entry["rows"]["evaluation_unclicked"] = clicks, len(index) - clicks
            arms = {}
            for arm in res.arms:
                a = {"auc": _finite(ev.absolute(arm, "auc", [surface]))}
                if arm != BASELINE:
                    a["lift_auc"] = _compact(ev.lift(arm, BASELINE, "auc", [surface]))
                    a["lift_ne"] = _compact(ev.lift(arm, BASELINE, "ne", [surface]))
                ref = cfg.arms[arm].capacity_baseline or matched.get(arm)
                if ref and ref in res.arms:
                    a["lift_auc_vs_capacity"] = _compact(ev.lift(arm, ref, "auc", [surface]))
                    a["lift_ne_vs_capacity"] = _compact(ev.lift(arm, ref, "ne", [surface]))
                arms[arm] = a
            entry["arms"] = arms
            entry["differences"] = {name: {m: _compact(ev.lift(a, b, m, [surface])) for m in ("auc", "ne")}
                                    for name, (a, b) in cfg.differences.items() if a in res.arms and b in res.arms}
        out[surface] = entry
    return out


def _finite(value) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _surface_mean(metrics: dict, kind: str, surfaces: list[str] | None = None) -> float:
    values = [v for k, v in metrics.items() if k.startswith(f"{kind}/") and k.endswith("/click") and "/all/" not in k
              and (surfaces is None or k.split("/")[1] in surfaces) and math.isfinite(v)]
    return float(np.mean(values)) if values else math.nan


def _size(runs) -> dict:
    for r in runs:
        for surfaces in r.runs.values():
            for run in surfaces.values():
                return run.size
    return {}


def _flops(runs) -> float:
    return max((run.flops for r in runs for s in r.runs.values() for run in s.values()), default=math.nan)


def _teacher_auc(f: dict) -> float | None:
    return float(np.mean([t["auc_click_surface_mean"] for t in f["teachers"].values()])) if f["teachers"] else None


def staleness_curve(figures: dict[str, dict]) -> list[dict]:
    """Per world (gap, then the fresh control; not the row cuts): teacher AUC, the KD,
    adapter and combined lifts, the adapter-minus-KD and combined-minus-KD differences,
    and the combined / KD ratio, with intervals."""
    rows = []
    for name, f in figures.items():
        if is_cut(name):
            continue
        arms = f["arms"]
        row = {"world": name, "gap_periods": None if name == "fresh" else int(name.removeprefix("gap")),
               "teacher_auc": _teacher_auc(f)}
        for arm in CURVE_ARMS:
            if arm in arms:
                row[f"{arm}_lift_auc"] = arms[arm]["lift_auc"]
                row[f"{arm}_lift_ne"] = arms[arm]["lift_ne"]
        for diff in ("adapter_vs_kd", "combined_vs_kd"):
            if diff in f["differences"]:
                row[f"{diff}_auc"] = f["differences"][diff]["auc"]
                row[f"{diff}_ne"] = f["differences"][diff]["ne"]
        if "transfer_ratio_combined" in f["ratios"]:
            row["transfer_ratio_combined_auc"] = f["ratios"]["transfer_ratio_combined"]["auc"]
        rows.append(row)
    return rows


def cut_curve(figures: dict[str, dict], fractions: dict[str, float]) -> list[dict]:
    """The headline world (every training row) and its row cuts: rows, the KD, adapter and
    combined lifts, combined minus KD and minus its capacity-matched baseline (pooled over
    the student surfaces), and on how many surfaces that last one's interval is above 0."""
    headline = next(iter(figures))
    rows = []
    for name, fraction in [(headline, 1.0), *fractions.items()]:
        f = figures[name]
        row = {"world": name, "train_fraction": fraction, "train_rows": f["examples"]["train"],
               "teacher_auc": _teacher_auc(f), "no_teacher_auc": f["arms"][BASELINE]["auc"]}
        for arm in CURVE_ARMS:
            if arm in f["arms"]:
                row[f"{arm}_lift_auc"] = f["arms"][arm]["lift_auc"]
                row[f"{arm}_lift_ne"] = f["arms"][arm]["lift_ne"]
        for diff in ("adapter_vs_kd", "combined_vs_kd"):
            if diff in f["differences"]:
                row[f"{diff}_auc"] = f["differences"][diff]["auc"]
        combined = f["arms"].get("combined", {})
        if combined.get("lift_auc_vs_capacity"):
            row["combined_vs_capacity_auc"] = combined["lift_auc_vs_capacity"]
            row["combined_vs_capacity_ne"] = combined["lift_ne_vs_capacity"]
            row["combined_vs_capacity_surfaces_above_0"] = surfaces_above_zero(f, "combined", "lift_auc_vs_capacity")
        rows.append(row)
    return rows


def surfaces_above_zero(f: dict, arm: str, key: str) -> dict:
    """How many student surfaces have ``arm``'s ``key`` lift with its interval above 0."""
    students = [s for s, e in f["per_surface"].items() if e.get("student")]
    lows = {s: (f["per_surface"][s].get("arms", {}).get(arm, {}).get(key) or {}).get("lo") for s in students}
    above = [s for s, lo in lows.items() if lo is not None and lo > 0]
    return {"above": above, "count": len(above), "of": len(students)}
