"""One shard = the examples of one (user bucket, UTC day) plus their users' histories.

Layout of ``OUT/shards/b003-2026-01-05/`` (``days_per_shard`` > 1: the period's first day):

- ``examples.parquet``, one row per example (impression), ordered by (user, time,
  event_id): ``example_id``, ``event_time`` (us), ``surface`` (index into SURFACES),
  ``click``, ``conversion``, ``history_row`` and ``history_end`` (the reference into
  history.parquet), ``history_len`` (full history length before truncation),
  ``ad_impressions_before`` and ``ad_clicks_before`` (over the full history), one int32
  column per sparse feature. Dense features are computed from these by the loader.
- ``history.parquet``, one row per user of the shard: ``user_id``, ``first_event_s``
  and list columns ``item`` (dense id), ``event_type``, ``surface``, ``is_ad``,
  ``click``, ``conversion_time`` (us, null without conversion), ``gap_s`` (whole
  seconds since the row's previous event; event seconds are floored, so an age computed
  from them is never smaller than the true age): the user's events in (time,
  event_id) order, stored once, covering every example of the shard: from
  ``max_seq_len`` events before the user's first example up to the user's last one.
- ``stats.json``: counts and histograms for the validation report.

An example's sequence is ``history[history_row][max(0, history_end - max_seq_len):history_end]``:
the events strictly before its event_time (same-time events excluded, see docs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from gem.data.contract import ITEM_ATTRIBUTES, SURFACES, USER_ATTRIBUTES
from gem.features.jagged import ragged_arange, run_starts
from gem.features.plan import BuildPlan, ShardKey
from gem.features.staging import ATTRIBUTE_COLUMNS, NO_CONVERSION, read_staged
from gem.features.storage import atomic_dir, dumps, write_parquet
from gem.features.vocab import Vocabularies

SPARSE_FEATURES = ("user_id", "item_id", *(f"user_{a}" for a in USER_ATTRIBUTES),
                   *(f"item_{a}" for a in ITEM_ATTRIBUTES))
DENSE_FEATURES = ("log_history_len", "log_seconds_since_last_event", "hour_of_day_sin", "hour_of_day_cos",
                  "user_prior_ad_ctr", "log_user_prior_ad_impressions")
HISTORY_LISTS = ("item", "event_type", "surface", "is_ad", "click", "conversion_time", "gap_s")
EXAMPLES_FILE, HISTORY_FILE, STATS_FILE = "examples.parquet", "history.parquet", "stats.json"
US_PER_S = 1_000_000
STAGED_FOR_SHARDS = ["user_id", "item", "event_id", "event_time", "is_ad", "surface", "event_type", "click",
                     "conversion", "conversion_time", "example", *ATTRIBUTE_COLUMNS]

_vocab_cache: dict[str, Vocabularies] = {}


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


def select_examples(plan: BuildPlan, day: str, h: dict[str, np.ndarray]) -> np.ndarray:
    """bool (n,): rows of ``h`` that are examples of the shard period starting at ``day``."""
    lo, hi = plan.period_us(day)
    return h["example"] & (h["event_time"] >= lo) & (h["event_time"] < hi)


def build_shard(plan: BuildPlan, key: ShardKey) -> dict:
    """Build one shard atomically; returns its stats (also written to stats.json)."""
    vocab = _vocab(plan)
    lo, hi = plan.period_us(key.day)
    groups = plan.groups_until(hi)
    period_groups = plan.groups_overlapping(lo, hi)
    today = read_staged(plan, key.bucket, period_groups, before_us=hi,
                        columns=["user_id", "event_time", "example"]) if period_groups else {}
    users = np.unique(today["user_id"][select_examples(plan, key.day, today)]) if today else np.zeros(0, np.int64)
    h = read_staged(plan, key.bucket, groups, before_us=hi, columns=STAGED_FOR_SHARDS) if len(users) else {}
    if h:
        keep = np.isin(h["user_id"], users)
        h = _sort_by_user({k: v[keep] for k, v in h.items()})
    else:
        h = _empty_staged()
    examples, history, stats = _assemble(plan, key, vocab, h)
    with atomic_dir(plan.shards_dir / key.name) as tmp:
        write_parquet(examples, tmp / EXAMPLES_FILE)
        write_parquet(history, tmp / HISTORY_FILE)
        (tmp / STATS_FILE).write_text(dumps(stats))
    return stats


def _assemble(plan: BuildPlan, key: ShardKey, vocab: Vocabularies, h: dict[str, np.ndarray]):
    n_max = plan.max_seq_len
    user, t = h["user_id"], h["event_time"]
    seg_start = run_starts(user)
    ex = np.flatnonzero(select_examples(plan, key.day, h))
    end = run_starts(user, t)[ex]  # first event at the impression's time: strictly-before cut
    first = seg_start[ex]
    # one history row per user: [max(first, first example end - N), last example end)
    new_user = np.ones(len(ex), dtype=bool)
    new_user[1:] = user[ex][1:] != user[ex][:-1]
    row = np.cumsum(new_user) - 1
    starts_idx = np.flatnonzero(new_user)
    last_idx = np.concatenate([starts_idx[1:], [len(ex)]])[: len(starts_idx)].astype(np.int64) - 1
    lo = np.maximum(first[starts_idx], end[starts_idx] - n_max)
    hi = end[last_idx]
    history = _history_table(h, user[ex][starts_idx], lo, hi)

    is_ad = h["is_ad"].astype(np.int64)
    cum_ad = np.concatenate([[0], np.cumsum(is_ad)])
    cum_click = np.concatenate([[0], np.cumsum(is_ad * h["click"])])
    sparse = {"user_id": vocab.ids("user_id", user[ex]), "item_id": h["item"][ex].astype(np.int32)}
    sparse.update({f"user_{a}": h[f"attr_{a}"][ex] for a in USER_ATTRIBUTES})
    sparse.update({f"item_{a}": h[f"attr_{a}"][ex] for a in ITEM_ATTRIBUTES})
    examples = pa.table({
        "example_id": h["event_id"][ex],
        "event_time": t[ex],
        "surface": np.maximum(h["surface"][ex].astype(np.int8) - 1, 0).astype(np.int8),
        "click": h["click"][ex],
        "conversion": h["conversion"][ex],
        "history_row": row.astype(np.int32),
        "history_end": (end - lo[row]).astype(np.int32),
        "history_len": (end - first).astype(np.int32),
        "ad_impressions_before": (cum_ad[end] - cum_ad[first]).astype(np.int32),
        "ad_clicks_before": (cum_click[end] - cum_click[first]).astype(np.int32),
        **{name: sparse[name] for name in SPARSE_FEATURES},
    })
    stats = _stats(plan, key, examples, h, first, end, int((hi - lo).sum()))
    return examples, history, stats


def _history_table(h: dict[str, np.ndarray], users: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> pa.Table:
    gather = ragged_arange(lo, hi - lo)
    offsets = pa.array(np.concatenate([[0], np.cumsum(hi - lo)]).astype(np.int32))
    seconds = h["event_time"][gather] // US_PER_S
    gaps = np.diff(seconds, prepend=seconds[:1]) if len(seconds) else seconds
    row_first = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64)
    nonempty = hi > lo
    gaps[row_first[nonempty]] = 0
    first_s = np.zeros(len(users), dtype=np.int64)
    first_s[nonempty] = seconds[row_first[nonempty]]
    conversion = h["conversion_time"][gather]
    lists = {
        "item": h["item"][gather], "event_type": h["event_type"][gather], "surface": h["surface"][gather],
        "is_ad": h["is_ad"][gather], "click": h["click"][gather],
        "conversion_time": pa.array(conversion, mask=conversion == NO_CONVERSION),
        "gap_s": gaps.astype(np.int32),
    }
    return pa.table({"user_id": users, "first_event_s": first_s,
                     **{k: pa.ListArray.from_arrays(offsets, pa.array(v)) for k, v in lists.items()}})


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


def _stats(plan: BuildPlan, key: ShardKey, examples: pa.Table, h, first, end, stored: int) -> dict:
    n_max = plan.max_seq_len
    full = end - first
    used = np.minimum(full, n_max)
    unknown_item = np.concatenate([[0], np.cumsum(h["item"] == 0)])
    seq_unknown = int((unknown_item[end] - unknown_item[end - used]).sum())
    surface = examples.column("surface").to_numpy()
    click = examples.column("click").to_numpy()
    conversion = examples.column("conversion").to_numpy()
    by_surface = {}
    for i, name in enumerate(SURFACES):
        sel = surface == i
        by_surface[name] = {"examples": int(sel.sum()), "clicks": int(click[sel].sum()),
                            "conversions": int(conversion[sel].sum())}
    return {
        "shard": key.name,
        "examples": int(examples.num_rows),
        "history_events_stored": int(stored),
        "sequence_elements": int(used.sum()),
        "truncated": int((full > n_max).sum()),
        "length_bins": length_bins(n_max),
        "length_hist": np.histogram(used, bins=length_bins(n_max))[0].astype(int).tolist(),
        "unknown": {name: int((examples.column(name).to_numpy() == 0).sum()) for name in SPARSE_FEATURES},
        "sequence_item_unknown": seq_unknown,
        "labels_by_surface": by_surface,
    }


def _empty_staged() -> dict[str, np.ndarray]:
    h = {c: np.zeros(0, dtype=np.int64) for c in ("user_id", "item_raw", "event_id", "event_time", "conversion_time")}
    h.update({c: np.zeros(0, dtype=np.int8) for c in ("is_ad", "surface", "event_type", "click", "conversion")})
    h["item"] = np.zeros(0, dtype=np.int32)
    h["example"] = np.zeros(0, dtype=bool)
    h.update({f"attr_{a}": np.zeros(0, dtype=np.int32) for a in USER_ATTRIBUTES + ITEM_ATTRIBUTES})
    return h


def read_stats(shard_dir: Path) -> dict:
    return json.loads((Path(shard_dir) / STATS_FILE).read_text())
