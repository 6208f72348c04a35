"""The evaluation protocol's invariants: windows that never overlap, rows that stay in
their window.

    check_windows({"teacher": (a, b), "train": (b, c), "validation": (c, d), "evaluation": (d, e)})
    check_rows(train=train_table, validation=valid_table, evaluation=eval_table)
    lineage(out.windows, teacher_version=..., refresh_every="1d")   # lineage.* tags for MLflow

Windows are ``[start, end)`` pairs (ISO strings, datetimes or microseconds); every pair
of windows must be disjoint. ``check_rows`` refuses an impression (example id) that sits
in two tables, or a row outside its table's window: an evaluation row can never reach
training, validation or the adapter's fit (the adapter fits on a slice of ``train``).
"""

from __future__ import annotations

import datetime as dt
from itertools import combinations

import numpy as np

from gem.protocol import window_tag


def to_us(value) -> int:
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, str):
        from gem.data.contract import parse_utc

        value = parse_utc(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return int(round(value.timestamp() * 1e6))
    raise TypeError(f"not a time: {value!r}")


def check_windows(windows: dict[str, tuple]) -> dict[str, tuple[int, int]]:
    """Every window non-empty and pairwise disjoint; returns them in microseconds."""
    us = {name: (to_us(lo), to_us(hi)) for name, (lo, hi) in windows.items()}
    for name, (lo, hi) in us.items():
        if hi <= lo:
            raise ValueError(f"window {name} [{lo}, {hi}) is empty")
    for (a, (alo, ahi)), (b, (blo, bhi)) in combinations(us.items(), 2):
        if alo < bhi and blo < ahi:
            raise ValueError(f"windows {a} {windows[a]} and {b} {windows[b]} overlap")
    return us


def check_rows(**tables) -> None:
    """Tables (StudentTable or None) hold disjoint impressions, each inside its window."""
    present = {name: t for name, t in tables.items() if t is not None and len(t)}
    for (a, ta), (b, tb) in combinations(present.items(), 2):  # the most specific refusal first
        shared = np.intersect1d(ta.example_id.numpy(), tb.example_id.numpy())
        if len(shared):
            raise ValueError(f"{len(shared)} impression(s) are in both {a} and {b} (e.g. {int(shared[0])})")
    for name, t in present.items():
        if t.window_us:
            lo, hi = t.window_us
            times = t.event_time_us
            if bool((times < lo).any()) or bool((times >= hi).any()):
                raise ValueError(f"table {name} has rows outside its window [{lo}, {hi})")
    check_windows({name: t.window_us for name, t in present.items() if t.window_us})


def iso(us: int) -> str:
    return dt.datetime.fromtimestamp(int(us) / 1e6, tz=dt.timezone.utc).isoformat()


def window_text(window) -> str:
    """``start..end`` (ISO; gem.protocol.window_tag's spelling) of a ``[start_us, end_us)``
    pair; "" for none."""
    return window_tag(iso(window[0]), iso(window[1])) if window else ""


def lineage(windows: dict[str, list[int]], *, teacher_version: str = "", teacher_window: str = "",
            knowledge_window: list[str] | None = None, refresh_every: str = "") -> dict[str, str]:
    """A student's lineage as flat ``lineage.*`` strings (MLflow params and model-version
    tags): which teacher, trained on which window, whose knowledge over which window was
    read at which cadence, and the train / validation / adapter-fit / evaluation windows."""
    out = {"lineage.teacher_version": teacher_version or "none", "lineage.teacher_window": teacher_window or "unknown",
           "lineage.knowledge_window": window_tag(*knowledge_window) if knowledge_window else "none",
           "lineage.knowledge_cadence": refresh_every or "none"}
    for name in ("train", "validation", "adapter_fit", "evaluation"):
        out[f"lineage.{name}_window"] = window_text(windows.get(name)) or "none"
    return out
