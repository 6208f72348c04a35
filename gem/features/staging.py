"""Staging: the event log re-cut by (user bucket, shard period), encoded for shard builds.

One pass over the dataset, a group of UTC days at a time (memory: ~1M events). Each
staged file ``bucket=B/part=P/group=G.parquet`` holds the events of one bucket whose
event_time lies in period P (``base``: before the first period) that group G read,
sorted by (user_id, event_time, event_id), with categorical columns already encoded:

    user_id int64 (raw), item int32 (dense id), item_raw int64, event_id int64,
    event_time int64 (us), is_ad int8, surface int16 (1 + index in the data's surfaces,
    plan.surfaces; 0 unknown), event_type int8 (1 + index in EVENT_TYPES, 0 unknown),
    click int8, conversion int8, conversion_time int64 (us; NO_CONVERSION when null),
    click_known int64 (us: when the click label became known: click_time, or
    event_time when null), hidden int8 (1: role "example", never in a history),
    example bool (an example of the window: role not "history"), and one int32
    dense-id column per static attribute (``attr_<name>``,
    fetched from Feast point-in-time as of the example's time; 0 on non-example rows)

Attributes are fetched here, one Feast retrieval per group of days for the examples
of every bucket, because each retrieval has a fixed cost (~0.5 s of query compilation)
that per-shard calls would pay buckets x days times.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gem.data.contract import (
    EVENT_TYPES,
    EVENTS_DIR,
    ITEM_ATTRIBUTES,
    OPTIONAL_EVENT_COLUMNS,
    TIMESTAMP,
    USER_ATTRIBUTES,
    ContractError,
    with_optional_columns,
)
from gem.features.jagged import user_bucket
from gem.features.plan import BuildPlan
from gem.features.storage import read_parquet, write_parquet_atomic
from gem.features.vocab import Vocabularies

NO_CONVERSION = np.iinfo(np.int64).max
EVENT_COLUMNS = ["event_id", "user_id", "item_id", "is_ad", "surface", "event_time", "event_type",
                 "click", "conversion", "conversion_time", *OPTIONAL_EVENT_COLUMNS]


def codes(column: pa.ChunkedArray, vocabulary, dtype=np.int8) -> np.ndarray:
    """(n,): 1 + index of each value in a vocabulary, 0 if absent."""
    pos = pc.index_in(column, value_set=pa.array(list(vocabulary), pa.string()))
    return (pc.fill_null(pos, -1).to_numpy(zero_copy_only=False) + 1).astype(dtype)


def micros(column: pa.ChunkedArray) -> np.ndarray:
    return column.cast(TIMESTAMP).cast(pa.int64()).to_numpy(zero_copy_only=False)


def read_day(data_dir: Path, day: str) -> pa.Table:
    files = sorted(p for p in (Path(data_dir) / EVENTS_DIR / f"day={day}").glob("*.parquet")
                   if not p.name.startswith((".", "_")))
    tables = []
    for path in files:
        try:
            file = pq.ParquetFile(path)
            present = set(file.schema_arrow.names)
            wanted = [c for c in EVENT_COLUMNS if c in present or c not in OPTIONAL_EVENT_COLUMNS]
            table = file.read(columns=wanted)
            tables.append(with_optional_columns(table).select(EVENT_COLUMNS))
        except (pa.ArrowInvalid, KeyError) as exc:
            raise ContractError(f"{path}: cannot read event columns {EVENT_COLUMNS} ({exc})") from exc
    return pa.concat_tables(tables) if tables else None


def _encode(plan: BuildPlan, vocab: Vocabularies, table: pa.Table) -> dict[str, np.ndarray]:
    event_time = micros(table.column("event_time"))
    keep = event_time < plan.window_end_us  # later events are never anyone's history
    conversion_time = table.column("conversion_time").cast(TIMESTAMP).cast(pa.int64())
    columns = {
        "user_id": table.column("user_id").to_numpy().astype(np.int64),
        "item": vocab.ids("item_id", table.column("item_id").combine_chunks()),
        "item_raw": table.column("item_id").to_numpy().astype(np.int64),
        "event_id": table.column("event_id").to_numpy().astype(np.int64),
        "event_time": event_time,
        "is_ad": table.column("is_ad").to_numpy(zero_copy_only=False).astype(np.int8),
        "surface": codes(table.column("surface"), plan.surfaces, np.int16),
        "event_type": codes(table.column("event_type"), EVENT_TYPES),
        "click": table.column("click").to_numpy().astype(np.int8),
        "conversion": table.column("conversion").to_numpy().astype(np.int8),
        "conversion_time": pc.fill_null(conversion_time, NO_CONVERSION).to_numpy(zero_copy_only=False),
        "click_known": np.maximum(event_time, pc.fill_null(
            table.column("click_time").cast(TIMESTAMP).cast(pa.int64()), np.iinfo(np.int64).min).to_numpy(
                zero_copy_only=False)),
        "role": codes(table.column("role"), ("history", "example")),  # 0 both, 1 history, 2 example
    }
    columns = {k: v[keep] for k, v in columns.items()}
    role = columns.pop("role")
    columns["hidden"] = (role == 2).astype(np.int8)
    columns["example"] = example_mask(plan, columns) & (role != 1)
    return columns


def day_events(data_dir: Path, days: list[str]) -> dict[str, int]:
    """Events per dataset day, from the Parquet footers only."""
    sizes = {}
    for day in days:
        files = (Path(data_dir) / EVENTS_DIR / f"day={day}").glob("*.parquet")
        sizes[day] = sum(pq.ParquetFile(f).metadata.num_rows for f in files if not f.name.startswith((".", "_")))
    return sizes


def group_days(data_dir: Path, days: list[str], target_events: int = 1_000_000,
               min_groups: int = 1, sizes: dict[str, int] | None = None) -> list[list[str]]:
    """Consecutive days in groups of about ``target_events`` (Parquet footers only), and
    at least ``min_groups`` groups when there are enough days (parallelism)."""
    sizes = [(sizes or day_events(data_dir, days))[d] for d in days]
    target = max(1, min(target_events, sum(sizes) // max(1, min_groups)))
    groups, current, current_size = [], [], 0
    for day, size in zip(days, sizes):
        if current and current_size + size > target:
            groups.append(current)
            current, current_size = [], 0
        current.append(day)
        current_size += size
    return groups + ([current] if current else [])


def stage_group(plan: BuildPlan, vocab: Vocabularies, group: int) -> int:
    """Stage one group of consecutive dataset days into one file per bucket: their events
    read and encoded together (one vocabulary lookup per column for the whole group, so
    the time follows the events, not the number of day files), with a single Feast
    retrieval for all their examples; returns the events staged."""
    # here, not at the top: shard builds and finalize import this module and need neither
    # Feast nor pandas (2.5 s of imports per pipeline task on a loaded 2-core machine)
    from gem.features.attributes import attribute_ids, fetch_attributes

    tables = [t for t in (read_day(Path(plan.data_dir), day) for day in plan.stage_groups[group]) if t is not None]
    columns = _encode(plan, vocab, pa.concat_tables(tables, promote_options="permissive") if tables
                      else _empty_events())
    ex = np.flatnonzero(columns["example"])
    if len(ex):
        ids = attribute_ids(fetch_attributes(plan.feast_dir, columns["user_id"][ex], columns["item_raw"][ex],
                                             columns["event_time"][ex]), vocab)
    else:
        ids = {a: np.zeros(0, dtype=np.int32) for a in USER_ATTRIBUTES + ITEM_ATTRIBUTES}
    for name, values in ids.items():
        full = np.zeros(len(columns["user_id"]), dtype=np.int32)
        full[ex] = values
        columns[f"attr_{name}"] = full
    _write_buckets(plan, group, columns)
    return len(columns["user_id"])


def _empty_events() -> pa.Table:
    from gem.data.contract import empty_events

    return empty_events().select(EVENT_COLUMNS)


def _write_buckets(plan: BuildPlan, group: int, columns: dict[str, np.ndarray]) -> None:
    """One file per (bucket, period) with events in this group (none where it has none)."""
    bucket = user_bucket(columns["user_id"], plan.num_buckets).astype(np.int64)
    part = plan.part_of(columns["event_time"])
    cell = bucket * (len(plan.example_days) + 1) + part + 1
    # rows grouped by cell first (a radix sort when the cells fit 16 bits), then each
    # cell's rows sorted by (user, time, event id): one sort of a whole day's rows costs
    # more per row as the day grows (7M rows: 2x per row against 0.7M), a cell's stays small
    by_cell = np.argsort(cell.astype(np.uint16) if cell.max(initial=0) < 1 << 16 else cell, kind="stable")
    cell = cell[by_cell]
    starts = np.flatnonzero(np.diff(cell, prepend=-1))  # cells are >= 0: the first row starts one
    user, event_time, event_id = columns["user_id"], columns["event_time"], columns["event_id"]
    for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), len(cell)]):
        b, p = divmod(int(cell[lo]), len(plan.example_days) + 1)
        rows = by_cell[lo:hi]
        sel = rows[np.lexsort((event_id[rows], event_time[rows], user[rows]))]
        write_parquet_atomic(pa.table({k: v[sel] for k, v in columns.items()}), plan.staging_file(b, p - 1, group))


def example_mask(plan: BuildPlan, columns: dict[str, np.ndarray]) -> np.ndarray:
    """bool (n,): rows that are examples of the window (ad impressions, or every event
    when organic examples are included)."""
    t = columns["event_time"]
    kind = np.ones(len(t), dtype=bool) if plan.include_organic else columns["is_ad"] == 1
    return kind & (t >= plan.window_start_us) & (t < plan.window_end_us)


ATTRIBUTE_COLUMNS = tuple(f"attr_{a}" for a in USER_ATTRIBUTES + ITEM_ATTRIBUTES)


STAGED_COLUMNS = ["user_id", "item", "event_id", "event_time", "is_ad", "surface", "event_type", "click",
                  "conversion", "conversion_time", "click_known", "hidden", "example", *ATTRIBUTE_COLUMNS]


def read_part(plan: BuildPlan, bucket: int, part: int, columns: list[str]) -> dict[str, np.ndarray]:
    """The staged events of one bucket and period in ``columns``, in group order (each
    group's rows sorted by user, time, event id); {} when there are none."""
    files = sorted(plan.part_dir(bucket, part).glob("group=*.parquet"))
    return read_tables([read_parquet(f, columns) for f in files])


def read_tables(tables: list[pa.Table]) -> dict[str, np.ndarray]:
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return {}
    table = pa.concat_tables(tables)
    return {name: table.column(name).to_numpy() for name in table.column_names}


def concat_columns(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    parts = [p for p in parts if p]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}


def sort_by_user(h: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # staged files are each sorted by (user, time, event_id) and come in time order, so
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


def empty_staged(columns: list[str]) -> dict[str, np.ndarray]:
    h = {c: np.zeros(0, dtype=np.int64) for c in ("user_id", "item_raw", "event_id", "event_time", "conversion_time")}
    h.update({c: np.zeros(0, dtype=np.int8) for c in ("is_ad", "event_type", "click", "conversion", "hidden")})
    h["surface"] = np.zeros(0, dtype=np.int16)
    h["click_known"] = np.zeros(0, dtype=np.int64)
    h["item"] = np.zeros(0, dtype=np.int32)
    h["example"] = np.zeros(0, dtype=bool)
    h.update({f"attr_{a}": np.zeros(0, dtype=np.int32) for a in USER_ATTRIBUTES + ITEM_ATTRIBUTES})
    return {c: h[c] for c in columns}
