"""What a person looks at in a distill or gate run: the ROC curve and the calibration
(reliability) curve of each model on the surface's holdout, in one figure, and the ROC
points KFP's ClassificationMetrics artifact takes."""

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


def reliability(labels: np.ndarray, probs: np.ndarray, bins: int = 10) -> tuple[list[float], list[float]]:
    """(mean prediction, observed rate) per quantile bin of the predictions."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    if not len(probs) or not np.isfinite(probs).all():
        return [], []
    order = np.argsort(probs, kind="stable")
    groups = [g for g in np.array_split(order, min(bins, len(order))) if len(g)]
    return [float(probs[g].mean()) for g in groups], [float(labels[g].mean()) for g in groups]


def holdout_figure(labels: np.ndarray, models: dict[str, np.ndarray], title: str):
    """ROC and calibration curves of each model (name -> click probabilities) on the
    same holdout rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (roc_ax, cal_ax) = plt.subplots(1, 2, figsize=(10, 4))
    roc_ax.plot([0, 1], [0, 1], "--", color="grey", label="random")
    top = 1e-3
    for name, probs in models.items():
        curve = roc_points(labels, probs)
        if curve["fpr"]:
            roc_ax.plot(curve["fpr"], curve["tpr"], label=name)
        pred, observed = reliability(labels, probs)
        if pred:
            cal_ax.plot(pred, observed, "o-", label=name)
            top = max(top, *pred, *observed)
    cal_ax.plot([0, top], [0, top], "--", color="grey", label="ideal")
    roc_ax.set(xlabel="false positive rate", ylabel="true positive rate", title=f"ROC: {title}")
    cal_ax.set(xlabel="mean predicted probability", ylabel="observed rate", title=f"calibration: {title}")
    roc_ax.legend()
    cal_ax.legend()
    fig.tight_layout()
    return fig
