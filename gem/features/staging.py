"""Staging: the event log re-cut by (user bucket, day), encoded for shard builds.

One pass over the dataset, one UTC day at a time (memory: one day of events). Each
staged file holds the events of one bucket and day, sorted by (user_id, event_time,
event_id), with categorical columns already encoded:

    user_id int64 (raw), item int32 (dense id), item_raw int64, event_id int64,
    event_time int64 (us), is_ad int8, surface int8 (1 + index in SURFACES, 0 unknown),
    event_type int8 (1 + index in EVENT_TYPES, 0 unknown), click int8, conversion int8,
    conversion_time int64 (us; NO_CONVERSION when null)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gem.data.contract import EVENT_TYPES, EVENTS_DIR, SURFACES, TIMESTAMP, ContractError
from gem.features.jagged import user_bucket
from gem.features.plan import BuildPlan
from gem.features.storage import write_parquet_atomic
from gem.features.vocab import Vocabularies

NO_CONVERSION = np.iinfo(np.int64).max
EVENT_COLUMNS = ["event_id", "user_id", "item_id", "is_ad", "surface", "event_time", "event_type",
                 "click", "conversion", "conversion_time"]


def codes(column: pa.ChunkedArray, vocabulary: tuple[str, ...]) -> np.ndarray:
    """int8 (n,): 1 + index of each value in a fixed vocabulary, 0 if absent."""
    pos = pc.index_in(column, value_set=pa.array(list(vocabulary)))
    return (pc.fill_null(pos, -1).to_numpy(zero_copy_only=False) + 1).astype(np.int8)


def micros(column: pa.ChunkedArray) -> np.ndarray:
    return column.cast(TIMESTAMP).cast(pa.int64()).to_numpy(zero_copy_only=False)


def read_day(data_dir: Path, day: str) -> pa.Table:
    files = sorted(p for p in (Path(data_dir) / EVENTS_DIR / f"day={day}").glob("*.parquet")
                   if not p.name.startswith((".", "_")))
    tables = []
    for path in files:
        try:
            tables.append(pq.read_table(path, columns=EVENT_COLUMNS))
        except (pa.ArrowInvalid, KeyError) as exc:
            raise ContractError(f"{path}: cannot read event columns {EVENT_COLUMNS} ({exc})") from exc
    return pa.concat_tables(tables) if tables else None


def stage_day(plan: BuildPlan, vocab: Vocabularies, day: str) -> int:
    """Stage one dataset day into one file per bucket; returns the events staged."""
    table = read_day(Path(plan.data_dir), day)
    if table is None:
        return 0
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
        "surface": codes(table.column("surface"), SURFACES),
        "event_type": codes(table.column("event_type"), EVENT_TYPES),
        "click": table.column("click").to_numpy().astype(np.int8),
        "conversion": table.column("conversion").to_numpy().astype(np.int8),
        "conversion_time": pc.fill_null(conversion_time, NO_CONVERSION).to_numpy(zero_copy_only=False),
    }
    columns = {k: v[keep] for k, v in columns.items()}
    bucket = user_bucket(columns["user_id"], plan.num_buckets)
    order = np.lexsort((columns["event_id"], columns["event_time"], columns["user_id"], bucket))
    bucket = bucket[order]
    bounds = np.searchsorted(bucket, np.arange(plan.num_buckets + 1))
    for b in range(plan.num_buckets):
        sel = order[bounds[b]:bounds[b + 1]]
        write_parquet_atomic(pa.table({k: v[sel] for k, v in columns.items()}), plan.staging_file(b, day))
    return int(keep.sum())


def read_staged(plan: BuildPlan, bucket: int, days: list[str]) -> dict[str, np.ndarray]:
    """The staged events of one bucket over ``days`` (in day order) as numpy columns."""
    tables = [pq.read_table(plan.staging_file(bucket, d)) for d in days if plan.staging_file(bucket, d).is_file()]
    if not tables:
        return {}
    table = pa.concat_tables(tables)
    return {name: table.column(name).to_numpy() for name in table.column_names}
