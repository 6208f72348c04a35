"""Evaluation plots logged as MLflow artifacts (matplotlib, headless)."""

from __future__ import annotations


def calibration_figure(curves: dict[str, tuple[list[float], list[float], list[float]]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4), squeeze=False)
    for ax, (task, (pred, observed, _count)) in zip(axes[0], curves.items()):
        top = max(pred + observed + [1e-3])
        ax.plot([0, top], [0, top], "--", color="grey", label="ideal")
        ax.plot(pred, observed, "o-", label="model")
        ax.set_xlabel("mean predicted probability")
        ax.set_ylabel("observed rate")
        ax.set_title(f"calibration: {task}")
        ax.legend()
    fig.tight_layout()
    return fig


def surface_auc_figure(metrics: dict[str, float], surfaces: list[str], tasks: list[str]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = surfaces + ["all"]
    fig, ax = plt.subplots(figsize=(1.5 * len(groups) + 2, 4))
    width = 0.8 / len(tasks)
    for t, task in enumerate(tasks):
        values = [metrics.get(f"auc/{g}/{task}", float("nan")) for g in groups]
        ax.bar([i + t * width for i in range(len(groups))], values, width, label=task)
    ax.set_xticks([i + width * (len(tasks) - 1) / 2 for i in range(len(groups))], groups)
    ax.set_ylim(0.4, 1.0)
    ax.set_ylabel("AUC")
    ax.set_title("AUC per surface")
    ax.legend()
    fig.tight_layout()
    return fig
