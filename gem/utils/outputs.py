"""Output folders: a command writes only into a new folder or one it owns.

    out = claim_output(args.out, "features", inputs=[data_dir])

A folder is *owned* by a kind of output when it carries the marker file ``.gem-output``
(JSON ``{"kind": ...}``) that ``claim_output`` writes, or when it is a finished output
of that kind written before markers existed (``legacy(folder)`` says so, e.g. a
features ``manifest.json`` of the features format). ``claim_output`` refuses, with an OutputFolderError naming the
folder and the rule:

- an output that is, contains or lies inside one of the command's inputs (``features
  build D D`` would delete the dataset's manifest);
- a non-empty folder that is not owned (``knowledge generate --out ~/notes``);
- a folder owned by another kind of output.

Nothing here deletes anything: a command replaces only what it owns, after the claim.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable, Iterable

from gem.errors import UserError

MARKER = ".gem-output"
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


class OutputFolderError(UserError, ValueError):
    """An output folder that a command must not write into."""


def owner(folder: str | Path) -> str | None:
    """The kind named by ``folder``'s marker, or None (no marker, or unreadable)."""
    path = Path(folder) / MARKER
    try:
        return str(json.loads(path.read_text())["kind"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_marker(folder: str | Path, kind: str) -> Path:
    path = Path(folder) / MARKER
    tmp = path.with_name(f"{MARKER}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"kind": kind, "written_by": "gem"}) + "\n")
    os.replace(tmp, path)
    return path


def check_output(out: str | Path, kind: str, *, inputs: Iterable[str | Path] = (),
                 legacy: Callable[[Path], bool] | None = None) -> Path:
    """Raise OutputFolderError unless ``out`` may be written as a ``kind`` output;
    returns ``out`` resolved. Creates and marks nothing (see ``claim_output``)."""
    target = Path(out).expanduser().resolve()
    for given in inputs:
        if given is None or str(given) == "" or _URI.match(str(given)):  # runs:/, models:/, s3://
            continue
        source = Path(given).expanduser().resolve()
        if target == source:
            raise OutputFolderError(f"{out}: the output folder is the input {given}; choose a new folder "
                                    "(an input is never written over)")
        if target.is_relative_to(source):
            raise OutputFolderError(f"{out}: the output folder lies inside the input {given}; choose a folder "
                                    "outside it")
        if source.is_relative_to(target):
            raise OutputFolderError(f"{out}: the output folder contains the input {given}; choose a folder "
                                    "that does not hold it")
    if target.exists() and not target.is_dir():
        raise OutputFolderError(f"{out}: exists and is not a folder")
    if not target.is_dir() or not any(target.iterdir()):
        return target
    found = owner(target)
    if found == kind:
        return target
    if found is not None:
        raise OutputFolderError(f"{out}: holds a {found!r} output, not a {kind!r} one; choose another folder")
    if legacy is not None and legacy(target):
        return target
    raise OutputFolderError(
        f"{out}: not empty and not written by gem (no {MARKER} file); refusing to write a {kind!r} output "
        "over its contents: choose a new or empty folder")


def claim_output(out: str | Path, kind: str, *, inputs: Iterable[str | Path] = (),
                 legacy: Callable[[Path], bool] | None = None) -> Path:
    """``check_output``, then create ``out`` and mark it as a ``kind`` output."""
    target = check_output(out, kind, inputs=inputs, legacy=legacy)
    target.mkdir(parents=True, exist_ok=True)
    if owner(target) != kind:
        write_marker(target, kind)
    return target


def json_format(file: str, prefix: str) -> Callable[[Path], bool]:
    """A ``legacy`` test: ``folder/file`` is JSON whose "format" starts with ``prefix``."""

    def test(folder: Path) -> bool:
        try:
            return str(json.loads((Path(folder) / file).read_text()).get("format", "")).startswith(prefix)
        except (OSError, ValueError, AttributeError):
            return False

    return test
