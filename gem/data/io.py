"""Atomic Parquet/JSON writes and the day-partitioned event layout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gem.data.contract import EVENTS_SCHEMA, day_dir, with_optional_columns

DATASET_KIND = "dataset"


def claim_dataset_output(out: str | Path, *, inputs: tuple = ()) -> Path:
    """Create (or accept) ``out`` as a dataset output folder: new, empty, or a dataset this
    project wrote (gem.utils.outputs); a foreign non-empty folder or an input is refused."""
    from gem.utils.outputs import claim_output

    return claim_output(out, DATASET_KIND, inputs=inputs, legacy=_is_dataset)


def _is_dataset(folder: Path) -> bool:
    """A contract dataset written before output markers existed."""
    try:
        return "window_start" in json.loads((Path(folder) / "manifest.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def write_parquet_atomic(table: pa.Table, path: Path, compression: str = "snappy") -> None:
    """Write to a hidden temp name, then rename: readers never see a partial file.
    (snappy: about twice as fast to write as zstd, for ~35% more bytes.)"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression=compression)
    os.replace(tmp, path)


def write_json_atomic(payload: dict, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def write_events_by_day(events: pa.Table, root: Path, part: str = "part-00000") -> int:
    """Split a contract events table by UTC day into events/day=YYYY-MM-DD/<part>.parquet,
    sorted by (user_id, event_time, event_id) within each file. Returns files written."""
    events = with_optional_columns(events).select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA)
    days = pc.floor_temporal(events.column("event_time"), unit="day").cast(pa.int64()).to_numpy()
    written = 0
    for day_us in np.unique(days):
        chunk = events.filter(pa.array(days == day_us))
        chunk = chunk.sort_by([("user_id", "ascending"), ("event_time", "ascending"), ("event_id", "ascending")])
        day = np.datetime64(int(day_us), "us").astype("datetime64[D]").item()
        write_parquet_atomic(chunk, day_dir(root, day) / f"{part}.parquet")
        written += 1
    return written
