"""Fan independent jobs over processes, or run them in-process for one worker."""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import types
from typing import Iterator

from gem.utils.memory import keep_freed_memory


@contextlib.contextmanager
def process_pool(workers: int) -> Iterator[object]:
    """An object with ``map``: a process pool, or the builtin ``map`` when workers == 1.

    forkserver, not fork: callers may have duckdb/torch threads running, and forking
    them is unsafe. Each worker keeps its freed memory for reuse (gem.utils.memory); the
    caller's own process is left as it is."""
    if workers == 1:
        yield types.SimpleNamespace(map=map)
        return
    ctx = multiprocessing.get_context("forkserver")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=keep_freed_memory) as pool:
        yield pool
