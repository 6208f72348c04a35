"""Atomic files and directories, and content digests.

A shard is a directory made in a hidden temp name and renamed into place, so a reader
(or a later pipeline step) sees either the whole shard or none of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

PARQUET_OPTIONS = dict(compression="zstd", compression_level=3, use_dictionary=True, write_statistics=False)


def write_parquet(table: pa.Table, path: Path, encodings: dict[str, str] | None = None) -> None:
    """Plain write (callers write inside a temp directory); fixed options, so the same
    table always gives the same bytes. ``encodings``: column -> Parquet encoding (e.g.
    DELTA_BINARY_PACKED) for columns that compress better without a dictionary."""
    options = dict(PARQUET_OPTIONS)
    if encodings:
        options.update(use_dictionary=[c for c in table.column_names if c not in encodings],
                       column_encoding={c: e for c, e in encodings.items() if c in table.column_names})
    pq.write_table(table, path, **options)


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file (``ParquetFile.read``: a third of ``pq.read_table``'s fixed cost
    per file, which dominates the many small files of a long log or of day shards)."""
    return pq.ParquetFile(path).read(columns=columns)


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_parquet(table, tmp)
    os.replace(tmp, path)


def dumps(payload: dict) -> str:
    return json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"


def write_json_atomic(payload: dict, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(dumps(payload))
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a hidden temp directory next to ``final``; on success replace ``final`` with
    it (an older ``final`` is moved aside first, then deleted); on error remove it."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dir_digest(directory: Path) -> str:
    """sha256 over the names and contents of the visible files of a directory."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file() and not p.name.startswith(".")):
        h.update(str(path.relative_to(directory)).encode())
        h.update(file_digest(path).encode())
    return h.hexdigest()


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
