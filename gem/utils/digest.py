"""Content digests: what "the same input" means when a stage decides to reuse a result."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

_CHUNK = 1 << 20


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(root: str | Path, *, exclude: tuple[str, ...] = ()) -> str:
    """sha256 over every file under ``root`` (relative path and bytes), in path order.
    Hidden files and names in ``exclude`` (at any depth) are skipped; symlinks are
    followed, so a view of another dataset hashes like the dataset."""
    return digest_of_files(tree_files(root, exclude=exclude))


def tree_files(root: str | Path, *, exclude: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(relative POSIX path, sha256) of every file ``tree_digest`` covers, in its order:
    one walk from which digests over any subset follow (``digest_of_files``)."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root}: nothing to digest")
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if any(part.startswith(".") or part in exclude for part in rel.parts):
            continue
        out.append((rel.as_posix(), file_digest(path)))
    return out


def digest_of_files(files: list[tuple[str, str]], *, exclude: tuple[str, ...] = ()) -> str:
    """``tree_digest`` from ``tree_files``' entries, less those with a part in ``exclude``."""
    h = hashlib.sha256()
    for rel, digest in files:
        if exclude and any(part in exclude for part in rel.split("/")):
            continue
        h.update(rel.encode() + b"\0" + digest.encode())
    return h.hexdigest()


def path_digest(path: str | Path) -> str:
    """A file's digest, or a folder's ``tree_digest``: the content of an input given by path."""
    return file_digest(path) if Path(path).is_file() else tree_digest(path)


def value_digest(value: object) -> str:
    """sha256 of a JSON-able value (keys sorted), e.g. a config or a reuse key."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


@functools.cache
def code_version() -> str:
    """A digest of the project's own Python sources: a result computed by other code is
    not reused."""
    top = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for pkg in ("gem", "students", "kernels", "gem_app"):
        for path in sorted((top / pkg).rglob("*.py")):
            h.update(path.relative_to(top).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


LINEAGE_CHARS = 32  # MLflow keeps at most 36 characters of a dataset digest


def lineage_digest(digest: str) -> str:
    """The spelling of a content digest in lineage: MLflow dataset inputs and the
    ``gem.data_digest`` tags carry the same string."""
    return digest[:LINEAGE_CHARS]
