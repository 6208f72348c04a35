"""Staging: the event log re-cut by (user bucket, day), encoded for shard builds.

One pass over the dataset, a group of UTC days at a time (memory: ~1M events). Each
staged file holds the events of one bucket and day, sorted by (user_id, event_time,
event_id), with categorical columns already encoded:

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
from gem.features.attributes import attribute_ids, fetch_attributes
from gem.features.jagged import user_bucket
from gem.features.plan import BuildPlan
from gem.features.storage import write_parquet_atomic
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
            present = set(pq.ParquetFile(path).schema_arrow.names)
            wanted = [c for c in EVENT_COLUMNS if c in present or c not in OPTIONAL_EVENT_COLUMNS]
            table = pq.read_table(path, columns=wanted)
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


def group_days(data_dir: Path, days: list[str], target_events: int = 1_000_000,
               min_groups: int = 1) -> list[list[str]]:
    """Consecutive days in groups of about ``target_events`` (Parquet footers only), and
    at least ``min_groups`` groups when there are enough days (parallelism)."""
    sizes = []
    for day in days:
        files = (Path(data_dir) / EVENTS_DIR / f"day={day}").glob("*.parquet")
        sizes.append(sum(pq.ParquetFile(f).metadata.num_rows for f in files if not f.name.startswith((".", "_"))))
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
    """Stage one group of consecutive dataset days into one file per bucket, with a
    single Feast retrieval for all their examples; returns the events staged."""
    days = plan.stage_groups[group]
    per_day = {}
    for day in days:
        table = read_day(Path(plan.data_dir), day)
        if table is not None:
            per_day[day] = _encode(plan, vocab, table)
    examples = [(day, np.flatnonzero(c["example"])) for day, c in per_day.items()]
    if any(len(ex) for _, ex in examples):
        frame = fetch_attributes(
            plan.feast_dir,
            np.concatenate([per_day[d]["user_id"][ex] for d, ex in examples]),
            np.concatenate([per_day[d]["item_raw"][ex] for d, ex in examples]),
            np.concatenate([per_day[d]["event_time"][ex] for d, ex in examples]))
        ids = attribute_ids(frame, vocab)
    else:
        ids = {a: np.zeros(0, dtype=np.int32) for a in USER_ATTRIBUTES + ITEM_ATTRIBUTES}
    offset = 0
    for day, ex in examples:
        columns = per_day[day]
        for name, values in ids.items():
            full = np.zeros(len(columns["user_id"]), dtype=np.int32)
            full[ex] = values[offset:offset + len(ex)]
            columns[f"attr_{name}"] = full
        offset += len(ex)
    columns = {k: np.concatenate([c[k] for c in per_day.values()]) for k in next(iter(per_day.values()))} \
        if per_day else _encode(plan, vocab, _empty_events())
    for name in ATTRIBUTE_COLUMNS:
        columns.setdefault(name, np.zeros(len(columns["user_id"]), dtype=np.int32))
    _write_buckets(plan, group, columns)
    return len(columns["user_id"])


def _empty_events() -> pa.Table:
    from gem.data.contract import empty_events

    return empty_events().select(EVENT_COLUMNS)


def _write_buckets(plan: BuildPlan, group: int, columns: dict[str, np.ndarray]) -> None:
    bucket = user_bucket(columns["user_id"], plan.num_buckets)
    order = np.lexsort((columns["event_id"], columns["event_time"], columns["user_id"], bucket))
    bucket = bucket[order]
    bounds = np.searchsorted(bucket, np.arange(plan.num_buckets + 1))
    for b in range(plan.num_buckets):
        sel = order[bounds[b]:bounds[b + 1]]
        write_parquet_atomic(pa.table({k: v[sel] for k, v in columns.items()}), plan.staging_file(b, group))


def example_mask(plan: BuildPlan, columns: dict[str, np.ndarray]) -> np.ndarray:
    """bool (n,): rows that are examples of the window (ad impressions, or every event
    when organic examples are included)."""
    t = columns["event_time"]
    kind = np.ones(len(t), dtype=bool) if plan.include_organic else columns["is_ad"] == 1
    return kind & (t >= plan.window_start_us) & (t < plan.window_end_us)


ATTRIBUTE_COLUMNS = tuple(f"attr_{a}" for a in USER_ATTRIBUTES + ITEM_ATTRIBUTES)


def read_staged(plan: BuildPlan, bucket: int, groups: list[int], *, before_us: int, from_us: int | None = None,
                columns: list[str] | None = None) -> dict[str, np.ndarray]:
    """The staged events of one bucket in ``groups`` (in order) with ``from_us`` <=
    event_time < ``before_us``, as numpy columns (all, or ``columns``)."""
    filters = [("event_time", "<", before_us)] + ([("event_time", ">=", from_us)] if from_us is not None else [])
    tables = [pq.read_table(plan.staging_file(bucket, g), columns=columns, filters=filters) for g in groups]
    if not tables:
        return {}
    table = pa.concat_tables(tables)
    return {name: table.column(name).to_numpy() for name in table.column_names}
