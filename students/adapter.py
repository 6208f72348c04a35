"""Student Adapter: per surface and task, a light model that maps the (stale) teacher's
outputs, plus a few features, to recalibrated probabilities, fit on the NEWEST labelled
window only. Its outputs, not the raw teacher's, supervise the student.

Input per impression (for task t): the teacher's own-surface joint logit for t, with
``cross_surface`` the teacher's logits for t on every surface (S), and the configured
dense features, standardised on the fit window. Model: logistic regression (``hidden``
0) or one hidden layer, fit by L-BFGS with an L2 penalty; one per (surface, task). A
logistic head starts from, and is pulled towards, the identity map on the teacher's own
logit: with few fresh labels it stays the teacher; a head whose fit window holds fewer
than ``min_labels`` clicks or non-clicks is the identity.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from students.config import AdapterConfig
from students.data import StudentTable


class StudentAdapter(nn.Module):
    def __init__(self, cfg: AdapterConfig, num_surfaces: int, num_tasks: int, dense_index: list[int]) -> None:
        super().__init__()
        self.cfg, self.num_surfaces, self.num_tasks = cfg, num_surfaces, num_tasks
        self.dense_index = list(dense_index)
        in_dim = 1 + (num_surfaces if cfg.cross_surface else 0) + len(self.dense_index)
        self.in_dim = in_dim
        self.heads = nn.ModuleList(
            nn.Sequential(nn.Linear(in_dim, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, 1)) if cfg.hidden
            else nn.Linear(in_dim, 1)
            for _ in range(num_surfaces * num_tasks))
        self.register_buffer("mean", torch.zeros(num_surfaces * num_tasks, in_dim))
        self.register_buffer("std", torch.ones(num_surfaces * num_tasks, in_dim))
        self.fitted = torch.zeros(num_surfaces * num_tasks, dtype=torch.bool)
        self.fit_window: dict[str, int] = {}

    def _inputs(self, table: StudentTable, task: int) -> torch.Tensor:
        if table.teacher_logits is None or table.teacher_all is None:
            raise ValueError("the adapter needs teacher predictions: attach_knowledge(table, repo) first")
        parts = [table.teacher_logits[:, task:task + 1]]
        if self.cfg.cross_surface:
            parts.append(table.teacher_all[:, :, task])
        parts.append(table.dense[:, self.dense_index])
        return torch.nan_to_num(torch.cat(parts, dim=1), nan=0.0)

    def fit(self, table: StudentTable) -> "StudentAdapter":
        """Fit every (surface, task) head on ``table`` (the newest window, see ``newest``)."""
        if len(table) == 0:
            raise ValueError("the adapter's newest window has no impressions")
        lo, hi = table.window_us or (int(table.event_time_us.min()), int(table.event_time_us.max()) + 1)
        self.fit_window = {"start_us": int(lo), "end_us": int(hi), "first_us": int(table.event_time_us.min()),
                           "last_us": int(table.event_time_us.max()), "examples": len(table)}
        known = torch.isfinite(table.teacher_logits).all(dim=1)
        for s in range(self.num_surfaces):
            rows = (table.surface == s) & known
            for t in range(self.num_tasks):
                k = s * self.num_tasks + t
                x, y = self._inputs(table, t)[rows], table.labels[rows, t]
                clicks = float(y.sum())
                if min(clicks, len(y) - clicks) < max(self.cfg.min_labels, 1):  # too little to recalibrate
                    self._identity(k)
                    continue
                mean, std = x.mean(0), x.std(0).clamp(min=1e-3)
                self.mean[k], self.std[k] = mean, std
                self._fit_head(k, (x - mean) / std, y)
                self.fitted[k] = True
        return self

    def _identity(self, k: int) -> None:
        head = self.heads[k]
        with torch.no_grad():
            for p in head.parameters():
                p.zero_()
            if isinstance(head, nn.Linear):
                head.weight[0, 0] = 1.0
        self.mean[k].zero_()
        self.std[k].fill_(1.0)

    def _fit_head(self, k: int, x: torch.Tensor, y: torch.Tensor) -> None:
        head = self.heads[k]
        gen = torch.Generator().manual_seed(k)
        prior = {}  # name -> the weights the penalty pulls towards (zero when absent)
        with torch.no_grad():
            if isinstance(head, nn.Linear):  # the identity on the standardised own logit
                head.weight.zero_()
                head.weight[0, 0] = self.std[k, 0]
                head.bias.fill_(float(self.mean[k, 0]))
                prior["weight"] = head.weight.detach().clone()
            else:
                for p in head.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
        opt = torch.optim.LBFGS(head.parameters(), lr=1.0, max_iter=self.cfg.max_iter, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(head(x).squeeze(1), y)
            loss = loss + self.cfg.l2 * sum(((p - prior.get(n, 0.0)) ** 2).sum()
                                            for n, p in head.named_parameters() if "weight" in n)
            loss.backward()
            return loss

        opt.step(closure)

    @torch.no_grad()
    def forward(self, table: StudentTable) -> torch.Tensor:
        """(N, T) recalibrated probabilities; NaN where the teacher never scored the row."""
        out = torch.full((len(table), self.num_tasks), float("nan"))
        known = torch.isfinite(table.teacher_logits).all(dim=1)
        for t in range(self.num_tasks):
            x = self._inputs(table, t)
            for s in range(self.num_surfaces):
                k = s * self.num_tasks + t
                rows = (table.surface == s) & known
                if rows.any():
                    z = self.heads[k]((x[rows] - self.mean[k]) / self.std[k]).squeeze(1)
                    out[rows, t] = torch.sigmoid(z)
        return out


def newest(table: StudentTable, periods: int, period_days: float) -> StudentTable:
    """The rows in the last ``periods`` periods of the table's window: ``[end - periods *
    period_days, end)`` where ``end`` is the table's window end (``window_us``), or just
    after its last impression when it carries no window. Periods are counted back from
    the window's own end, never aligned to multiples of ``period_days`` from the epoch.
    When those periods hold no clicked impression (sparse data: a weekly log's last day
    is often empty), one more period is taken at a time, back to the window's start:
    the adapter is fit on the newest periods that hold labels to learn from."""
    t = table.event_time_us
    end = table.window_us[1] if table.window_us else int(t.max()) + 1
    start = table.window_us[0] if table.window_us else int(t.min())
    period_us = int(round(period_days * 86_400 * 1e6))
    span_us = periods * period_us
    while True:
        rows = (t >= end - span_us) & (t < end)
        if float(table.labels[rows, 0].sum()) >= 1 or end - span_us <= start:
            break
        span_us += period_us
    out = table.subset(rows)
    out.window_us = (end - span_us, end)
    return out
