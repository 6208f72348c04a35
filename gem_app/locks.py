"""One process at a time per workspace: a pipeline run, a refresh pass.

``exclusive(folder, name)`` holds ``<folder>/<name>.lock`` (filelock: an OS lock,
released when the holder dies) and records who holds it beside the lock, so the
refusal says which process and since when.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from gem.errors import UserError


class Busy(UserError, RuntimeError):
    """Another process holds the lock: a refusal to start (exit 2 from ``python -m gem``,
    as every refusal), naming the holder's pid, host and start."""


@contextlib.contextmanager
def exclusive(folder: str | Path, name: str, *, what: str) -> Iterator[None]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock, holder = FileLock(folder / f"{name}.lock"), folder / f"{name}.holder"
    try:
        lock.acquire(timeout=0)
    except Timeout:
        who = holder.read_text().strip() if holder.is_file() else "unknown holder"
        raise Busy(f"another {what} is running ({who}; lock {lock.lock_file}); refusing to start") from None
    try:
        since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        holder.write_text(f"pid {os.getpid()} on {socket.gethostname()} since {since}\n")
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()
