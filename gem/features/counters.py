"""Point-in-time counters: what an item, its advertiser, its category, a (surface, item)
pair and a user had earned before each example.

For every example and every key kind (``KINDS``) the features stage counts, over the
labelled rows of the log (ad rows: impressions with a click and a conversion label),
impressions, clicks and conversions with the same key inside each horizon
(``HORIZONS``) before the example's time. A row counts for an example only once it is
known strictly before the example's time ``t``:

- an impression at its ``event_time`` (one at the same instant as ``t``: not counted),
- a click at ``click_time`` (its event time when null),
- a conversion at ``conversion_time``.

A horizon ``H`` counts what became known in ``[t - H, t)``; ``all`` everything before
``t``. The ``global`` kind (one key) counts the whole log: the traffic the shares divide
by and the rates the smoothed ones shrink to.

How: one sort per key kind of the increments (one per row and signal, at the time the
signal became known) together with the queries (one per example and horizon, at ``t``
and at ``t - H``), queries before increments at equal times; a running count per signal
then gives every query's count of earlier increments of its key. O(n log n) in the rows
and examples, no per-example scan (``count_before``).

Stored per example as int32 counts (``COUNT_COLUMNS``) in the shard's examples.parquet;
the loader turns them into dense features (``counter_features``, named ``cnt_...``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from gem.data.contract import ITEMS_FILE
from gem.features.storage import read_parquet, write_parquet_atomic

US_PER_DAY = 86_400_000_000
KINDS = ("item", "advertiser", "category", "surface_item", "user")
HORIZONS: dict[str, int | None] = {"1d": US_PER_DAY, "7d": 7 * US_PER_DAY, "30d": 30 * US_PER_DAY, "all": None}
SIGNALS = ("impressions", "clicks", "conversions")
GLOBAL = "global"  # one key for the whole log: the prior of the smoothed rates
# pseudo-impressions (clicks) at the log's rate so far that every click (conversion) rate starts from
CTR_PRIOR_WEIGHT = 10.0
CVR_PRIOR_WEIGHT = 10.0
# Features: popularity as a share of the log's impressions, not a count (an absolute count
# of a key only grows and traffic moves: a model trained on earlier counts met larger or
# sparser ones on a later window): over all time the key's impressions per million of the
# log's (``share``); in a window, the log-ratio of the key's share there, shrunk to its
# all-time share with TREND_PRIOR_TRAFFIC pseudo-impressions of traffic, to that all-time
# share (``trend``: 0 where the window says nothing, e.g. a sparse day); and the smoothed
# click and conversion rates as log-odds over the log's own (``ctr_lift``, ``cvr_lift``).
TREND_PRIOR_TRAFFIC = 1000.0
TREND_CLIP = 3.0  # a window's share 20x its all-time share or more reads the same: bursts stay bounded


GLOBAL_STATS = ("ctr_logit", "cvr_logit")
NO_TIME = np.iinfo(np.int64).max  # conversion_time of a row without one (gem.features.staging.NO_CONVERSION)
MISSING_KEY = -1  # a row whose key is unknown (an item without advertiser): counted for nobody


def horizon_stats(horizon: str) -> tuple[str, ...]:
    return ("share" if horizon == "all" else "trend", "ctr_lift", "cvr_lift")


def count_column(kind: str, horizon: str, signal: str) -> str:
    return f"n_{kind}_{horizon}_{signal}"


COUNT_COLUMNS = tuple(count_column(k, h, s) for k in (*KINDS, GLOBAL) for h in HORIZONS for s in SIGNALS)
COUNTER_FEATURES = (*(f"cnt_{k}_{h}_{stat}" for k in KINDS for h in HORIZONS for stat in horizon_stats(h)),
                    *(f"cnt_{GLOBAL}_all_{stat}" for stat in GLOBAL_STATS))
COUNTER_PREFIX = "cnt_"


def count_before(inc_keys: list[np.ndarray], inc_time: np.ndarray, inc_signal: np.ndarray,
                 q_keys: list[np.ndarray], q_time: np.ndarray, n_signals: int) -> np.ndarray:
    """int64 (Q, n_signals): for each query, the increments of each signal whose key equals
    the query's (every key column) and whose time is strictly before the query's."""
    n_inc, n_q = len(inc_time), len(q_time)
    out = np.zeros((n_q, n_signals), dtype=np.int64)
    if not n_q or not n_inc:
        return out
    keys = [np.concatenate([a, b]) for a, b in zip(inc_keys, q_keys)]
    time = np.concatenate([inc_time, q_time])
    is_inc = np.concatenate([np.ones(n_inc, np.int8), np.zeros(n_q, np.int8)])
    # primary: the key columns; then time; at equal times queries (0) before increments (1)
    order = np.lexsort((is_inc, time, *reversed(keys)))
    new_key = np.zeros(len(order), dtype=bool)
    new_key[0] = True
    for column in keys:
        sorted_key = column[order]
        new_key[1:] |= sorted_key[1:] != sorted_key[:-1]
    group_start = np.maximum.accumulate(np.where(new_key, np.arange(len(order)), 0))
    query_pos = np.flatnonzero(is_inc[order] == 0)
    query_id = order[query_pos] - n_inc
    signal = np.concatenate([inc_signal, np.full(n_q, -1)])[order]
    for s in range(n_signals):
        cum = np.cumsum(signal == s, dtype=np.int64)
        before_group = cum[group_start] - (signal[group_start] == s)  # the running count before the key's first row
        out[query_id, s] = cum[query_pos] - before_group[query_pos]
    return out


def increments(rows: dict[str, np.ndarray], keys: list[np.ndarray]):
    """The increments of labelled rows: an impression at its event time, a click at the
    time it became known, a conversion at its conversion time. Returns (key columns,
    time, signal index)."""
    conv = (rows["conversion"] > 0) & (rows["conversion_time"] != NO_TIME)
    click = rows["click"] > 0
    parts = [(np.ones(len(rows["event_time"]), dtype=bool), rows["event_time"], 0),
             (click, rows["click_known"], 1), (conv, rows["conversion_time"], 2)]
    key_cols = [np.concatenate([k[sel] for sel, _, _ in parts]) for k in keys]
    time = np.concatenate([t[sel] for sel, t, _ in parts])
    signal = np.concatenate([np.full(int(sel.sum()), s, dtype=np.int64) for sel, _, s in parts])
    return key_cols, time, signal


def counts_for_kind(kind: str, labelled: dict[str, np.ndarray], label_keys: list[np.ndarray],
                    query_keys: list[np.ndarray], query_time: np.ndarray) -> dict[str, np.ndarray]:
    """int32 count columns of ``kind`` (every horizon and signal) for the queries."""
    inc_keys, inc_time, inc_signal = increments(labelled, label_keys)
    valid = np.all([k != MISSING_KEY for k in inc_keys], axis=0) if inc_keys else np.ones(len(inc_time), bool)
    inc_keys, inc_time, inc_signal = [k[valid] for k in inc_keys], inc_time[valid], inc_signal[valid]
    shifts = [span for span in HORIZONS.values() if span is not None]
    q_time_all = np.concatenate([query_time] + [query_time - s for s in shifts])
    q_keys_all = [np.tile(k, 1 + len(shifts)) for k in query_keys]
    counted = count_before(inc_keys, inc_time, inc_signal, q_keys_all, q_time_all, len(SIGNALS))
    n = len(query_time)
    upto = counted[:n]
    missing = np.any([k == MISSING_KEY for k in query_keys], axis=0) if query_keys else np.zeros(n, bool)
    out, shift = {}, 0
    for h in HORIZONS:
        if HORIZONS[h] is None:
            value = upto
        else:
            shift += 1
            value = upto - counted[shift * n:(shift + 1) * n]
        value = np.where(missing[:, None], 0, value)
        for s, signal in enumerate(SIGNALS):
            out[count_column(kind, h, signal)] = np.minimum(value[:, s], np.iinfo(np.int32).max).astype(np.int32)
    return out


def counter_names(kinds: tuple[str, ...] = KINDS) -> tuple[str, ...]:
    """The features ``counter_features(counts, kinds)`` returns, in its column order."""
    return tuple(n for n in COUNTER_FEATURES if any(n.startswith(f"cnt_{k}_") for k in (*kinds, GLOBAL)))


def counter_features(counts: dict[str, np.ndarray], kinds: tuple[str, ...] = KINDS) -> np.ndarray:
    """float32 (B, len(counter_names(kinds))) from the count columns (the features are named
    above; ``kinds``: only those key kinds' features, and the log's, e.g. for a scorer that
    computes the user's per request and caches the item's): per kind and horizon the
    popularity (``share`` over all time, ``trend`` in a window), the click rate shrunk to
    the log's rate so far with CTR_PRIOR_WEIGHT pseudo-impressions as log-odds over the
    log's rate (0: no evidence either way), the conversion rate per click the same way;
    then the log-odds of the log's own click and conversion rates so far. Conversion
    features are 0 until the log has a conversion."""
    g = {s: counts[count_column(GLOBAL, "all", s)].astype(np.float64) for s in SIGNALS}
    ctr0 = (g["clicks"] + 1.0) / (g["impressions"] + 2.0)
    cvr0 = (g["conversions"] + 1.0) / (g["clicks"] + 2.0)
    logit_ctr0, logit_cvr0 = logit(ctr0), logit(cvr0)  # every kind and horizon is read against them
    converted = g["conversions"] > 0  # before the log's first conversion the conversion features are 0
    out = np.empty((len(ctr0), len(counter_names(kinds))), np.float32)  # filled column by column
    col = 0
    for kind in (k for k in KINDS if k in kinds):
        seen = counts[count_column(kind, "all", "impressions")].astype(np.float64)
        share = seen / np.maximum(g["impressions"], 1.0)
        for h in HORIZONS:
            imp, clk, conv = (counts[count_column(kind, h, s)].astype(np.float64) for s in SIGNALS)
            if h == "all":
                popularity = np.log1p(1e6 * share)
            else:
                traffic = counts[count_column(GLOBAL, h, "impressions")].astype(np.float64)
                recent = (imp + TREND_PRIOR_TRAFFIC * share) / (traffic + TREND_PRIOR_TRAFFIC)
                ratio = np.log(np.maximum(recent, 1e-12) / np.maximum(share, 1e-12))
                popularity = np.where(seen > 0, np.clip(ratio, -TREND_CLIP, TREND_CLIP), 0.0)
            out[:, col] = popularity
            out[:, col + 1] = logit((clk + CTR_PRIOR_WEIGHT * ctr0) / (imp + CTR_PRIOR_WEIGHT)) - logit_ctr0
            out[:, col + 2] = np.where(converted, logit((conv + CVR_PRIOR_WEIGHT * cvr0) / (clk + CVR_PRIOR_WEIGHT))
                                       - logit_cvr0, 0.0)
            col += 3
    out[:, col] = logit_ctr0
    out[:, col + 1] = np.where(converted, logit_cvr0, 0.0)
    if col + 2 != out.shape[1]:  # the table is np.empty: every named column must have been written
        raise AssertionError(f"counter_features wrote {col + 2} columns for {out.shape[1]} names")
    return out


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)  # a smoothed rate is inside (0, 1); the clip only guards rounding
    return np.log(p) - np.log1p(-p)


# ---- the build's counter jobs ----

LABELLED_COLUMNS = ["user_id", "item_raw", "surface", "event_id", "event_time", "is_ad", "click", "click_known",
                    "conversion", "conversion_time", "example"]


def counter_file(counters_dir: Path, bucket: int, part: int) -> Path:
    return Path(counters_dir) / f"bucket={bucket:03d}" / f"part={part:05d}.parquet"


def row_keys(kind: str, rows: dict[str, np.ndarray], item_attrs: dict[str, dict]) -> list[np.ndarray]:
    """The key columns of ``kind`` for staged rows (raw ids; MISSING_KEY where unknown)."""
    if kind == "item":
        return [rows["item_raw"]]
    if kind == "user":
        return [rows["user_id"]]
    if kind == "surface_item":
        return [rows["surface"].astype(np.int64), rows["item_raw"]]
    if kind == GLOBAL:
        return [np.zeros(len(rows["item_raw"]), dtype=np.int64)]
    table = item_attrs[kind]  # advertiser / category: the item's attribute
    pos = np.searchsorted(table["item"], rows["item_raw"])
    pos = np.minimum(pos, max(len(table["item"]) - 1, 0))
    found = (table["item"][pos] == rows["item_raw"]) if len(table["item"]) else np.zeros(len(pos), bool)
    return [np.where(found, table["value"][pos] if len(table["item"]) else MISSING_KEY, MISSING_KEY)]


def item_attributes(items_file: Path) -> dict[str, dict]:
    """{advertiser, category}: sorted raw item ids and the attribute's raw id (MISSING_KEY
    where null), from the dataset's items.parquet."""
    table = read_parquet(items_file, ["item_id", "advertiser_id", "category_id"])
    item = table.column("item_id").to_numpy()
    order = np.argsort(item, kind="stable")
    out = {}
    for kind, column in (("advertiser", "advertiser_id"), ("category", "category_id")):
        values = table.column(column).fill_null(MISSING_KEY).to_numpy().astype(np.int64)
        out[kind] = {"item": item[order], "value": values[order]}
    return out


