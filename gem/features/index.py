"""The bucket index: one pass per bucket between staging and the shards.

It reads the bucket's whole staged history once, in a few columns, and decides what
needs that history: every user's stored run (see shards.py), the counts over the
events before it, and each example's tie offset, full history length and unknown
sequence items. What each shard needs of it is written per period,

    _work/index/bucket=B/part=P.parquet   one row per stored event of period P, in
        (user, time, event id) order: event_id, its row among the shard's staged rows
        in that order (``row``: the shard takes its events by position, not by a
        lookup of their ids), the before-counts (nonzero on the row that starts its
        user's stored run), and on the period's examples ties, history_len, seq_unknown
    _work/index/bucket=B/base.parquet     the stored events from before the first
        period, every staged column (they go to the first shard's segment)

so building a shard reads its own period's staged events, its index part and nothing
else: its work follows its events, not the length of the bucket's history.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gem.features.jagged import run_starts
from gem.features.plan import BuildPlan
from gem.features.staging import (
    STAGED_COLUMNS,
    concat_columns,
    empty_staged,
    read_part,
    read_tables,
    sort_by_user,
)
from gem.features.storage import read_parquet, write_parquet_atomic

INDEX_COLUMNS = ["user_id", "event_time", "event_id", "example", "is_ad", "click", "item", "click_known", "hidden"]
BEFORE = ("events_before", "ad_impressions_before", "ad_clicks_before")
EXAMPLE = ("ties", "history_len", "seq_unknown")


@dataclass
class BucketIndex:
    """A bucket's staged events up to the window end, (user, time, event_id) ordered, in
    INDEX_COLUMNS, with every user's stored run [stored_from, stored_to] (n, -1: none).

    The run starts ``max_seq_len`` *visible* events (not ``hidden``) before the history
    end of the user's first example, or earlier at the first event whose click label
    was still unknown at that example's time: every click before the run is known to
    every example of the user, so the counts before the run never show a label early."""

    h: dict[str, np.ndarray]
    user_start: np.ndarray  # int64 (n,): the user's first event
    tie_start: np.ndarray  # int64 (n,): first event at the same (user, event_time)
    stored_from: np.ndarray  # int64 (n,), per event: its user's first stored event
    stored_to: np.ndarray  # int64 (n,), per event: its user's last stored event (last example)

    def stored(self, rows: np.ndarray) -> np.ndarray:
        return (rows >= self.stored_from[rows]) & (rows <= self.stored_to[rows])


def runs(h: dict[str, np.ndarray], n_max: int) -> BucketIndex:
    user, n = h["user_id"], len(h["user_id"])
    idx = np.arange(n, dtype=np.int64)
    start, tie = run_starts(user), run_starts(user, h["event_time"])
    run = np.cumsum(start == idx) - 1
    ex = np.flatnonzero(h["example"])
    with_examples, first = np.unique(run[ex], return_index=True)
    last = np.concatenate([first[1:], [len(ex)]]).astype(np.int64)[:len(first)] - 1  # none: a bucket without examples
    n_runs = int(run[-1]) + 1 if n else 0
    lo, hi = np.full(n_runs, n, dtype=np.int64), np.full(n_runs, -1, dtype=np.int64)
    # n_max visible events before the first example's history end
    visible = h["hidden"] == 0
    cum_vis = np.concatenate([[0], np.cumsum(visible, dtype=np.int64)])
    vis_idx = np.flatnonzero(visible)
    fe = ex[first]
    rank = cum_vis[tie[fe]] - n_max
    lo_first = np.where(rank > cum_vis[start[fe]], vis_idx[np.clip(rank, 0, max(len(vis_idx) - 1, 0))]
                        if len(vis_idx) else start[fe], start[fe])
    lo[with_examples] = lo_first
    if len(ex):  # a click still unknown at the first example's time: store from there
        t0 = np.full(n_runs, np.iinfo(np.int64).max, dtype=np.int64)
        t0[with_examples] = h["event_time"][fe]
        pending = np.flatnonzero(visible & (h["click"] > 0) & (h["click_known"] >= t0[run]) & (idx < lo[run]))
        if len(pending):
            np.minimum.at(lo, run[pending], pending)
    hi[with_examples] = ex[last]
    return BucketIndex(h=h, user_start=start, tie_start=tie, stored_from=lo[run], stored_to=hi[run])


def index_bucket(plan: BuildPlan, bucket: int) -> int:
    """Write the bucket's index parts and base; returns the staged rows read."""
    h = concat_columns([read_part(plan, bucket, p, INDEX_COLUMNS) for p in range(-1, len(plan.example_days))])
    h = sort_by_user(h) if h else empty_staged(INDEX_COLUMNS)
    index = runs(h, plan.max_seq_len)
    n = len(h["user_id"])
    rows = np.arange(n, dtype=np.int64)
    stored = np.flatnonzero(index.stored(rows)) if n else rows
    per_row = _per_row(index, plan.max_seq_len)
    row = _shard_rows(plan, h["event_time"], index.stored(rows) if n else np.zeros(0, dtype=bool))
    # the first shard's segment also holds the stored events from before its period
    part = np.maximum(plan.part_of(h["event_time"][stored]), 0)
    order = np.argsort(part, kind="stable")  # rows of a part keep their (user, time, id) order
    bounds = np.searchsorted(part[order], np.arange(len(plan.example_days) + 1))
    for p in range(len(plan.example_days)):
        seg = stored[order[bounds[p]:bounds[p + 1]]]
        write_parquet_atomic(pa.table({"event_id": h["event_id"][seg], "row": row[seg],
                                       **{k: v[seg] for k, v in per_row.items()}}), plan.index_file(bucket, p))
    base_ids = h["event_id"][stored[plan.part_of(h["event_time"][stored]) < 0]]
    kept, read = [], n
    for path in sorted(plan.part_dir(bucket, -1).glob("group=*.parquet")):  # one staged file at a time
        table = read_parquet(path, STAGED_COLUMNS)
        read += table.num_rows
        kept.append(table.filter(pa.array(np.isin(table.column("event_id").to_numpy(), base_ids))))
    base = read_tables(kept)
    base = sort_by_user(base) if base else empty_staged(STAGED_COLUMNS)
    write_parquet_atomic(pa.table(base), plan.base_file(bucket))
    return read


