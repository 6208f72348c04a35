"""One shard = the examples of one (user bucket, UTC day) plus the day's history *segment*.

What is stored: every user with an example in the window keeps one run of consecutive
events, from ``max_seq_len`` events before the history end of their first example up
to their last example (the example events included: an example reads its item,
surface, click and event second from its own event). Each stored event goes to the
segment of the shard whose period holds its time; the window's first shard also takes
the stored events from before the window (the *base*). So an event is stored once in
the whole window, however many days of examples refer to it. Files: segments.py.

An example's sequence is the last ``max_seq_len`` events before its own event (events
at the same microsecond excluded, see docs) in the user's run, i.e. in the user's rows
of the segments of its bucket up to its own period (loader.py reads them), and
``history_len`` / ad counts are over the user's full history (the run's first row
carries the counts of the events before it).

Building shard (b, d) reads bucket b's staged events up to the window end in a few
columns (every user's stored run; kept per process for the bucket's next shard) and
all columns of the period's events only. Shards stay independent (any order, any
process), atomic (hidden temp dir + rename) and byte-identical on rebuild.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from gem.data.contract import ITEM_ATTRIBUTES, USER_ATTRIBUTES
from gem.features.jagged import run_starts
from gem.features.plan import BuildPlan, ShardKey
from gem.features.segments import (
    ATTRIBUTE_FEATURES,
    ENCODINGS,
    EXAMPLES_FILE,
    FORMAT,
    HISTORY_FILE,
    STATS_FILE,
    US_PER_S,
    USERS_FILE,
    pack_codes,
    ref_second,
)
from gem.features.staging import ATTRIBUTE_COLUMNS, NO_CONVERSION, read_staged
from gem.features.storage import atomic_dir, dumps, write_parquet
from gem.features.vocab import Vocabularies

SPARSE_FEATURES = ("user_id", "item_id", *ATTRIBUTE_FEATURES)
DENSE_FEATURES = ("log_history_len", "log_seconds_since_last_event", "hour_of_day_sin", "hour_of_day_cos",
                  "user_prior_ad_ctr", "log_user_prior_ad_impressions")
# the bucket's whole history is read in these columns; the period's events in all
INDEX_COLUMNS = ["user_id", "event_time", "event_id", "example", "is_ad", "click", "item", "click_known", "hidden"]
PERIOD_COLUMNS = ["user_id", "event_time", "event_id", "surface", "event_type", "conversion", "conversion_time",
                  *ATTRIBUTE_COLUMNS]
_INT32 = np.iinfo(np.int32)

_vocab_cache: dict[str, Vocabularies] = {}
_index_cache: dict[tuple, "BucketIndex"] = {}  # the last bucket indexed by this process


def list_shards(plan: BuildPlan) -> list[ShardKey]:
    """Every shard of the plan, bucket-major (independent; build in any order)."""
    return [ShardKey(bucket=b, day=d) for b in range(plan.num_buckets) for d in plan.example_days]


def length_bins(max_seq_len: int) -> list[int]:
    """Histogram edges of truncated lengths: 0, 1, 2, 4, ... < max, then [max, max+1)."""
    edges = [0, 1]
    while edges[-1] * 2 < max_seq_len:
        edges.append(edges[-1] * 2)
    return edges + [max_seq_len, max_seq_len + 1]


def _vocab(plan: BuildPlan) -> Vocabularies:
    if plan.out_dir not in _vocab_cache:
        _vocab_cache[plan.out_dir] = Vocabularies.read(Path(plan.out_dir))
    return _vocab_cache[plan.out_dir]


def _sort_by_user(h: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # staged groups are each sorted by (user, time, event_id) and come in time order, so
    # a stable sort on user alone restores (user, time, event_id); timsort uses the runs
    order = np.argsort(h["user_id"], kind="stable")
    h = {k: v[order] for k, v in h.items()}
    user, t, eid = h["user_id"], h["event_time"], h["event_id"]
    same = user[1:] == user[:-1]
    ordered = (t[1:] > t[:-1]) | ((t[1:] == t[:-1]) & (eid[1:] > eid[:-1]))
    if not np.all(~same | ordered):  # an event filed under the wrong day: full sort
        order = np.lexsort((eid, t, user))
        h = {k: v[order] for k, v in h.items()}
    return h


def _read_sorted(plan: BuildPlan, bucket: int, groups: list[int], columns: list[str], *, before_us: int,
                 from_us: int | None = None) -> dict[str, np.ndarray]:
    h = read_staged(plan, bucket, groups, before_us=before_us, from_us=from_us, columns=columns)
    return _sort_by_user(h) if h else _empty_staged(columns)


def select_examples(plan: BuildPlan, day: str, h: dict[str, np.ndarray]) -> np.ndarray:
    """bool (n,): rows of ``h`` that are examples of the shard period starting at ``day``."""
    lo, hi = plan.period_us(day)
    return h["example"] & (h["event_time"] >= lo) & (h["event_time"] < hi)


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


def index_bucket(plan: BuildPlan, bucket: int) -> BucketIndex:
    groups = plan.groups_until(plan.window_end_us)
    files = [plan.staging_file(bucket, g) for g in groups]
    key = (plan.out_dir, plan.data_dir, bucket, plan.window_start_us, plan.window_end_us, plan.max_seq_len,
           plan.include_organic, tuple((f.stat().st_mtime_ns, f.stat().st_size) for f in files))
    if key not in _index_cache:
        _index_cache.clear()
        h = _read_sorted(plan, bucket, groups, INDEX_COLUMNS, before_us=plan.window_end_us)
        _index_cache[key] = _index(h, plan.max_seq_len)
    return _index_cache[key]


def _index(h: dict[str, np.ndarray], n_max: int) -> BucketIndex:
    user, n = h["user_id"], len(h["user_id"])
    idx = np.arange(n, dtype=np.int64)
    start, tie = run_starts(user), run_starts(user, h["event_time"])
    run = np.cumsum(start == idx) - 1
    ex = np.flatnonzero(h["example"])
    with_examples, first = np.unique(run[ex], return_index=True)
    last = np.concatenate([first[1:], [len(ex)]]).astype(np.int64) - 1
    runs = int(run[-1]) + 1 if n else 0
    lo, hi = np.full(runs, n, dtype=np.int64), np.full(runs, -1, dtype=np.int64)
    # n_max visible events before the first example's history end
    visible = h["hidden"] == 0 if "hidden" in h else np.ones(n, bool)
    cum_vis = np.concatenate([[0], np.cumsum(visible, dtype=np.int64)])
    vis_idx = np.flatnonzero(visible)
    fe = ex[first]
    rank = cum_vis[tie[fe]] - n_max
    lo_first = np.where(rank > cum_vis[start[fe]], vis_idx[np.clip(rank, 0, max(len(vis_idx) - 1, 0))]
                        if len(vis_idx) else start[fe], start[fe])
    lo[with_examples] = lo_first
    if "click_known" in h and len(ex):  # a click still unknown at the first example's time: store from there
        t0 = np.full(runs, np.iinfo(np.int64).max, dtype=np.int64)
        t0[with_examples] = h["event_time"][fe]
        pending = np.flatnonzero(visible & (h["click"] > 0) & (h["click_known"] >= t0[run]) & (idx < lo[run]))
        if len(pending):
            np.minimum.at(lo, run[pending], pending)
    hi[with_examples] = ex[last]
    return BucketIndex(h=h, user_start=start, tie_start=tie, stored_from=lo[run], stored_to=hi[run])


def build_shard(plan: BuildPlan, key: ShardKey) -> dict:
    """Build one shard atomically; returns its stats (also written to stats.json)."""
    vocab = _vocab(plan)
    index = index_bucket(plan, key.bucket)
    lo, hi = plan.period_us(key.day)
    first_period = key.day == plan.example_days[0]
    t = index.h["event_time"]
    in_period = np.flatnonzero((t < hi) if first_period else (t >= lo) & (t < hi))
    period = _read_period(plan, key.bucket, None if first_period else lo, hi, index.h["event_id"][in_period])
    keep = index.stored(in_period)
    examples, history, users, stats = _assemble(plan, key, vocab, index, in_period[keep],
                                                {k: v[keep] for k, v in period.items()})
    with atomic_dir(plan.shards_dir / key.name) as tmp:
        write_parquet(examples, tmp / EXAMPLES_FILE, ENCODINGS[EXAMPLES_FILE])
        write_parquet(history, tmp / HISTORY_FILE, ENCODINGS[HISTORY_FILE])
        write_parquet(users, tmp / USERS_FILE, ENCODINGS[USERS_FILE])
        (tmp / STATS_FILE).write_text(dumps(stats))
    return stats


def _read_period(plan: BuildPlan, bucket: int, lo: int | None, hi: int, event_ids: np.ndarray) -> dict[str, np.ndarray]:
    """All PERIOD_COLUMNS of the staged events in [lo, hi), aligned with ``event_ids``
    (the same events in the index). Reads the groups holding the period's days, or
    every group when an event was filed under another day."""
    likely = plan.groups_until(hi) if lo is None else plan.groups_overlapping(lo, hi)
    for groups in (likely, plan.groups_until(plan.window_end_us)):
        h = _read_sorted(plan, bucket, groups, PERIOD_COLUMNS, before_us=hi, from_us=lo)
        if np.array_equal(h["event_id"], event_ids):
            return h
    raise RuntimeError(f"{plan.staging_dir}: bucket {bucket}'s staged events changed during the build")


def _assemble(plan: BuildPlan, key: ShardKey, vocab: Vocabularies, index: BucketIndex, seg: np.ndarray,
              period: dict[str, np.ndarray]):
    """Tables of the shard: ``seg`` (m,) are the index rows of its segment's events and
    ``period`` their period columns."""
    h = index.h
    user, t = h["user_id"][seg], h["event_time"][seg]
    new_row = np.ones(len(seg), dtype=bool)
    new_row[1:] = user[1:] != user[:-1]
    row_first = np.flatnonzero(new_row)
    g = seg[row_first]
    ustart = index.user_start[g]
    holds_first = g == index.stored_from[g]  # the row starts the user's stored run
    visible = (h["hidden"] == 0).astype(np.int64)
    cum_vis = np.concatenate([[0], np.cumsum(visible)])
    cum_ad = np.concatenate([[0], np.cumsum(h["is_ad"] * visible, dtype=np.int64)])
    cum_click = np.concatenate([[0], np.cumsum(h["is_ad"].astype(np.int64) * h["click"] * visible)])
    users = pa.table({
        "user_id": user[row_first],
        "user": vocab.ids("user_id", user[row_first]),
        "events": np.diff(np.concatenate([row_first, [len(seg)]])).astype(np.int32),
        "events_before": np.where(holds_first, cum_vis[g] - cum_vis[ustart], 0).astype(np.int32),
        "ad_impressions_before": np.where(holds_first, cum_ad[g] - cum_ad[ustart], 0).astype(np.int32),
        "ad_clicks_before": np.where(holds_first, cum_click[g] - cum_click[ustart], 0).astype(np.int32),
    })

    seconds = t // US_PER_S
    gap = np.diff(seconds, prepend=seconds[:1]) if len(seconds) else seconds
    gap[row_first] = seconds[row_first] - ref_second(key.day)
    if len(gap) and (gap.min() < _INT32.min or gap.max() > _INT32.max):
        raise ValueError(f"shard {key.name}: an event more than 68 years from its day cannot be stored")
    conversion = period["conversion_time"]
    click_known = h["click_known"][seg]
    delayed = (h["click"][seg] > 0) & (click_known > t)
    history = pa.table({
        "item": h["item"][seg].astype(np.int32),
        "code": pack_codes(period["event_type"], period["surface"], h["is_ad"][seg], h["click"][seg], h["hidden"][seg]),
        "gap_s": gap.astype(np.int32),
        "conversion_time": pa.array(conversion, mask=conversion == NO_CONVERSION),
        "click_time": pa.array(click_known, mask=~delayed),
    })

    own = np.flatnonzero(select_examples(plan, key.day, {"example": h["example"][seg], "event_time": t}))
    ex = seg[own]
    attributes = {name: period[f"attr_{name.split('_', 1)[1]}"][own] for name in ATTRIBUTE_FEATURES}
    examples = pa.table({
        "event": own.astype(np.int32),
        "ties": (ex - index.tie_start[ex]).astype(np.int32),
        "time_us": (t[own] % US_PER_S).astype(np.int32),
        "example_id": h["event_id"][ex],
        "conversion": period["conversion"][own],
        **attributes,
    })
    columns = {"surface": np.maximum(period["surface"][own] - 1, 0), "click": h["click"][ex],
               "conversion": period["conversion"][own], "user_id": vocab.ids("user_id", user[own]),
               "item_id": h["item"][ex], **attributes}
    stats = _stats(plan, key, columns, h, index.user_start[ex], index.tie_start[ex], len(seg))
    stats["delayed_clicks_stored"] = int(delayed.sum())
    return examples, history, users, stats


def dense_features(event_time_us: np.ndarray, history_len: np.ndarray, last_event_s: np.ndarray,
                   ad_impressions: np.ndarray, ad_clicks: np.ndarray) -> np.ndarray:
    """float32 (B, len(DENSE_FEATURES)), all from events strictly before the impression;
    ``last_event_s`` is ignored where ``history_len`` is 0."""
    gap_s = np.where(history_len > 0, event_time_us / US_PER_S - last_event_s, 0.0)
    angle = 2 * np.pi * (event_time_us % (86_400 * US_PER_S)) / (86_400 * US_PER_S)
    return np.stack([
        np.log1p(history_len),
        np.log1p(np.maximum(gap_s, 0.0)),
        np.sin(angle),
        np.cos(angle),
        (ad_clicks + 1.0) / (ad_impressions + 50.0),  # smoothed prior ad CTR of 2%
        np.log1p(ad_impressions),
    ], axis=1).astype(np.float32)


def _stats(plan: BuildPlan, key: ShardKey, examples: dict[str, np.ndarray], h, first, end, stored: int) -> dict:
    n_max = plan.max_seq_len
    visible = h["hidden"] == 0
    cum_vis = np.concatenate([[0], np.cumsum(visible, dtype=np.int64)])
    full = cum_vis[end] - cum_vis[first]
    used = np.minimum(full, n_max)
    unknown_item = np.concatenate([[0], np.cumsum((h["item"] == 0) & visible)])
    vis_idx = np.concatenate([np.flatnonzero(visible), [len(visible)]])
    from_idx = vis_idx[cum_vis[end] - used]  # first visible event of the used sequence
    seq_unknown = int((unknown_item[end] - unknown_item[np.minimum(from_idx, end)]).sum())
    surface, click, conversion = examples["surface"], examples["click"], examples["conversion"]
    by_surface = {}
    for i, name in enumerate(plan.surfaces):
        sel = surface == i
        by_surface[name] = {"examples": int(sel.sum()), "clicks": int(click[sel].sum()),
                            "conversions": int(conversion[sel].sum())}
    return {
        "format": FORMAT,
        "shard": key.name,
        "examples": int(len(surface)),
        "history_events_stored": int(stored),
        "sequence_elements": int(used.sum()),
        "truncated": int((full > n_max).sum()),
        "length_bins": length_bins(n_max),
        "length_hist": np.histogram(used, bins=length_bins(n_max))[0].astype(int).tolist(),
        "unknown": {name: int((examples[name] == 0).sum()) for name in SPARSE_FEATURES},
        "sequence_item_unknown": seq_unknown,
        "labels_by_surface": by_surface,
    }


def _empty_staged(columns: list[str]) -> dict[str, np.ndarray]:
    h = {c: np.zeros(0, dtype=np.int64) for c in ("user_id", "item_raw", "event_id", "event_time", "conversion_time")}
    h.update({c: np.zeros(0, dtype=np.int8) for c in ("is_ad", "event_type", "click", "conversion", "hidden")})
    h["surface"] = np.zeros(0, dtype=np.int16)
    h["click_known"] = np.zeros(0, dtype=np.int64)
    h["item"] = np.zeros(0, dtype=np.int32)
    h["example"] = np.zeros(0, dtype=bool)
    h.update({f"attr_{a}": np.zeros(0, dtype=np.int32) for a in USER_ATTRIBUTES + ITEM_ATTRIBUTES})
    return {c: h[c] for c in columns}


def read_stats(shard_dir: Path) -> dict:
    return json.loads((Path(shard_dir) / STATS_FILE).read_text())