def labelled_mask(rows: dict[str, np.ndarray], include_organic: bool) -> np.ndarray:
    """The rows that carry labels: ad impressions (every row with organic examples on)."""
    return np.ones(len(rows["is_ad"]), dtype=bool) if include_organic else rows["is_ad"] > 0


def count_staged(staged: list[tuple[int, int, dict[str, np.ndarray]]], items_file: Path, kinds: tuple[str, ...],
                 include_organic: bool) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    """Count columns of ``kinds`` for the examples of staged rows given as (bucket, part,
    columns) pieces; returns {(bucket, part): {"example_id" sorted, *count columns}}."""
    if not staged:
        return {}
    rows = {c: np.concatenate([p[2][c] for p in staged]) for c in LABELLED_COLUMNS}
    where = np.concatenate([np.full((len(p[2]["event_id"]), 2), (p[0], p[1])) for p in staged])
    attrs = item_attributes(items_file) if {"advertiser", "category"} & set(kinds) else {}
    labelled = labelled_mask(rows, include_organic)
    lab = {c: v[labelled] for c, v in rows.items()}
    ex = np.flatnonzero(rows["example"])
    ex_rows = {c: v[ex] for c, v in rows.items()}
    columns: dict[str, np.ndarray] = {}
    for kind in kinds:
        columns.update(counts_for_kind(kind, lab, row_keys(kind, lab, attrs), row_keys(kind, ex_rows, attrs),
                                       ex_rows["event_time"]))
    out = {}
    cell = where[ex]
    for b, p in sorted({(int(b), int(p)) for b, p in cell}):
        sel = np.flatnonzero((cell[:, 0] == b) & (cell[:, 1] == p))
        sel = sel[np.argsort(ex_rows["event_id"][sel], kind="stable")]
        out[(b, p)] = {"example_id": ex_rows["event_id"][sel], **{c: v[sel] for c, v in columns.items()}}
    return out


