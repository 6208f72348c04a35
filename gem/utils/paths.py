"""Paths as a run's record shows them: no machine paths in MLflow params, tags, dataset
sources or input examples. A path inside the run's workspace is written relative to it
(``features/holdout``), anything else as a ``file://`` URI; ``located`` reads either back.

    shown("/srv/runs/main/features/holdout", "/srv/runs/main")  # 'features/holdout'
    shown("/data/ciao", "/srv/runs/main")                         # 'file:///data/ciao'
    located("features/holdout", "/srv/runs/main")                 # Path('/srv/runs/main/features/holdout')

With no workspace given, both use ``$GEM_WORKSPACE`` (a pipeline stage's workspace: set
by ``RunContext.configure``), ``shown`` then falling back to a URI and ``located`` to the
working directory (a person scoring an input example from inside the workspace).
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

WORKSPACE_ENV = "GEM_WORKSPACE"


def shown(path: str | Path, workspace: str | Path | None = None) -> str:
    if not str(path):
        return ""
    full = Path(path).resolve()
    workspace = workspace or os.environ.get(WORKSPACE_ENV)
    if workspace:
        try:
            return full.relative_to(Path(workspace).resolve()).as_posix() or "."
        except ValueError:
            pass
    return full.as_uri()


def located(text: str, workspace: str | Path | None = None) -> Path:
    if text.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(text).path))
    path = Path(text)
    if path.is_absolute():
        return path
    return Path(workspace or os.environ.get(WORKSPACE_ENV) or ".") / path
