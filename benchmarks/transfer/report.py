"""The experiment's outputs: the benchmarks/results/transfer.json payload, a markdown
comparison (MLflow artifact and the source of docs/transfer.md's tables) and a plot."""

from __future__ import annotations

import math
from dataclasses import asdict

from benchmarks.transfer.experiment import BASELINE, ExperimentConfig
from benchmarks.transfer.figures import cut_curve, staleness_curve
from benchmarks.transfer.surfaces import is_cut

PROTOCOL = (
    "Per dataset: teacher window, knowledge lead, student train window, validation slice (the end of the "
    "student window) and evaluation window, disjoint (the fresh-teacher control's teacher overlaps train only). "
    "Every arm: the same epochs/patience and a grid of the same size, searched with the first seed on the "
    "validation label loss; the other seeds rerun the selected point. Knowledge (teacher embeddings) is read as "
    "of the last materialization before the request (knowledge.refresh_every); the per-impression arm is an upper "
    "bound. Lifts: method minus no_teacher per surface (AUC; NE: no_teacher minus method, so positive is better), "
    "mean over surfaces, then over matched (teacher, seed) runs; 95% intervals from a paired bootstrap that "
    "reweights evaluation users (Poisson, all of a user's rows together) and resamples the runs in the same "
    "replicate; sd_runs is the sample std (ddof=1) of the per-run lifts. A ratio of lifts is reported only where "
    "the denominator's interval excludes zero.")


def _fmt(entry: dict | None, digits: int = 4) -> str:
    if not entry or entry.get("mean") is None or not math.isfinite(entry["mean"]):
        return "n/a"
    star = "" if entry.get("excludes_zero") else " (ns)"
    return f"{entry['mean']:+.{digits}f} [{entry['lo']:+.{digits}f}, {entry['hi']:+.{digits}f}]{star}"


def _ratio(entry: dict | None) -> str:
    if not entry:
        return "n/a"
    if not entry.get("defined"):
        return f"undefined: {entry.get('why', '')}"
    return f"{entry['mean']:.2f} [{entry['lo']:.2f}, {entry['hi']:.2f}]"


