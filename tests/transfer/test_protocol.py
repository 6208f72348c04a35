"""The protocol cannot flatter: disjoint windows, no evaluation row in training,
validation or the adapter's fit, and the adapter fit on the newest days of its window."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import torch

from gem.config import from_dict
from students.adapter import newest
from students.config import DistillConfig, StudentModelConfig
from students.data import StudentTable, attach_knowledge, load_table, split_at
from students.distill import distill
from students.protocol import check_rows, check_windows

STUDENT = {"embedding_dim": 8, "history_len": 4, "mlp_hidden": [16, 8]}
DAY = 86_400 * 10**6


def _table(start: dt.datetime, days: int, per_day: int = 4, every_days: int = 1) -> StudentTable:
    """``per_day`` impressions on every ``every_days``-th day of ``days``, one in four clicked."""
    start_us = int(start.timestamp() * 1e6)
    t = torch.tensor([start_us + d * DAY + k * (DAY // per_day) for d in range(0, days, every_days)
                      for k in range(per_day)])
    n = len(t)
    labels = torch.zeros(n, 2)
    labels[::4, 0] = 1.0
    table = StudentTable(sparse=torch.zeros(n, 1, dtype=torch.long), history=torch.zeros(n, 1, dtype=torch.long),
                         dense=torch.zeros(n, 1), surface=torch.zeros(n, dtype=torch.long), labels=labels,
                         example_id=torch.arange(n), event_time_us=t, user_raw=torch.arange(n),
                         item_raw=torch.arange(n))
    table.window_us = (start_us, start_us + days * DAY)
    return table


def test_adapter_newest_periods_are_the_last_days_of_the_actual_window():
    # MovieLens-like: weekly periods from a Sunday (1997-11-09); the epoch is a Thursday,
    # so epoch-aligned weeks would cut the newest "week" to 3 days
    table = _table(dt.datetime(1997, 11, 9, tzinfo=dt.timezone.utc), 14)
    part = newest(table, 1, 7.0)
    first = dt.datetime(1997, 11, 16, tzinfo=dt.timezone.utc)
    assert len(part) == 7 * 4 and int(part.event_time_us.min()) == int(first.timestamp() * 1e6)
    assert part.window_us == (int(first.timestamp() * 1e6), table.window_us[1])
    train, valid = split_at(table, table.window_us[1] - 2 * DAY)
    assert newest(train, 1, 7.0).window_us == (train.window_us[1] - 7 * DAY, train.window_us[1])
    assert int(newest(train, 1, 7.0).event_time_us.max()) < valid.window_us[0]


def test_adapter_window_of_a_sparse_log_reaches_back_to_the_newest_labelled_day():
    # impressions on every 7th day only: the window's last day is empty, so the newest
    # one-day period is widened a day at a time until it holds clicked impressions
    table = _table(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), 30, every_days=7)  # days 0, 7, ..., 28
    table.window_us = (table.window_us[0], table.window_us[0] + 31 * DAY)  # days 29, 30 hold nothing
    part = newest(table, 1, 1.0)
    assert part.window_us == (table.window_us[1] - 3 * DAY, table.window_us[1])  # day 28 onwards
    assert len(part) == 4 and float(part.labels[:, 0].sum()) == 1.0
    unlabelled = table.subset(table.event_time_us < table.window_us[0] + 28 * DAY)
    unlabelled.labels[:] = 0.0
    unlabelled.window_us = table.window_us
    assert newest(unlabelled, 1, 1.0).window_us[0] <= table.window_us[0]  # no click anywhere: the whole window


def test_windows_must_be_disjoint_and_rows_stay_in_their_window():
    check_windows({"teacher": ("2026-01-01", "2026-01-03"), "train": ("2026-01-03", "2026-01-05"),
                   "validation": ("2026-01-05", "2026-01-06"), "evaluation": ("2026-01-06", "2026-01-07")})
    with pytest.raises(ValueError, match="overlap"):
        check_windows({"train": ("2026-01-03", "2026-01-05"), "evaluation": ("2026-01-04", "2026-01-06")})
    table = _table(dt.datetime(2026, 1, 3, tzinfo=dt.timezone.utc), 4)
    train, evaluation = split_at(table, table.window_us[0] + 3 * DAY)
    check_rows(train=train, evaluation=evaluation)
    with pytest.raises(ValueError):  # training rows cut from a window that reaches the evaluation's
        check_rows(train=table.subset(torch.arange(len(table))), evaluation=evaluation)
    leaked = table.subset(torch.arange(len(train) + 1))  # one evaluation impression among the training rows
    leaked.window_us = None
    with pytest.raises(ValueError, match="both"):
        check_rows(train=leaked, evaluation=evaluation)


def test_distill_keeps_evaluation_rows_out_of_training_validation_and_adapter(world, monkeypatch):
    """Every table that reaches a training loop, an early-stopping check or the adapter's
    fit is recorded as it is passed (the real functions still run): no evaluation
    impression is among them, and validation rows are never trained on."""
    import students.distill as distill_module
    from students.adapter import StudentAdapter

    seen: dict[str, list[torch.Tensor]] = {"train": [], "validation": [], "adapter_fit": []}
    real_train, real_fit = distill_module.train_student, StudentAdapter.fit

    def train_spy(model, table, optim, **kw):
        seen["train"].append(table.example_id.clone())
        if kw.get("valid") is not None:
            seen["validation"].append(kw["valid"].example_id.clone())
        return real_train(model, table, optim, **kw)

    def fit_spy(self, table):
        seen["adapter_fit"].append(table.example_id.clone())
        return real_fit(self, table)

    monkeypatch.setattr(distill_module, "train_student", train_spy)
    monkeypatch.setattr(StudentAdapter, "fit", fit_spy)
    cfg_student = from_dict(StudentModelConfig, STUDENT)
    train, spec = load_table(world.features["student"], cfg_student)
    evaluation, _ = load_table(world.features["eval"], cfg_student)
    train, evaluation = attach_knowledge(train, world.repo), attach_knowledge(evaluation, world.repo)
    cfg = from_dict(DistillConfig, {"student": STUDENT, "surfaces": ["feed", "video"], "validation_days": 0.25,
                                    "optim": {"epochs": 2, "batch_size": 64, "patience": 1},
                                    "transfer": {"adapter": {"weight": 0.5}, "hierarchical": {"weight": 0.2,
                                                                                              "epochs": 1}},
                                    "period_days": 0.25})
    out = distill(train, evaluation, spec, cfg)
    eval_ids = evaluation.example_id.numpy()
    assert all(seen.values()), {k: len(v) for k, v in seen.items()}  # students, domain models and the adapter ran
    for role, tables in seen.items():
        for ids in tables:
            assert not np.isin(ids.numpy(), eval_ids).any(), f"an evaluation row reached {role}"
    valid_ids = np.concatenate([v.numpy() for v in seen["validation"]])
    for ids in seen["train"] + seen["adapter_fit"]:
        assert not np.isin(ids.numpy(), valid_ids).any(), "a validation row was trained on"
    w = out.windows
    check_windows({k: tuple(v) for k, v in w.items() if k != "adapter_fit"})
    assert w["train"][1] == w["validation"][0] <= w["evaluation"][0]
    assert w["train"][0] <= w["adapter_fit"][0] and w["adapter_fit"][1] == w["train"][1]  # newest of train only
    assert out.adapter.fit_window["last_us"] < w["validation"][0]
    assert out.students["feed"].selection["epochs_run"] >= 1
    with pytest.raises(ValueError, match="both"):  # the evaluation rows themselves, passed as training rows
        distill(evaluation, evaluation, spec, cfg)
