"""Knowledge in Feast: register knowledge folders as the ``teacher_*`` sources of a
repo (feature_repo/knowledge.py) and read them back point-in-time.

    repo = prepare_repo(tmp / "feast", data_dir)         # private repo copy + attribute sources
    register_knowledge(repo, [knowledge_a, knowledge_b])   # teacher_*.parquet, feast apply
    frame = historical_knowledge(repo, keys)               # per impression, point-in-time

Point-in-time semantics: predictions join on the impression itself (they are training
targets, written by the batch job over the whole student window before any student
trains, and never served). Embeddings are inputs at request time, so they are read as a
student would read them: with ``refresh_every`` (the knowledge cadence, e.g. one day),
the latest row written *before the last materialization at or before the request*
(materializations at multiples of ``refresh_every`` from midnight UTC, 1970-01-01);
a request at 15:00 with a daily cadence sees what the midnight job wrote, never a row of
its own day. ``refresh_every=None`` is the per-impression variant (the latest row
``embedding_lag`` before the impression): a teacher running continuously beside the
request, an upper bound no batch job reaches.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gem.features.feast_repo import DEFAULT_REPO, apply, copy_repo, open_store
from gem.features.storage import write_parquet_atomic
from gem.knowledge.generate import (
    ITEM_EMBEDDING,
    OWN_COLUMNS,
    PREDICTIONS,
    SURFACE_COLUMNS,
    USER_EMBEDDING,
    read_knowledge_manifest,
)

SOURCE_FILES = {PREDICTIONS: "teacher_predictions.parquet", USER_EMBEDDING: "teacher_user_embedding.parquet",
                ITEM_EMBEDDING: "teacher_item_embedding.parquet"}
PREDICTION_FEATURES = [f"teacher_predictions:{c}" for c in (*OWN_COLUMNS, *SURFACE_COLUMNS, "teacher_version")]
EMBEDDING_FEATURES = ["teacher_user_embedding:teacher_user_embedding", "teacher_item_embedding:teacher_item_embedding"]
# Feast's duckdb offline store reads through ibis's default DuckDB connection, one per
# process, which refuses a second call while one runs ("connection is busy"): concurrent
# retrievals of one process (mlflow models serve scores requests in threads) take turns.
_OFFLINE_READS = threading.Lock()


def prepare_repo(repo_dir: str | Path, data_dir: str | Path | None = None, *, recent_k: int = 20) -> Path:
    """A private copy of the project's Feast repo at ``repo_dir``; with ``data_dir`` (a
    contract dataset) also its user/item/recent-behaviour sources (for serving)."""
    repo = copy_repo(DEFAULT_REPO, Path(repo_dir))
    if data_dir is not None:
        from gem.features.feast_sources import export

        export(data_dir, repo, recent_k=recent_k)
    return repo


def register_knowledge(repo_dir: str | Path, knowledge_dirs: list[str | Path], *,
                       definitions_repo: str | Path | None = None):
    """Write the union of the knowledge folders as the repo's teacher_* sources and
    ``feast apply`` (definitions from the project's feature_repo by default)."""
    repo = Path(repo_dir)
    for name, file in SOURCE_FILES.items():
        tables = [pq.read_table(Path(k) / name) for k in knowledge_dirs if (Path(k) / name).is_file()]
        if not tables:
            continue
        for k in knowledge_dirs:
            read_knowledge_manifest(k)
        write_parquet_atomic(pa.concat_tables(tables), repo / "data" / file)
    return apply(repo, definitions_repo=definitions_repo or DEFAULT_REPO)


def _stack(values: pd.Series, dim: int) -> np.ndarray:
    out = np.zeros((len(values), dim), dtype=np.float32)
    for i, v in enumerate(values.to_numpy()):
        if v is not None and not (isinstance(v, float) and np.isnan(v)) and len(v) == dim:
            out[i] = v
    return out


def knowledge_tags(repo_dir: str | Path, names: tuple[str, ...] | None = None) -> dict:
    """The lineage tags of the repo's teacher_* sources (``names``: of SOURCE_FILES' keys,
    default all), read from those columns only: ``{"teacher_versions", "teacher_digests",
    "vocab_digests", "window": [start, end], "tables", "unrecorded"}`` (distinct values,
    sorted; ``tables``: the sources present; ``unrecorded``: those written before the
    teacher and vocabulary digests were tagged)."""
    data = Path(repo_dir) / "data"
    found: dict[str, set] = {c: set() for c in ("teacher_version", "teacher_digest", "vocab_digest", "window_start",
                                                "window_end")}
    tables, unrecorded = [], []
    for name in sorted(names or SOURCE_FILES):
        path = data / SOURCE_FILES[name]
        if not path.is_file():
            continue
        tables.append(SOURCE_FILES[name])
        parquet = pq.ParquetFile(path)
        present = [c for c in found if c in parquet.schema_arrow.names]
        if not {"teacher_digest", "vocab_digest"} <= set(present):
            unrecorded.append(SOURCE_FILES[name])
        for c in present:
            found[c] |= _distinct(parquet, c)
    window = [min(found["window_start"]), max(found["window_end"])] if found["window_start"] and \
        found["window_end"] else []
    return {"teacher_versions": sorted(found["teacher_version"]), "teacher_digests": sorted(found["teacher_digest"]),
            "vocab_digests": sorted(found["vocab_digest"]), "window": window, "tables": tables,
            "unrecorded": unrecorded}


def _distinct(parquet: pq.ParquetFile, column: str) -> set:
    """A tag column's distinct non-empty values: from the row groups' statistics when each
    holds one value (a tag is constant per knowledge window: no row is read, so a check
    before every scoring call costs as little on a store of millions of rows), else read."""
    md = parquet.metadata
    leaf = next(i for i in range(md.num_columns) if md.schema.column(i).path == column)
    values = set()
    for group in range(md.num_row_groups):
        stats = md.row_group(group).column(leaf).statistics
        if stats is None or not stats.has_min_max or stats.min != stats.max or stats.null_count:
            return {v for v in parquet.read(columns=[column]).column(0).unique().to_pylist() if v}
        values.add(stats.min)
    return {v.decode() if isinstance(v, bytes) else v for v in values if v}


def registered_knowledge(repo_dir: str | Path) -> dict:
    """What a repo holds: ``{"digest", "window": [start, end], "teacher_versions",
    "teacher_digests", "vocab_digests"}`` over its teacher_* sources (a student's reuse
    key and lineage: another teacher's or another window's knowledge is another input;
    see ``knowledge_tags``)."""
    import hashlib

    from gem.utils.digest import file_digest

    data = Path(repo_dir) / "data"
    digest = hashlib.sha256()
    for name in sorted(SOURCE_FILES.values()):
        path = data / name
        if path.is_file():
            digest.update(f"{name}:{file_digest(path)};".encode())
    tags = knowledge_tags(repo_dir)
    return {"digest": digest.hexdigest(), **{k: tags[k] for k in ("window", "teacher_versions", "teacher_digests",
                                                                   "vocab_digests")}}


def source_dim(repo_dir: str | Path, column: str) -> int:
    """Width of an embedding column in the repo's registered knowledge (0 if none)."""
    path = Path(repo_dir) / "data" / SOURCE_FILES[USER_EMBEDDING if "user" in column else ITEM_EMBEDDING]
    if not path.is_file():
        return 0
    first = pq.ParquetFile(path).read_row_group(0, columns=[column]).column(0)
    return len(first[0].as_py()) if len(first) else 0


def materialized_at(timestamps: pd.Series, refresh_every: dt.timedelta | None,
                    embedding_lag: dt.timedelta = dt.timedelta(seconds=1)) -> pd.Series:
    """The newest knowledge time a request at each timestamp can see: the last
    materialization at or before it (``refresh_every``), minus one microsecond, since a
    materialization at M holds rows strictly before M; or the timestamp minus
    ``embedding_lag`` (per impression, ``refresh_every=None``)."""
    ts = pd.to_datetime(timestamps, utc=True)
    if refresh_every is None or refresh_every <= dt.timedelta(0):
        return ts - embedding_lag
    return ts.dt.floor(pd.Timedelta(refresh_every)) - pd.Timedelta(microseconds=1)


def historical_knowledge(repo_dir: str | Path, keys: pd.DataFrame, *, predictions: bool = True,
                         embeddings: bool = True, embedding_lag: dt.timedelta = dt.timedelta(seconds=1),
                         embedding_dim: int | None = None,
                         refresh_every: dt.timedelta | None = None) -> pd.DataFrame:
    """Point-in-time knowledge for impressions ``keys`` (example_id, user_id, item_id,
    event_timestamp), in the same row order. Columns: the teacher_logit_* floats and
    teacher_version (NaN / None where the teacher saw no such impression),
    ``teacher_user_embedding`` / ``teacher_item_embedding`` as lists (zeros when absent),
    and ``knowledge_as_of`` (the newest embedding time the request could see; see
    ``materialized_at``)."""
    store = open_store(repo_dir)
    base = keys[["example_id", "user_id", "item_id", "event_timestamp"]].reset_index(drop=True).copy()
    base["_row"] = np.arange(len(base))
    result = base[["example_id"]].copy()
    if predictions:
        with _OFFLINE_READS:
            df = store.get_historical_features(entity_df=base[["example_id", "event_timestamp", "_row"]],
                                               features=PREDICTION_FEATURES).to_df()
        df = df.sort_values("_row").reset_index(drop=True)
        for c in (*OWN_COLUMNS, *SURFACE_COLUMNS, "teacher_version"):
            result[c] = df[c].to_numpy()
    if embeddings:
        entity = base[["user_id", "item_id", "event_timestamp", "_row"]].copy()
        entity["event_timestamp"] = materialized_at(entity["event_timestamp"], refresh_every, embedding_lag)
        result["knowledge_as_of"] = entity["event_timestamp"].to_numpy()
        with _OFFLINE_READS:
            df = store.get_historical_features(entity_df=entity, features=EMBEDDING_FEATURES).to_df()
        df = df.sort_values("_row").reset_index(drop=True)
        for c in ("teacher_user_embedding", "teacher_item_embedding"):
            col = df[c]
            dim = embedding_dim or next((len(v) for v in col if isinstance(v, (list, np.ndarray)) and len(v)), 0) \
                or source_dim(repo_dir, c)  # no row known yet: zeros of the registered width
            result[c] = list(_stack(col, dim)) if dim else [np.zeros(0, np.float32)] * len(col)
    return result


def online_embeddings(store, user_id: int, item_ids: list[int]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Latest teacher embeddings of one user and many items from the online store."""
    user = store.get_online_features(features=["teacher_user_embedding:teacher_user_embedding"],
                                     entity_rows=[{"user_id": int(user_id)}]).to_dict()
    items = store.get_online_features(features=["teacher_item_embedding:teacher_item_embedding"],
                                      entity_rows=[{"item_id": int(i)} for i in item_ids]).to_dict()
    return user["teacher_user_embedding"][0], items["teacher_item_embedding"]