def count_job_files(plan, kinds: tuple[str, ...], job: int) -> int:
    """One counter job of a build: read every staged row (all buckets and periods) in the
    columns counting needs, count ``kinds`` for every example, and write one file per
    (bucket, period) under the job's folder; returns the staged rows read."""
    from gem.features.staging import read_part

    pieces = []
    for bucket in range(plan.num_buckets):
        for part in range(-1, len(plan.example_days)):
            columns = read_part(plan, bucket, part, LABELLED_COLUMNS)
            if columns:
                pieces.append((bucket, part, columns))
    counted = count_staged(pieces, Path(plan.data_dir) / ITEMS_FILE, kinds, plan.include_organic)
    write_counts(plan.counters_dir(job), counted)
    return sum(len(p[2]["event_id"]) for p in pieces)


def write_counts(counters_dir: Path, counted: dict[tuple[int, int], dict[str, np.ndarray]]) -> None:
    for (b, p), columns in counted.items():
        write_parquet_atomic(pa.table(columns), counter_file(counters_dir, b, p))


def read_counts(files: list[Path], example_ids: np.ndarray) -> dict[str, np.ndarray]:
    """The count columns of ``example_ids`` from the counter files of their (bucket,
    period), one file per group of kinds; every example must be in each file (a
    (bucket, period) without examples has no file)."""
    if not len(example_ids):
        return {name: np.zeros(0, dtype=np.int32) for name in COUNT_COLUMNS}
    out: dict[str, np.ndarray] = {}
    for path in files:
        table = read_parquet(path)
        ids = table.column("example_id").to_numpy()
        pos = np.searchsorted(ids, example_ids)
        if len(example_ids) and (pos.max() >= len(ids) or not np.array_equal(ids[pos], example_ids)):
            raise RuntimeError(f"{path}: counts missing for some examples of the shard (changed during the build?)")
        for name in table.column_names:
            if name != "example_id":
                out[name] = table.column(name).to_numpy()[pos]
    return out