def _shard_rows(plan: BuildPlan, event_time: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """int64 (n,): each row's position among the rows its shard reads, in the shared
    (user, time, event id) order: the period's staged rows, and for the first period
    the stored rows from before it (the base) too; -1 for a row no shard reads."""
    source = plan.part_of(event_time)
    source = np.where(source < 0, np.where(stored, 0, -1), source)
    order = np.argsort(source, kind="stable")
    firsts = np.searchsorted(source[order], np.arange(len(plan.example_days)))
    row = np.full(len(source), -1, dtype=np.int64)
    inside = source[order] >= 0
    row[order[inside]] = np.arange(len(order))[inside] - firsts[source[order][inside]]
    return row


def _per_row(index: BucketIndex, n_max: int) -> dict[str, np.ndarray]:
    """The columns of the index parts over every row of the bucket (see the docstring)."""
    h, g, ustart = index.h, np.arange(len(index.h["user_id"]), dtype=np.int64), index.user_start
    visible = (h["hidden"] == 0).astype(np.int64)
    cum_vis = np.concatenate([[0], np.cumsum(visible)])
    cum_ad = np.concatenate([[0], np.cumsum(h["is_ad"] * visible, dtype=np.int64)])
    cum_click = np.concatenate([[0], np.cumsum(h["is_ad"].astype(np.int64) * h["click"] * visible)])
    holds_first = g == index.stored_from  # the row starts its user's stored run
    out = {"events_before": cum_vis[g] - cum_vis[ustart], "ad_impressions_before": cum_ad[g] - cum_ad[ustart],
           "ad_clicks_before": cum_click[g] - cum_click[ustart]}
    out = {k: np.where(holds_first, v, 0).astype(np.int32) for k, v in out.items()}
    ex = h["example"]
    end = index.tie_start
    full = cum_vis[end] - cum_vis[ustart]
    used = np.minimum(full, n_max)
    unknown_item = np.concatenate([[0], np.cumsum((h["item"] == 0) & (visible > 0))])
    vis_idx = np.concatenate([np.flatnonzero(visible), [len(visible)]])
    from_idx = vis_idx[cum_vis[end] - used]  # first visible event of the used sequence
    seq_unknown = unknown_item[end] - unknown_item[np.minimum(from_idx, end)]
    out["ties"] = np.where(ex, g - end, 0).astype(np.int32)
    out["history_len"] = np.where(ex, full, 0).astype(np.int32)
    out["seq_unknown"] = np.where(ex, seq_unknown, 0).astype(np.int32)
    return out


def read_index(plan: BuildPlan, bucket: int, part: int) -> dict[str, np.ndarray]:
    table = read_parquet(plan.index_file(bucket, part))
    return {name: table.column(name).to_numpy() for name in table.column_names}

