"""LogLossSums, the sum states behind gem.training.metrics (a torchmetrics Metric, so
this module loads torchmetrics: imported when metrics are made)."""

from __future__ import annotations

import torch
from torchmetrics import Metric

EPS = 1e-7


class LogLossSums(Metric):
    """Per (group, task) sums of log loss, predictions, labels, counts, where the last
    group is "all"; and a per-task calibration histogram over predicted probability."""

    full_state_update = False

    def __init__(self, num_groups: int, num_tasks: int, bins: int = 20) -> None:
        super().__init__()
        self.num_groups, self.bins = num_groups, bins
        for name in ("loss", "pred", "label", "count"):
            self.add_state(name, torch.zeros(num_groups, num_tasks, dtype=torch.float64), dist_reduce_fx="sum")
        for name in ("bin_pred", "bin_label", "bin_count"):
            self.add_state(name, torch.zeros(num_tasks, bins, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, probs: torch.Tensor, labels: torch.Tensor, group: torch.Tensor) -> None:
        p = probs.double().clamp(EPS, 1 - EPS)
        y = labels.double()
        loss = -(y * p.log() + (1 - y) * (1 - p).log())
        for name, value in (("loss", loss), ("pred", p), ("label", y), ("count", torch.ones_like(p))):
            getattr(self, name).index_add_(0, group, value)
            getattr(self, name)[-1] += value.sum(dim=0)
        bin_idx = (p * self.bins).long().clamp(max=self.bins - 1)
        for t in range(p.shape[1]):
            self.bin_pred[t].index_add_(0, bin_idx[:, t], p[:, t])
            self.bin_label[t].index_add_(0, bin_idx[:, t], y[:, t])
            self.bin_count[t].index_add_(0, bin_idx[:, t], torch.ones_like(p[:, t]))

    def compute(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in
                ("loss", "pred", "label", "count", "bin_pred", "bin_label", "bin_count")}
