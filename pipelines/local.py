"""Run a pipeline through kfp.local in this environment (SubprocessRunner, no venv:
every task imports the installed project)."""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def init_local(pipeline_root: Path) -> None:
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root),
               raise_on_error=True)


def run_gem_pipeline(workspace: str | Path, **params) -> dict:
    """Run gem_pipeline locally; returns the summary written to the workspace."""
    import json

    from pipelines.gem_pipeline import make_gem_pipeline

    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    init_local(workspace / "kfp")
    run_id = params.pop("run_id", None) or dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    os.environ.setdefault("GEM_ATTENTION_BACKEND", os.environ.get("GEM_ATTENTION_BACKEND", ""))
    make_gem_pipeline(None)(workspace=str(workspace), run_id=run_id, **params)
    return json.loads((workspace / "summary.json").read_text())
