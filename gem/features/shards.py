"""One shard = the examples of one (user bucket, period of UTC days) plus the period's
history *segment* (the periods: plan.shard_periods).

What is stored: every user with an example in the window keeps one run of consecutive
events, from ``max_seq_len`` events before the history end of their first example up
to their last example (the example events included: an example reads its item,
surface, click and event second from its own event). Each stored event goes to the
segment of the shard whose period holds its time; the window's first shard also takes
the stored events from before the window (the *base*). So an event is stored once in
the whole window, however many periods of examples refer to it. Files: segments.py.

An example's sequence is the last ``max_seq_len`` events before its own event (events
at the same microsecond excluded, see docs) in the user's run, i.e. in the user's rows
of the segments of its bucket up to its own period (loader.py reads them), and
``history_len`` / ad counts are over the user's full history (the run's first row
carries the counts of the events before it).

Building shard (b, d) reads only the staged events of its own period (the first
period: also the stored events from before it) and its part of the bucket index
(index.py: which events are stored, the counts carried in from earlier periods, each
example's tie offset, history length and unknown sequence items), so its work follows
its period's events, never the bucket's whole history. Shards stay independent (any
order, any process), atomic (hidden temp dir + rename) and byte-identical on rebuild.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from gem.features.counters import COUNT_COLUMNS, counter_file, read_counts
from gem.features.index import read_index
from gem.features.plan import US_PER_DAY, BuildPlan, ShardKey
from gem.features.segments import (
    ATTRIBUTE_FEATURES,
    BEFORE_COLUMNS,
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
from gem.features.staging import (
    NO_CONVERSION,
    STAGED_COLUMNS,
    concat_columns,
    empty_staged,
    read_part,
    read_tables,
    sort_by_user,
)
from gem.features.storage import atomic_dir, dumps, read_parquet, write_parquet
from gem.features.vocab import Vocabularies

SPARSE_FEATURES = ("user_id", "item_id", *ATTRIBUTE_FEATURES)
DENSE_FEATURES = ("log_history_len", "log_seconds_since_last_event", "hour_of_day_sin", "hour_of_day_cos",
                  "user_prior_ad_ctr", "log_user_prior_ad_impressions")
_INT32 = np.iinfo(np.int32)

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


def select_examples(plan: BuildPlan, day: str, h: dict[str, np.ndarray]) -> np.ndarray:
    """bool (n,): rows of ``h`` that are examples of the shard period starting at ``day``."""
    lo, hi = plan.period_us(day)
    return h["example"] & (h["event_time"] >= lo) & (h["event_time"] < hi)


def build_shard(plan: BuildPlan, key: ShardKey) -> dict:
    """Build one shard atomically; returns its stats (also written to stats.json)."""
    vocab = _vocab(plan)
    part = plan.period_index(key.day)
    index = read_index(plan, key.bucket, part)
    h, read = _read_segment_rows(plan, key.bucket, part, index)
    examples, history, users, stats = _assemble(plan, key, vocab, h, index)
    stats["staged_rows_read"] = read + len(index["event_id"])
    with atomic_dir(plan.shards_dir / key.name) as tmp:
        write_parquet(examples, tmp / EXAMPLES_FILE, ENCODINGS[EXAMPLES_FILE])
        write_parquet(history, tmp / HISTORY_FILE, ENCODINGS[HISTORY_FILE])
        write_parquet(users, tmp / USERS_FILE, ENCODINGS[USERS_FILE])
        (tmp / STATS_FILE).write_text(dumps(stats))
    return stats


def _read_segment_rows(plan: BuildPlan, bucket: int, part: int, index: dict[str, np.ndarray]):
    """The staged rows of the shard's segment (the index's rows, in its order) in every
    staged column, and the staged rows read to find them."""
    first = [read_tables([read_parquet(plan.base_file(bucket))])] if part == 0 else []
    h = concat_columns([*first, read_part(plan, bucket, part, STAGED_COLUMNS)])
    read = len(h["user_id"]) if h else 0
    h = sort_by_user(h) if h else empty_staged(STAGED_COLUMNS)
    event_ids, rows = index["event_id"], index["row"]
    if len(rows) and not 0 <= rows.min() <= rows.max() < read:
        rows = rows[:0]  # the index is of other staged rows: the check below says so
    h = {k: v[rows] for k, v in h.items()}
    if not np.array_equal(h["event_id"], event_ids):
        raise RuntimeError(f"{plan.staging_dir}: bucket {bucket}'s staged events of period {plan.example_days[part]} "
                           "differ from its index (changed during the build?)")
    return h, read


def _assemble(plan: BuildPlan, key: ShardKey, vocab: Vocabularies, h: dict[str, np.ndarray],
              index: dict[str, np.ndarray]):
    """Tables of the shard from its segment's rows ``h`` and their index columns."""
    user, t = h["user_id"], h["event_time"]
    new_row = np.ones(len(user), dtype=bool)
    new_row[1:] = user[1:] != user[:-1]
    row_first = np.flatnonzero(new_row)
    users = pa.table({
        "user_id": user[row_first],
        "user": vocab.ids("user_id", user[row_first]),
        "events": np.diff(np.concatenate([row_first, [len(user)]])).astype(np.int32),
        **{name: index[name][row_first] for name in BEFORE_COLUMNS},
    })

    seconds = t // US_PER_S
    gap = np.diff(seconds, prepend=seconds[:1]) if len(seconds) else seconds
    gap[row_first] = seconds[row_first] - ref_second(key.day)
    if len(gap) and (gap.min() < _INT32.min or gap.max() > _INT32.max):
        raise ValueError(f"shard {key.name}: an event more than 68 years from its day cannot be stored")
    conversion = h["conversion_time"]
    delayed = (h["click"] > 0) & (h["click_known"] > t)
    history = pa.table({
        "item": h["item"].astype(np.int32),
        "code": pack_codes(h["event_type"], h["surface"], h["is_ad"], h["click"], h["hidden"]),
        "gap_s": gap.astype(np.int32),
        "conversion_time": pa.array(conversion, mask=conversion == NO_CONVERSION),
        "click_time": pa.array(h["click_known"], mask=~delayed),
    })

    own = np.flatnonzero(select_examples(plan, key.day, h))
    attributes = {name: h[f"attr_{name.split('_', 1)[1]}"][own] for name in ATTRIBUTE_FEATURES}
    counts = read_counts([counter_file(plan.counters_dir(j), key.bucket, plan.period_index(key.day))
                          for j in range(len(plan.counter_groups))], h["event_id"][own]) if plan.counter_groups else {}
    examples = pa.table({
        "event": own.astype(np.int32),
        "ties": index["ties"][own],
        "time_us": (t[own] % US_PER_S).astype(np.int32),
        "example_id": h["event_id"][own],
        "conversion": h["conversion"][own],
        **attributes,
        **{name: counts[name] for name in COUNT_COLUMNS if name in counts},
    })
    columns = {"surface": np.maximum(h["surface"][own] - 1, 0), "click": h["click"][own],
               "conversion": h["conversion"][own], "user_id": vocab.ids("user_id", user[own]),
               "item_id": h["item"][own], **attributes}
    stats = _stats(plan, key, columns, index["history_len"][own], index["seq_unknown"][own], len(user))
    stats["delayed_clicks_stored"] = int(delayed.sum())
    stats["examples_by_day"] = _by_day(plan, key, t[own])
    return examples, history, users, stats


def _by_day(plan: BuildPlan, key: ShardKey, t: np.ndarray) -> list[int]:
    """Examples per day of the shard's period (the loader's day order reads them)."""
    lo, hi = plan.period_us(key.day)
    return np.bincount((t - lo) // US_PER_DAY, minlength=(hi - lo) // US_PER_DAY).astype(int).tolist()


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


def _stats(plan: BuildPlan, key: ShardKey, examples: dict[str, np.ndarray], full: np.ndarray,
           seq_unknown: np.ndarray, stored: int) -> dict:
    n_max = plan.max_seq_len
    used = np.minimum(full, n_max)
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
        "sequence_item_unknown": int(seq_unknown.sum()),
        "labels_by_surface": by_surface,
    }


def read_stats(shard_dir: Path) -> dict:
    return json.loads((Path(shard_dir) / STATS_FILE).read_text())