# ---- serving: each entity's counts as of one instant (the Feast online store) ----

def latest_counts(rows: dict[str, np.ndarray], items_file: Path, at_us: int,
                  include_organic: bool = False) -> dict[str, dict[str, np.ndarray]]:
    """Per kind: every entity's key columns (``KEY_COLUMNS``) and count columns as an
    example at ``at_us`` would read them (rows at or after it not counted). ``rows``: the
    log's events in LABELLED_COLUMNS (example unused), ``surface`` as 1 + index."""
    rows = {c: v[rows["event_time"] < at_us] for c, v in rows.items()}
    lab = {c: v[labelled_mask(rows, include_organic)] for c, v in rows.items()}
    attrs = item_attributes(items_file)
    g = counts_for_kind(GLOBAL, lab, row_keys(GLOBAL, lab, attrs), [np.zeros(1, np.int64)], np.array([at_us]))
    out = {}
    for kind in KINDS:
        keys = row_keys(kind, lab, attrs)
        entities = np.unique(np.stack(keys, axis=1), axis=0) if len(lab["event_time"]) else \
            np.zeros((0, len(keys)), np.int64)
        entities = entities[np.all(entities != MISSING_KEY, axis=1)]
        columns = [entities[:, j] for j in range(len(keys))]
        counted = counts_for_kind(kind, lab, keys, columns, np.full(len(entities), at_us, dtype=np.int64))
        out[kind] = {**dict(zip(KEY_COLUMNS[kind], columns)), **counted,
                     **{c: np.full(len(entities), v[0]) for c, v in g.items()}}
    return out


KEY_COLUMNS = {"item": ("item_id",), "advertiser": ("advertiser_id",), "category": ("category_id",),
               "surface_item": ("surface", "item_id"), "user": ("user_id",)}
