"""Write the Feast repo's offline sources (``<repo>/data/*.parquet``) from a contract dataset.

- ``user_attributes.parquet``: users.parquet + ``event_timestamp`` = attribute time.
- ``item_attributes.parquet``: items.parquet + ``event_timestamp`` = attribute time.
- ``user_recent_behavior.parquet``: one row per (user, distinct event_time) with the
  last K events up to and including that time (oldest first; ties by event_id), so a
  point-in-time lookup at t sees exactly the events at or before t.

The attribute time is 1 second before the dataset's first event (or window start,
whichever is earlier): attributes are static in the contract, and a row stamped
before every impression can never be a feature "from the future".
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from gem.data.contract import EVENTS_DIR, ITEMS_FILE, TIMESTAMP, USERS_FILE, DatasetHandle
from gem.features.storage import PARQUET_OPTIONS, write_parquet_atomic

SOURCE_FILES = {
    "users": "user_attributes.parquet",
    "items": "item_attributes.parquet",
    "recent": "user_recent_behavior.parquet",
}


def attribute_time(data: Path | DatasetHandle) -> dt.datetime:
    dataset = DatasetHandle.open(data)
    data_dir = dataset.root
    con = duckdb.connect()
    try:
        first_us = con.execute(  # the path is a bound parameter, never SQL text
            "SELECT min(epoch_us(event_time)) FROM read_parquet(?, hive_partitioning=false)",
            [f"{data_dir / EVENTS_DIR}/day=*/*.parquet"],
        ).fetchone()[0]
    finally:
        con.close()
    start = dataset.manifest.start
    if first_us is not None:
        start = min(start, dt.datetime.fromtimestamp(first_us / 1e6, dt.timezone.utc))
    return start.replace(microsecond=0) - dt.timedelta(seconds=1)


def export(data_dir: str | Path | DatasetHandle, repo_dir: str | Path, *, recent_k: int = 20,
           parts: tuple[str, ...] = ("users", "items", "recent", "counters"),
           counters_at: dt.datetime | None = None) -> dict[str, Path]:
    """Write the requested sources into ``repo_dir/data``; returns their paths. The
    counters are every entity's as of ``counters_at`` (default: the dataset's window end)."""
    dataset = DatasetHandle.open(data_dir)
    data_dir, out = dataset.root, Path(repo_dir) / "data"
    out.mkdir(parents=True, exist_ok=True)
    stamp = attribute_time(dataset)
    written = {}
    for part, file in (("users", USERS_FILE), ("items", ITEMS_FILE)):
        if part in parts:
            table = pq.read_table(data_dir / file)
            column = pa.array([stamp] * table.num_rows, type=TIMESTAMP)
            written[part] = out / SOURCE_FILES[part]
            write_parquet_atomic(table.append_column("event_timestamp", column), written[part])
    if "recent" in parts:
        written["recent"] = out / SOURCE_FILES["recent"]
        write_recent_behavior(data_dir, recent_k, written["recent"])
    if "counters" in parts:
        written.update(write_counters(dataset, out, counters_at or dataset.manifest.end))
    return written


COUNTER_SOURCES = {kind: f"{kind}_counters.parquet" for kind in ("item", "advertiser", "category", "surface_item",
                                                                  "user")}


def write_counters(dataset: DatasetHandle, out: Path, at: dt.datetime) -> dict[str, Path]:
    """One source per key kind of gem.features.counters: every entity's counts (and the
    log's) as an example at ``at`` would read them, stamped ``at`` (the online store
    serves them; training reads the same counts from the features shards)."""
    import numpy as np

    from gem.features.counters import LABELLED_COLUMNS, NO_TIME, latest_counts
    from gem.features.plan import dataset_days, to_us
    from gem.features.staging import micros, read_day

    at_us = to_us(at)
    tables = [t for t in (read_day(dataset.root, d) for d in dataset_days(dataset.root)) if t is not None]
    events = pa.concat_tables(tables, promote_options="permissive") if tables else None
    surfaces = sorted(set(events.column("surface").to_pylist())) if events is not None else []
    rows = {c: np.zeros(0, np.int64) for c in LABELLED_COLUMNS}
    if events is not None:
        event_time = micros(events.column("event_time"))
        click_time = events.column("click_time").cast(TIMESTAMP).cast(pa.int64()).fill_null(0).to_numpy()
        conversion = events.column("conversion_time").cast(TIMESTAMP).cast(pa.int64())
        rows = {"user_id": events.column("user_id").to_numpy(), "item_raw": events.column("item_id").to_numpy(),
                "surface": np.searchsorted(np.array(surfaces, dtype=object), events.column("surface").to_numpy(
                    zero_copy_only=False)).astype(np.int64),
                "event_id": events.column("event_id").to_numpy(), "event_time": event_time,
                "is_ad": events.column("is_ad").to_numpy(zero_copy_only=False).astype(np.int8),
                "click": events.column("click").to_numpy(), "click_known": np.maximum(event_time, click_time),
                "conversion": events.column("conversion").to_numpy(),
                "conversion_time": conversion.fill_null(NO_TIME).to_numpy(zero_copy_only=False),
                "example": np.zeros(len(event_time), bool)}
    written = {}
    for kind, columns in latest_counts(rows, dataset.root / ITEMS_FILE, at_us).items():
        if "surface" in columns:
            columns["surface"] = np.array(surfaces, dtype=object)[columns["surface"]] if surfaces else \
                np.zeros(0, dtype=object)
        n = len(next(iter(columns.values())))
        table = pa.table({**columns, "event_timestamp": pa.array([at] * n, type=TIMESTAMP)})
        written[f"counters_{kind}"] = out / COUNTER_SOURCES[kind]
        write_parquet_atomic(table, written[f"counters_{kind}"])
    return written


RECENT_SCHEMA = pa.schema([
    pa.field("user_id", pa.int64()), pa.field("event_timestamp", TIMESTAMP),
    pa.field("recent_item_ids", pa.list_(pa.int64())), pa.field("recent_event_types", pa.list_(pa.string())),
    pa.field("recent_surfaces", pa.list_(pa.string())), pa.field("history_count", pa.int64()),
])
# DuckDB's memory for the recent-behaviour query: beyond it, it spills to disk, so the
# export's memory stays bounded however long the log (the whole result in memory took
# 4.4 GB at 3.9M events)
MEMORY_LIMIT = os.environ.get("GEM_DUCKDB_MEMORY_LIMIT", "1GB")
BATCH_ROWS = 1 << 16


def _recent_query(k: int) -> str:
    return f"""
        WITH w AS (
          SELECT user_id, event_time, event_id,
                 list(item_id) OVER last_k AS recent_item_ids,
                 list(event_type) OVER last_k AS recent_event_types,
                 list(surface) OVER last_k AS recent_surfaces,
                 row_number() OVER (PARTITION BY user_id ORDER BY event_time, event_id) AS history_count,
                 row_number() OVER (PARTITION BY user_id, event_time ORDER BY event_id DESC) AS last_of_tie
          FROM read_parquet($events, hive_partitioning=false)
          WINDOW last_k AS (PARTITION BY user_id ORDER BY event_time, event_id
                            ROWS BETWEEN {int(k) - 1} PRECEDING AND CURRENT ROW)
        )
        SELECT user_id, event_time AS event_timestamp, recent_item_ids, recent_event_types,
               recent_surfaces, history_count
        FROM w WHERE last_of_tie = 1 ORDER BY user_id, event_time
    """


def _recent_batches(data_dir: Path, k: int, spill: Path | None = None) -> Iterator[pa.RecordBatch]:
    """The recent-behaviour rows (see module docstring), sorted by (user_id, time), a
    batch at a time; with ``spill``, DuckDB keeps to MEMORY_LIMIT and spills there."""
    events = f"{Path(data_dir) / EVENTS_DIR}/day=*/*.parquet"
    con = duckdb.connect()
    try:
        con.execute("SET threads TO 2")
        con.execute("SET enable_progress_bar = false")  # a task's log is not a terminal
        if spill is not None:
            con.execute("SET memory_limit = ?", [MEMORY_LIMIT])
            con.execute("SET temp_directory = ?", [str(spill)])
        reader = con.sql(_recent_query(k), params={"events": events}).fetch_record_batch(BATCH_ROWS)  # a path is data
        for batch in reader:
            yield batch.cast(RECENT_SCHEMA)
    finally:
        con.close()


def recent_behavior(data_dir: Path, k: int) -> pa.Table:
    """The recent-behaviour rows in one table (small data; ``export`` streams them)."""
    return pa.Table.from_batches(list(_recent_batches(data_dir, k)), schema=RECENT_SCHEMA)


def write_recent_behavior(data_dir: Path, k: int, path: Path) -> int:
    """The recent-behaviour rows written to ``path`` (atomically) a batch at a time, the
    query held to MEMORY_LIMIT (spilling beside ``path``); returns the rows."""
    path = Path(path)
    tmp, spill = path.with_name(f".{path.name}.tmp-{os.getpid()}"), path.with_name(f".{path.name}.spill")
    rows = 0
    try:
        with pq.ParquetWriter(tmp, RECENT_SCHEMA, **PARQUET_OPTIONS) as writer:
            for batch in _recent_batches(data_dir, k, spill):
                writer.write_batch(batch)
                rows += batch.num_rows
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        shutil.rmtree(spill, ignore_errors=True)
    return rows
