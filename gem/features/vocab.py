"""Vocabularies: raw ids and categorical attributes -> dense ids in [0, cardinality).

Id 0 is unknown/missing. A vocabulary is the sorted distinct raw values seen in the
data up to the window end (user and item ids seen at least ``min_count`` times in
events before ``window_end``; attribute values of those users and items), so the id of
a value is 1 + its rank. Stored as ``vocab/<name>.parquet`` (one column ``value``).

Vocabulary identity: ``Vocabularies.digests()`` (name -> sha256 of the values) goes into
the window's FeatureSpec (``vocab_digests``) and so into every model trained on it.
``check_vocabularies`` refuses to pair a model with a window whose ids mean other users,
items or attributes; a window built with the model's vocabularies (``vocab_from``) has
the same digests. A model saved before digests were recorded is refused too, unless
``GEM_ALLOW_UNRECORDED_VOCABULARIES=1`` (then a warning).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

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
from gem.errors import UserError
from gem.features.storage import read_parquet, write_parquet_atomic

log = logging.getLogger(__name__)
VOCAB_DIR = "vocab"
ALLOW_UNRECORDED = "GEM_ALLOW_UNRECORDED_VOCABULARIES"
ID_VOCABS = ("user_id", "item_id")
VOCAB_NAMES = ID_VOCABS + USER_ATTRIBUTES + ITEM_ATTRIBUTES


@dataclass
class Vocabularies:
    values: dict[str, pa.Array]  # name -> sorted distinct raw values (no nulls)
    _int_values: dict[str, np.ndarray | None] = field(default_factory=dict, repr=False, compare=False)

    def cardinality(self, name: str) -> int:
        return len(self.values[name]) + 1

    def ids(self, name: str, raw: pa.Array | np.ndarray) -> np.ndarray:
        """int32 (n,) dense ids of ``raw`` values (0 = unknown or null)."""
        vocab = self.values[name]
        sorted_ints = self._sorted_ints(name)
        if sorted_ints is not None and (query := _int64_query(raw)) is not None and (
                len(query) <= len(vocab) or _is_sorted(query)):
            # a binary search in the sorted values: index_in builds a hash table of the
            # whole vocabulary on every call, which for a shard's users costs more than
            # the lookups (1.15M users: 146 ms a call, against 7 ms)
            return _ranks(sorted_ints, query)
        raw = raw if isinstance(raw, (pa.Array, pa.ChunkedArray)) else pa.array(raw)
        if raw.type != vocab.type:
            raw = raw.cast(vocab.type)
        pos = pc.index_in(raw, value_set=vocab)
        return (pc.fill_null(pos, -1).to_numpy(zero_copy_only=False) + 1).astype(np.int32)

    def _sorted_ints(self, name: str) -> np.ndarray | None:
        """The vocabulary as int64 if it is integers in increasing order, else None."""
        if name not in self._int_values:
            values = self.values[name]
            ints = None
            if pa.types.is_integer(values.type) and values.null_count == 0:
                ints = values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
                ints = ints if _is_sorted(ints, strict=True) else None
            self._int_values[name] = ints
        return self._int_values[name]

    def digests(self) -> dict[str, str]:
        """name -> sha256 of the values in order (ints as int64, strings as UTF-8)."""
        out = {}
        for name, values in self.values.items():
            h = hashlib.sha256()
            if pa.types.is_integer(values.type):
                h.update(b"int64\0" + np.ascontiguousarray(values.to_numpy(zero_copy_only=False), np.int64).tobytes())
            else:
                h.update(b"str\0" + "\0".join(str(v) for v in values.to_pylist()).encode())
            out[name] = h.hexdigest()
        return out

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


def _int64_query(raw: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray | None:
    """``raw`` as int64 when it is integers without nulls that int64 holds exactly."""
    if isinstance(raw, (pa.Array, pa.ChunkedArray)):
        if raw.null_count or not pa.types.is_integer(raw.type) or raw.type == pa.uint64():
            return None
        raw = raw.to_numpy()
    raw = np.asarray(raw)
    if raw.dtype.kind == "i" or (raw.dtype.kind == "u" and raw.dtype.itemsize < 8):
        return raw.astype(np.int64, copy=False)
    return None


def _is_sorted(values: np.ndarray, strict: bool = False) -> bool:
    later, earlier = values[1:], values[:-1]
    return bool(np.all(later > earlier) if strict else np.all(later >= earlier))


def _ranks(sorted_values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """int32: 1 + the position of each query in ``sorted_values``, 0 where absent."""
    if not len(sorted_values):
        return np.zeros(len(query), dtype=np.int32)
    pos = np.minimum(np.searchsorted(sorted_values, query), len(sorted_values) - 1)
    return np.where(sorted_values[pos] == query, pos + 1, 0).astype(np.int32)


def build_vocabularies(data_dir: Path, window_end_us: int, min_count: int) -> Vocabularies:
    """Vocabularies from the events before ``window_end_us`` (microseconds since epoch)."""
    import duckdb  # here: shard builds read vocabularies and need no SQL engine

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


class VocabularyMismatch(UserError, ValueError):
    """A model paired with a features window whose ids mean other values."""


def vocabulary_digest(digests: dict[str, str]) -> str:
    """One short identity for a set of vocabularies (12 hex), as messages show it."""
    if not digests:
        return "(not recorded)"
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:12]


def check_vocabularies(model_digests: dict[str, str], window_digests: dict[str, str], *,
                       model: str = "the model", window: str = "the features window") -> None:
    """Refuse (VocabularyMismatch) to score, evaluate or continue ``model`` on ``window``
    unless both were built on the same vocabularies."""
    if not model_digests:
        text = (f"{model} was saved without the digests of its vocabularies (before they were recorded), so "
                f"nothing shows that {window} (vocabularies {vocabulary_digest(window_digests)}) gives its ids "
                "the same meaning")
        if os.environ.get(ALLOW_UNRECORDED) == "1":
            log.warning("%s; used anyway (%s=1)", text, ALLOW_UNRECORDED)
            return
        raise VocabularyMismatch(f"{text}; retrain it, or set {ALLOW_UNRECORDED}=1 to use it unchecked")
    if model_digests == window_digests:
        return
    differ = sorted(n for n in set(model_digests) | set(window_digests)
                    if model_digests.get(n) != window_digests.get(n))
    raise VocabularyMismatch(
        f"{model} was trained with vocabularies {vocabulary_digest(model_digests)}, {window} was built with "
        f"{vocabulary_digest(window_digests)} (differ: {', '.join(differ)}): its ids mean other users, items or "
        "attributes. Build the window with the model's vocabularies (features --set vocab_from=<the model's "
        "training window>), use a model trained with this window's, or keep another dataset in another "
        "workspace (MLflow store)")
