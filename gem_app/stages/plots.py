"""What a person looks at in a distill or gate run: the ROC curve and the calibration
(reliability) curve of each model on the surface's holdout, in one figure, with 95%
bands, and the ROC points KFP's ClassificationMetrics artifact takes; on the pipeline's
parent run, every surface's paired differences with their intervals as error bars."""

from __future__ import annotations

import numpy as np


def roc_points(labels: np.ndarray, scores: np.ndarray, points: int = 200) -> dict[str, list[float]]:
    """The ROC curve thinned to at most ``points`` points (empty without both classes)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels) > 0.5
    if not len(scores) or labels.all() or not labels.any() or not np.isfinite(scores).all():
        return {"fpr": [], "tpr": [], "thresholds": []}
    order = np.argsort(-scores, kind="stable")
    scores, labels = scores[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]  # last index of each distinct score
    tpr = np.cumsum(labels)[last] / labels.sum()
    fpr = np.cumsum(~labels)[last] / (~labels).sum()
    pick = np.unique(np.linspace(0, len(last) - 1, min(points, len(last))).round().astype(int))
    return {"fpr": [0.0, *fpr[pick].tolist()], "tpr": [0.0, *tpr[pick].tolist()],
            "thresholds": [1.0, *scores[last][pick].tolist()]}


def _quantile_bins(labels: np.ndarray, probs: np.ndarray, bins: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(predictions, labels) of each quantile bin of the predictions; none when a
    prediction is not finite."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    if not len(probs) or not np.isfinite(probs).all():
        return []
    order = np.argsort(probs, kind="stable")
    return [(probs[g], labels[g]) for g in np.array_split(order, min(bins, len(order))) if len(g)]


def reliability(labels: np.ndarray, probs: np.ndarray, bins: int = 10) -> tuple[list[float], list[float]]:
    """(mean prediction, observed rate) per quantile bin of the predictions."""
    groups = _quantile_bins(labels, probs, bins)
    return [float(p.mean()) for p, _ in groups], [float(y.mean()) for _, y in groups]


def roc_band(labels: np.ndarray, scores: np.ndarray, replicates: int = 100, seed: int = 0,
             grid: int = 101) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(false positive rates, 2.5% and 97.5% true positive rates) of the ROC curve over
    bootstrap resamples of the rows; empty arrays without both classes."""
    labels = np.asarray(labels) > 0.5
    scores = np.asarray(scores, dtype=np.float64)
    fpr = np.linspace(0, 1, grid)
    rng = np.random.default_rng(seed)
    curves = []
    for _ in range(replicates if labels.any() and not labels.all() else 0):
        pick = rng.integers(0, len(labels), len(labels))
        curve = roc_points(labels[pick], scores[pick], points=grid)
        if curve["fpr"]:
            curves.append(np.interp(fpr, curve["fpr"], curve["tpr"]))
    if not curves:
        return np.array([]), np.array([]), np.array([])
    lo, hi = np.percentile(np.stack(curves), [2.5, 97.5], axis=0)
    return fpr, lo, hi


def reliability_interval(labels: np.ndarray, probs: np.ndarray, bins: int = 10) -> list[float]:
    """The half-width of each ``reliability`` bin's 95% binomial interval of the observed rate."""
    return [1.96 * float(np.sqrt(y.mean() * (1 - y.mean()) / len(y))) for _, y in _quantile_bins(labels, probs, bins)]


def holdout_figure(labels: np.ndarray, models: dict[str, np.ndarray], title: str):
    """ROC and calibration curves of each model (name -> click probabilities) on the
    same holdout rows, with 95% bands: bootstrap over rows for the ROC, binomial per
    bin for the observed rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (roc_ax, cal_ax) = plt.subplots(1, 2, figsize=(10, 4))
    roc_ax.plot([0, 1], [0, 1], "--", color="grey", label="random")
    top = 1e-3
    for name, probs in models.items():
        curve = roc_points(labels, probs)
        if curve["fpr"]:
            (line,) = roc_ax.plot(curve["fpr"], curve["tpr"], label=name)
            fpr, lo, hi = roc_band(labels, probs)
            roc_ax.fill_between(fpr, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
        pred, observed = reliability(labels, probs)
        if pred:
            cal_ax.errorbar(pred, observed, yerr=reliability_interval(labels, probs), fmt="o-", capsize=2,
                            label=name)
            top = max(top, *pred, *observed)
    cal_ax.plot([0, top], [0, top], "--", color="grey", label="ideal")
    roc_ax.set(xlabel="false positive rate", ylabel="true positive rate", title=f"ROC (95% band): {title}")
    cal_ax.set(xlabel="mean predicted probability", ylabel="observed rate", title=f"calibration: {title}")
    roc_ax.legend()
    cal_ax.legend()
    fig.tight_layout()
    return fig


def surfaces_figure(rows: list[dict]):
    """Per surface, the student's AUC lift over its no-teacher reference and its AUC
    minus its teacher's, each paired on the surface's holdout with its 95% interval as an
    error bar (``rows``: summary rows; a surface without a figure is left out of that
    panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("lift_auc", "student - no-teacher AUC (the gate's lift)"),
              ("vs_teacher_auc", "student - teacher AUC")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 1.2 + 0.32 * max(len(rows), 1)), sharey=True)
    names = [r["surface"] for r in rows]
    for ax, (key, title) in zip(axes, panels):
        for i, r in enumerate(rows):
            mean, lo, hi = r.get(key), r.get(f"{key}_lo"), r.get(f"{key}_hi")
            if mean is None or lo is None or hi is None:
                continue
            color = "tab:green" if lo > 0 else "tab:red" if hi < 0 else "tab:grey"
            ax.errorbar(mean, i, xerr=[[mean - lo], [hi - mean]], fmt="o", color=color, capsize=3)
            ax.annotate(f"{mean:+.4f} [{lo:+.4f}, {hi:+.4f}]", (hi, i), xytext=(4, -3), textcoords="offset points",
                        fontsize=7)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set(title=title, xlabel="difference (95% paired interval)")
        left, right = ax.get_xlim()
        ax.set_xlim(left, right + 0.7 * (right - left))  # room for the printed interval
    axes[0].set_yticks(range(len(names)), names)
    axes[0].invert_yaxis()
    fig.tight_layout()
    return fig
