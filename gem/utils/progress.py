"""Progress of long loops, and the key figures a stage reports, for whoever is watching.

``track(iterable, total, desc)`` wraps a loop. Where it is shown depends on
``GEM_PROGRESS``:
- unset (a person at a terminal): a tqdm bar on stderr (nothing when not a terminal);
- ``events``: one line per update on stdout, throttled, for a parent process that
  renders them (the local pipeline runner: gem_app/pipelines/console.py);
- ``off``: nothing.
``figure(name, value)`` reports one key figure of the running step the same way (a log
line outside ``events`` mode); ``warning(text)`` one warning.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
EVENT_PREFIX = "\x1egem:"  # record separator: a line no ordinary output starts with
_MIN_INTERVAL_S = 0.5
log = logging.getLogger(__name__)


def mode() -> str:
    return os.environ.get("GEM_PROGRESS", "bar")


def emit(kind: str, **payload) -> None:
    sys.stdout.write(f"{EVENT_PREFIX}{json.dumps({'kind': kind, **payload}, default=str)}\n")
    sys.stdout.flush()


def figure(name: str, value: object) -> None:
    """A key figure of the running step (shown on the step's line by the pipeline runner)."""
    if mode() == "events":
        emit("figure", name=name, value=value)
    else:
        log.info("%s: %s", name, value)


def warning(text: str) -> None:
    """Something the person running the step should see (the pipeline runner prints it
    under the step's line, once per run; a logged warning elsewhere)."""
    if mode() == "events":
        emit("warning", text=text)
    else:
        log.warning("%s", text)


class Progress:
    """A counter with a total; ``update(n)`` as work completes, ``close()`` at the end."""

    def __init__(self, total: int | None, desc: str, unit: str = "it"):
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self._mode, self._last, self._bar = mode(), 0.0, None
        if self._mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, disable=None, leave=False, dynamic_ncols=True)
        elif self._mode == "events":
            emit("progress", desc=desc, n=0, total=total, unit=unit)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._mode == "events":
            now = time.monotonic()
            if now - self._last >= _MIN_INTERVAL_S or (self.total and self.n >= self.total):
                self._last = now
                emit("progress", desc=self.desc, n=self.n, total=self.total, unit=self.unit)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._mode == "events":
            emit("progress", desc=self.desc, n=self.n, total=self.total, unit=self.unit, done=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(iterable: Iterable[T], total: int | None = None, desc: str = "", unit: str = "it") -> Iterator[T]:
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with Progress(total, desc, unit) as bar:
        for item in iterable:
            yield item
            bar.update()
