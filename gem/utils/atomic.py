"""Atomic writes, written once: a file or a folder appears whole or not at all.

Everything goes to a hidden temp name beside the target (same filesystem), then
``os.replace`` renames it into place; readers never see a partial file, and a process
killed mid-write leaves only a dot-file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator


def _tmp(path: Path, tag: str = "tmp") -> Path:
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}")


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temp path to write; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_text(text: str, path: str | Path) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def dumps(payload: object) -> str:
    """The project's JSON spelling: indented, keys sorted (byte-identical reruns)."""
    return json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"


def write_json(payload: object, path: str | Path) -> None:
    write_text(dumps(payload), path)


def write_with(writer: Callable[[Path], object], path: str | Path) -> None:
    """``writer(tmp_path)`` (e.g. a Parquet or torch writer), then the rename."""
    with atomic_file(path) as tmp:
        writer(tmp)


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a hidden temp folder next to ``final``; on success it replaces ``final`` (an
    older ``final`` is moved aside first, then deleted); on error it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = _tmp(final, "old")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
