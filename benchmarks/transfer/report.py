"""The experiment's outputs: benchmarks/results/transfer.json payload, a markdown
comparison table and a lift plot (MLflow artifacts)."""

from __future__ import annotations

import math

from benchmarks.transfer.experiment import BASELINE, ExperimentConfig, transfer_ratio


def _fmt(entry: dict | None, scale: float = 1.0) -> str:
    if not entry:
        return "n/a"
    return f"{entry['mean'] * scale:+.4f} ± {entry['std'] * scale:.4f}"


def teacher_surface_mean(metrics: dict, kind: str = "auc", task: str = "click") -> float:
    """The stale teacher's metric averaged over surfaces (comparable with the students')."""
    from gem.data.contract import SURFACES

    values = [metrics[f"{kind}/{s}/{task}"] for s in SURFACES if f"{kind}/{s}/{task}" in metrics]
    return sum(values) / len(values) if values else float("nan")


def comparison_table(summary: dict, results: dict) -> str:
    lines = []
    for ds, methods in summary.items():
        teacher = results[ds]["teacher_metrics"]
        lines += [f"## {ds}", "",
                  f"stale teacher on the eval window: AUC(click) all surfaces pooled "
                  f"{teacher.get('auc/all/click', float('nan')):.4f}, mean over surfaces "
                  f"{teacher_surface_mean(teacher):.4f}; NE(click) mean over surfaces "
                  f"{teacher_surface_mean(teacher, 'ne'):.4f}", "",
                  "| method | AUC click (mean over surfaces) | AUC lift click | NE lift click | AUC lift conv "
                  "| NE lift conv |",
                  "|---|---|---|---|---|---|"]
        for method, entry in methods.items():
            absolute = entry.get("auc_lift_click", {}).get("absolute_mean", float("nan"))
            lines.append(f"| {method} | {absolute:.4f} | {_fmt(entry.get('auc_lift_click'))} | "
                         f"{_fmt(entry.get('ne_lift_click'))} | {_fmt(entry.get('auc_lift_conversion'))} | "
                         f"{_fmt(entry.get('ne_lift_conversion'))} |")
        lines += ["", f"transfer ratio (adapter / KD, AUC click lift): {transfer_ratio(summary, ds):.3f}; "
                      f"(NE click lift): {transfer_ratio(summary, ds, 'ne'):.3f}", ""]
    return "\n".join(lines) + "\n"


def lift_figure(summary: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(summary)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), squeeze=False)
    for ax, kind in zip(axes[0], ("auc", "ne")):
        methods = sorted({m for ds in datasets for m in summary[ds] if m != BASELINE})
        width = 0.8 / max(len(methods), 1)
        for i, method in enumerate(methods):
            means = [summary[ds].get(method, {}).get(f"{kind}_lift_click", {}).get("mean", float("nan"))
                     for ds in datasets]
            stds = [summary[ds].get(method, {}).get(f"{kind}_lift_click", {}).get("std", 0.0) for ds in datasets]
            ax.bar([j + i * width for j in range(len(datasets))], means, width, yerr=stds, label=method)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks([j + width * (len(methods) - 1) / 2 for j in range(len(datasets))], datasets)
        ax.set_title(f"{kind.upper()} lift over the no-teacher student (click, mean ± std over seeds)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_results(summary: dict, results: dict, latency: dict, cfg: ExperimentConfig, seconds: float) -> dict:
    per_dataset = {}
    for ds, methods in summary.items():
        per_dataset[ds] = {
            "teacher_version": results[ds]["teacher_version"],
            "teacher_eval": {**{k: v for k, v in results[ds]["teacher_metrics"].items() if "/all/" in k},
                             **{f"{kind}/surface_mean/{task}": teacher_surface_mean(results[ds]["teacher_metrics"],
                                                                                     kind, task)
                                for kind in ("auc", "ne") for task in ("click", "conversion")}},
            "examples": results[ds]["examples"], "windows": results[ds]["windows"],
            "timings_s": results[ds]["timings"],
            "knowledge_examples_per_s": results[ds]["knowledge_examples_per_s"],
            "transfer_ratio_auc": transfer_ratio(summary, ds), "transfer_ratio_ne": transfer_ratio(summary, ds, "ne"),
            "methods": methods,
        }
    first = next(iter(summary), None)
    ratios = [r for res in results.values() for r in res["flops_ratio"].values()]
    payload = {
        "transfer_ratio": transfer_ratio(summary, "simulator") if "simulator" in summary else
        (transfer_ratio(summary, first) if first else float("nan")),
        "transfer_ratio_ne": transfer_ratio(summary, "simulator", "ne") if "simulator" in summary else float("nan"),
        "student_p99_ms": latency.get("end_to_end", {}).get("p99_ms", float("nan")),
        "student_p50_ms": latency.get("end_to_end", {}).get("p50_ms", float("nan")),
        "student_score_only_p99_ms": latency.get("score_only", {}).get("p99_ms", float("nan")),
        "student_p99_ms_online_items": latency.get("online_items", {}).get("end_to_end", {}).get("p99_ms",
                                                                                                  float("nan")),
        "feast_sdk_fetch_p99_ms": latency.get("feast_sdk_fetch", {}).get("p99_ms", float("nan")),
        "student_flops_ratio": max(ratios) if ratios else float("nan"),
        "student_flops_ratio_by_method": {ds: res["flops_ratio"] for ds, res in results.items()},
        "seeds": list(cfg.seeds),
        "lift_definition": "method minus no_teacher per surface (AUC) / no_teacher minus method (NE), "
                           "mean over surfaces, then mean and std over seeds",
        "latency": latency,
        "datasets": per_dataset,
        "wall_seconds": round(seconds, 1),
    }
    return _finite(payload)


def _finite(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
