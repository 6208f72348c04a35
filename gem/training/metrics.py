"""Evaluation metrics per surface and task: AUC, normalized entropy, calibration.

NE = mean log loss / entropy of the observed positive rate (lower is better, 1.0 is
the constant predictor). Calibration = mean prediction / observed rate (1.0 is ideal).
All states are sums, so they reduce across ranks (torchmetrics syncs them).
torchmetrics (~0.7 s of imports) loads when a SurfaceTaskMetrics is made, not with this
module: a process that imports students.train only to score (a student gate) needs none.
"""

from __future__ import annotations

import math

import torch

from gem.utils.evidence import enough_for_auc


class SurfaceTaskMetrics:
    """``update(probs (B, T), labels (B, T), surface (B,))``; ``compute()`` ->
    ``{"auc/<surface|all>/<task>": ..., "ne/...", "calibration/...", "logloss/...", "count/...",
    "positives/...", "negatives/..."}``; no AUC where the group has fewer than
    gem.utils.evidence.MIN_AUC_EVIDENCE positives or negatives."""

    def __init__(self, surfaces: list[str], tasks: list[str], device: torch.device | str = "cpu") -> None:
        self.surfaces, self.tasks = list(surfaces), list(tasks)
        from torchmetrics.classification import BinaryAUROC

        from gem.training.metric_sums import LogLossSums

        groups = len(self.surfaces) + 1
        self.sums = LogLossSums(groups, len(self.tasks)).to(device)
        self.aucs = [[BinaryAUROC().to(device) for _ in self.tasks] for _ in range(groups)]

    def update(self, probs: torch.Tensor, labels: torch.Tensor, surface: torch.Tensor) -> None:
        probs, labels = probs.detach().float(), labels.detach().float()
        self.sums.update(probs, labels, surface)
        for g in range(len(self.surfaces)):
            mask = surface == g
            for t in range(len(self.tasks)):
                self.aucs[g][t].update(probs[mask, t], labels[mask, t].long())
        for t in range(len(self.tasks)):
            self.aucs[-1][t].update(probs[:, t], labels[:, t].long())

    def compute(self) -> dict[str, float]:
        sums = self.sums.compute()
        out: dict[str, float] = {}
        names = self.surfaces + ["all"]
        for g, group in enumerate(names):
            for t, task in enumerate(self.tasks):
                count = float(sums["count"][g, t])
                positives = float(sums["label"][g, t])
                if count == 0:
                    continue
                rate = positives / count
                logloss = float(sums["loss"][g, t]) / count
                out[f"logloss/{group}/{task}"] = logloss
                out[f"count/{group}/{task}"] = count
                out[f"positives/{group}/{task}"] = positives
                out[f"negatives/{group}/{task}"] = count - positives
                if 0 < rate < 1:
                    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
                    out[f"ne/{group}/{task}"] = logloss / entropy
                    out[f"calibration/{group}/{task}"] = float(sums["pred"][g, t]) / positives
                if enough_for_auc(positives, count - positives):  # else "n/a": no AUC on a handful of rows
                    out[f"auc/{group}/{task}"] = float(self.aucs[g][t].compute())
        return out

    def calibration_curve(self) -> dict[str, tuple[list[float], list[float], list[float]]]:
        """task -> (mean prediction, observed rate, count) per non-empty bin."""
        sums = self.sums.compute()
        curves = {}
        for t, task in enumerate(self.tasks):
            count = sums["bin_count"][t]
            keep = count > 0
            curves[task] = (
                (sums["bin_pred"][t][keep] / count[keep]).tolist(),
                (sums["bin_label"][t][keep] / count[keep]).tolist(),
                count[keep].tolist(),
            )
        return curves
