"""Vocabularies: raw ids and categorical attributes -> dense ids in [0, cardinality).

Id 0 is unknown/missing. A vocabulary is the sorted distinct raw values seen in the
data up to the window end (user and item ids seen at least ``min_count`` times in
events before ``window_end``; attribute values of those users and items), so the id of
a value is 1 + its rank. Stored as ``vocab/<name>.parquet`` (one column ``value``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gem.data.contract import (
    EVENTS_DIR,
    ITEM_ATTRIBUTES,
    ITEMS_FILE,
    USER_ATTRIBUTES,
    USERS_FILE,
)
from gem.features.storage import read_parquet, write_parquet_atomic

VOCAB_DIR = "vocab"
ID_VOCABS = ("user_id", "item_id")
VOCAB_NAMES = ID_VOCABS + USER_ATTRIBUTES + ITEM_ATTRIBUTES


@dataclass
class Vocabularies:
    values: dict[str, pa.Array]  # name -> sorted distinct raw values (no nulls)

    def cardinality(self, name: str) -> int:
        return len(self.values[name]) + 1

    def ids(self, name: str, raw: pa.Array | np.ndarray) -> np.ndarray:
        """int32 (n,) dense ids of ``raw`` values (0 = unknown or null)."""
        vocab = self.values[name]
        raw = raw if isinstance(raw, (pa.Array, pa.ChunkedArray)) else pa.array(raw)
        if raw.type != vocab.type:
            raw = raw.cast(vocab.type)
        pos = pc.index_in(raw, value_set=vocab)
        return (pc.fill_null(pos, -1).to_numpy(zero_copy_only=False) + 1).astype(np.int32)

    def write(self, out_dir: Path) -> None:
        for name, values in self.values.items():
            write_parquet_atomic(pa.table({"value": values}), Path(out_dir) / VOCAB_DIR / f"{name}.parquet")

    @classmethod
    def read(cls, features_dir: Path) -> "Vocabularies":
        base = Path(features_dir) / VOCAB_DIR
        missing = [n for n in VOCAB_NAMES if not (base / f"{n}.parquet").is_file()]
        if missing:
            raise FileNotFoundError(f"{base}: missing vocabularies {missing}")
        return cls({n: read_parquet(base / f"{n}.parquet").column("value").combine_chunks() for n in VOCAB_NAMES})


def build_vocabularies(data_dir: Path, window_end_us: int, min_count: int) -> Vocabularies:
    """Vocabularies from the events before ``window_end_us`` (microseconds since epoch)."""
    data_dir = Path(data_dir)
    events = str(data_dir / EVENTS_DIR / "day=*" / "*.parquet")
    con = duckdb.connect()
    try:
        con.execute("SET threads TO 2")
        values: dict[str, pa.Array] = {}
        for key in ID_VOCABS:
            # paths and numbers are bound parameters: a path is data, never SQL (a ' in it is fine)
            ids = con.sql(
                f"SELECT {key} FROM read_parquet(?, hive_partitioning=false) "
                f"WHERE epoch_us(event_time) < ? GROUP BY {key} HAVING count(*) >= ? ORDER BY {key}",
                params=[events, int(window_end_us), int(min_count)],
            ).to_arrow_table().column(0)
            values[key] = ids.combine_chunks().cast(pa.int64())
        con.register("known_users", pa.table({"user_id": values["user_id"]}))
        con.register("known_items", pa.table({"item_id": values["item_id"]}))
        for table, file, known, attrs in (
            ("users", USERS_FILE, "known_users", USER_ATTRIBUTES),
            ("items", ITEMS_FILE, "known_items", ITEM_ATTRIBUTES),
        ):
            key = "user_id" if table == "users" else "item_id"
            path = data_dir / file
            for attr in attrs:  # attr, key and known are this module's constants, not input
                col = con.sql(
                    f"SELECT DISTINCT t.{attr} FROM read_parquet(?) t JOIN {known} k USING ({key}) "
                    f"WHERE t.{attr} IS NOT NULL ORDER BY 1",
                    params=[str(path)],
                ).to_arrow_table().column(0)
                values[attr] = col.combine_chunks()
    finally:
        con.close()
    return Vocabularies(values)
