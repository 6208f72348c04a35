"""Run a pipeline through kfp.local in this environment (SubprocessRunner, no venv:
every task imports the installed project)."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def init_local(pipeline_root: Path) -> None:
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root),
               raise_on_error=True)


def run_pipeline(workspace: str | Path, *, refresh: bool = False, **params) -> dict:
    """Run gem_pipeline (or refresh_pipeline) locally; returns the summary it wrote to the
    workspace. ``tracking_root`` defaults to the workspace (MLflow on sqlite there)."""
    import json

    from gem_app.pipelines.gem_pipeline import make_gem_pipeline

    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    init_local(workspace / "kfp")
    run_id = params.pop("run_id", None) or dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    make_gem_pipeline(None, refresh=refresh)(workspace=str(workspace), run_id=run_id, **params)
    return json.loads((workspace / "summary.json").read_text())


def run_gem_pipeline(workspace: str | Path, **params) -> dict:
    return run_pipeline(workspace, refresh=False, **params)