def comparison_markdown(payload: dict) -> str:
    lines = [f"Protocol: {payload['protocol']}", ""]
    for ds, entry in payload["datasets"].items():
        sizes = entry["sizes"]
        teachers = ", ".join(f"{t['auc_click_surface_mean']:.4f}" for t in entry["teachers"].values())
        lines += [f"## {ds} (world {entry['headline_world']})", "",
                  f"rows: train {sizes['train']}, validation {sizes['validation']}, evaluation {sizes['evaluation']}; "
                  f"teachers' AUC(click) on the evaluation window, mean over surfaces: {teachers}", "",
                  "| arm | AUC | NE | AUC lift vs no_teacher | NE lift vs no_teacher | AUC lift vs capacity-matched |",
                  "|---|---|---|---|---|---|"]
        for arm, a in entry["arms"].items():
            cap = (f"{_fmt(a.get('lift_auc_vs_capacity'))} ({a['capacity_baseline']})"
                   if a.get("capacity_baseline") else "")
            name = f"{arm} ({a['label']})" if a.get("label") else arm
            lines.append(f"| {name} | {a['auc']:.4f} | {a['ne']:.4f} | {_fmt(a.get('lift_auc'))} | "
                         f"{_fmt(a.get('lift_ne'))} | {cap} |")
        lines.append("")
        for name, d in entry["differences"].items():
            lines.append(f"- {name}: AUC {_fmt(d['auc'])}, NE {_fmt(d['ne'])}")
        for name, r in entry["ratios"].items():
            lines.append(f"- {name}: AUC {_ratio(r['auc'])}; NE {_ratio(r['ne'])}")
        if len(entry["staleness"]) > 1:
            lines += ["", "| world | teacher AUC | KD lift AUC | adapter lift AUC | combined lift AUC | "
                          "adapter - KD (AUC) | adapter - KD (NE) | combined - KD (AUC) | combined / KD (AUC) |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for row in entry["staleness"]:
                lines.append(f"| {row['world']} | {row['teacher_auc']:.4f} | {_fmt(row.get('kd_lift_auc'))} | "
                             f"{_fmt(row.get('adapter_lift_auc'))} | {_fmt(row.get('combined_lift_auc'))} | "
                             f"{_fmt(row.get('adapter_vs_kd_auc'))} | {_fmt(row.get('adapter_vs_kd_ne'))} | "
                             f"{_fmt(row.get('combined_vs_kd_auc'))} | "
                             f"{_ratio(row.get('transfer_ratio_combined_auc'))} |")
        lines += _cuts_markdown(entry) + _surfaces_markdown(entry)
        lines.append("")
    serving = payload.get("serving") or {}
    if serving:
        lines += ["## serving (feed student, 100 candidates)", "", "| path | p50 ms | p99 ms |", "|---|---|---|"]
        for name, s in serving.get("paths", {}).items():
            lines.append(f"| {name} | {s['p50_ms']:.2f} ± {s['p50_ms_std']:.2f} | {s['p99_ms']:.2f} ± "
                         f"{s['p99_ms_std']:.2f} |")
    return "\n".join(lines) + "\n"


def _cuts_markdown(entry: dict) -> list[str]:
    if not entry.get("row_cuts"):
        return []
    lines = ["", "| world | train rows | no_teacher AUC | KD lift AUC | adapter lift AUC | combined lift AUC | "
                 "combined - KD (AUC) | combined - nt_combined (AUC) | surfaces with combined > nt_combined |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in entry["row_cuts"]:
        above = row.get("combined_vs_capacity_surfaces_above_0") or {}
        lines.append(f"| {row['world']} ({row['train_fraction']:.0%}) | {row['train_rows']:,} | "
                     f"{row['no_teacher_auc']:.4f} | {_fmt(row.get('kd_lift_auc'))} | "
                     f"{_fmt(row.get('adapter_lift_auc'))} | {_fmt(row.get('combined_lift_auc'))} | "
                     f"{_fmt(row.get('combined_vs_kd_auc'))} | {_fmt(row.get('combined_vs_capacity_auc'))} | "
                     f"{above.get('count', 'n/a')} of {above.get('of', 'n/a')} |")
    return lines


def _surfaces_markdown(entry: dict) -> list[str]:
    """The headline world per student surface (a dataset with teacher-only surfaces)."""
    if not entry.get("teacher_only_surfaces"):
        return []
    lines = ["", f"Students: {len(entry['student_surfaces'])} surfaces ({entry.get('student_rule', '')}); "
                 f"teacher-only: {', '.join(entry['teacher_only_surfaces'])}", "",
             "| surface | rows train / validation / evaluation (unclicked) | teacher AUC | no_teacher AUC | "
             "KD lift | adapter lift | combined lift | combined - nt_combined | combined - KD |",
             "|---|---|---|---|---|---|---|---|---|"]
    for surface in entry["student_surfaces"]:
        e = entry["per_surface"][surface]
        rows, arms = e["rows"], e.get("arms", {})
        teacher = f"{e['teacher_auc_mean']:.4f}" if e.get("teacher_auc_mean") is not None else "n/a"
        lines.append(f"| {surface} | {rows.get('train', 0):,} / {rows.get('validation', 0):,} / "
                     f"{rows.get('evaluation', 0):,} ({rows.get('evaluation_unclicked', 'n/a')}) | {teacher} | "
                     f"{(arms.get(BASELINE) or {}).get('auc') or float('nan'):.4f} | "
                     f"{_fmt((arms.get('kd') or {}).get('lift_auc'))} | "
                     f"{_fmt((arms.get('adapter') or {}).get('lift_auc'))} | "
                     f"{_fmt((arms.get('combined') or {}).get('lift_auc'))} | "
                     f"{_fmt((arms.get('combined') or {}).get('lift_auc_vs_capacity'))} | "
                     f"{_fmt((e.get('differences', {}).get('combined_vs_kd') or {}).get('auc'))} |")
    return lines


def lift_figure(payload: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(payload["datasets"])
    if not datasets:
        return None
    fig, axes = plt.subplots(1, len(datasets) + 1, figsize=(5 * (len(datasets) + 1), 4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        arms = [a for a in payload["datasets"][ds]["arms"] if a != BASELINE]
        entries = [payload["datasets"][ds]["arms"][a].get("lift_auc") or {} for a in arms]
        means = [e.get("mean") or 0.0 for e in entries]
        err = [[m - (e.get("lo") or m) for m, e in zip(means, entries)],
               [(e.get("hi") or m) - m for m, e in zip(means, entries)]]
        ax.barh(arms, means, xerr=err)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_title(f"{ds}: AUC lift over no_teacher (95% CI)", fontsize=9)
        ax.tick_params(labelsize=7)
    ax = axes[0][-1]
    for ds in datasets:
        rows = [r for r in payload["datasets"][ds]["staleness"] if r["gap_periods"] is not None]
        if len(rows) > 1 and all(r.get("adapter_vs_kd_auc") for r in rows):
            xs = [r["gap_periods"] for r in rows]
            ys = [r["adapter_vs_kd_auc"]["mean"] for r in rows]
            lo = [r["adapter_vs_kd_auc"]["lo"] for r in rows]
            hi = [r["adapter_vs_kd_auc"]["hi"] for r in rows]
            order = sorted(range(len(xs)), key=xs.__getitem__)
            ax.errorbar([xs[i] for i in order], [ys[i] for i in order],
                        yerr=[[ys[i] - lo[i] for i in order], [hi[i] - ys[i] for i in order]], marker="o", label=ds)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("gap between the teacher's last day and the student window (periods)")
    ax.set_title("adapter minus KD, AUC (95% CI)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def dataset_entry(res: dict) -> dict:
    """One dataset's figures (run_dataset's result) as the payload's ``datasets`` entry."""
    figures = res["figures"]
    headline = next(iter(figures))
    head = figures[headline]
    cuts = res.get("cuts") or {}
    return _finite({
        "headline_world": headline, "sizes": head["examples"], "windows": head["windows"],
        "student_rule": res.get("student_rule", ""), "student_surfaces": head["student_surfaces"],
        "teacher_only_surfaces": head["teacher_only_surfaces"],
        "teachers": head["teachers"], "arms": head["arms"], "differences": head["differences"],
        "ratios": head["ratios"], "per_surface": head["per_surface"], "staleness": staleness_curve(figures),
        "row_cuts": cut_curve(figures, cuts) if cuts else [],
        "staleness_worlds": {name: {"windows": f["windows"], "teachers": f["teachers"], "examples": f["examples"],
                                    "per_surface": f["per_surface"]}
                             for name, f in figures.items() if name != headline and not is_cut(name)},
        "cut_worlds": {name: {"train_fraction": cuts[name], "examples": f["examples"], "arms": f["arms"],
                              "differences": f["differences"], "per_surface": f["per_surface"]}
                       for name, f in figures.items() if is_cut(name)},
        "timings_s": {name: f["timings_s"] for name, f in figures.items()}, "wall_s": res.get("wall_s"),
    })


def assemble(datasets: dict[str, dict], serving: dict, cfg: ExperimentConfig, seconds: float) -> dict:
    """The transfer.json payload from the datasets' entries and the serving figures."""
    sim = datasets.get("simulator", {})
    ratio = (sim.get("ratios", {}).get("transfer_ratio_combined", {}) or {}).get("auc", {})
    paths = (serving or {}).get("paths", {})
    payload = {
        "protocol": PROTOCOL,
        "transfer_ratio_combined": ratio.get("mean") if ratio.get("defined") else None,
        "transfer_ratio_combined_lo": ratio.get("lo") if ratio.get("defined") else None,
        "transfer_ratio_combined_hi": ratio.get("hi") if ratio.get("defined") else None,
        "transfer_ratio_combined_note": "" if ratio.get("defined") else ratio.get("why", "not measured"),
        "goal_combined_2x_kd": _goal(ratio),
        # the same goal in every world of the simulator's staleness sweep (the headline is gap 0)
        "goal_combined_2x_kd_by_world": {row["world"]: _goal(row.get("transfer_ratio_combined_auc") or {})
                                         for row in sim.get("staleness", [])},
        **{f"serving_{name}_p99_ms": p["p99_ms"] for name, p in paths.items()},
        **{f"serving_{name}_p50_ms": p["p50_ms"] for name, p in paths.items()},
        "datasets": datasets,
        "serving": serving,
        "config": {"seeds": cfg.seeds, "teacher_seeds": cfg.teacher_seeds, "staleness_seeds": cfg.staleness_seeds,
                   "bootstrap": cfg.bootstrap, "student": asdict(cfg.student), "optim": asdict(cfg.optim),
                   "knowledge": asdict(cfg.knowledge), "teacher_preset": cfg.teacher_preset,
                   "teacher_overrides": cfg.teacher_overrides,
                   "arms": {k: asdict(v) for k, v in cfg.arms.items()},
                   "datasets": [asdict(d) for d in cfg.datasets]},
        "wall_seconds": round(seconds, 1),
    }
    return _finite(payload)


def _goal(ratio: dict) -> bool:
    """Combined's lift at least 2x KD's, the ratio's 95% interval above 1."""
    return bool(ratio.get("defined") and ratio["mean"] >= 2 and ratio["lo"] > 1)


def _finite(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
