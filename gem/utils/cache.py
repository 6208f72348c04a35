"""The per-machine cache folder: $GEM_CACHE_DIR, else ~/.cache/gem (read at each call,
so tests and subprocesses can point it elsewhere)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("GEM_CACHE_DIR", Path.home() / ".cache" / "gem"))
