"""Run a pipeline through kfp.local in this environment (SubprocessRunner, no venv:
every task imports the installed project)."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from pathlib import Path

from gem.errors import MachineError, UserError

log = logging.getLogger(__name__)

# the sizes of every stage, by the name `pipeline run --preset` and `refresh --preset` take
PRESETS = {
    # tiny: seconds-scale data, so windows by evidence ask only for both labels per surface,
    # and the gate's evidence floor is 5 positives and negatives (the default 30 would leave
    # every smoke run's surfaces without a student: the distill plan skips what the gate must refuse)
    "tiny": {"sim_preset": "tiny", "features_preset": "smoke", "train_preset": "tiny", "student_preset": "pipeline",
             "window_evidence": {"examples": 10, "positives": 1},
             "gate_settings": {"min_positives": 5, "min_negatives": 5}},
    "small": {"sim_preset": "small", "features_preset": "pipeline", "train_preset": "pipeline",
              "student_preset": "pipeline"},
}


def new_run_id() -> str:
    """UTC time to the microsecond plus 4 random hex digits: unique across processes."""
    return f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S%f}-{secrets.token_hex(2)}"


# kfp.local runs at most 2 iterations of a ParallelFor at once (its ParallelExecutor's cap)
LOCAL_LOOP_PARALLELISM = 2


def init_local(pipeline_root: Path) -> None:
    import os

    from kfp import local

    from gem_app.components.runtime import LOCAL_PARALLEL_ENV

    os.environ[LOCAL_PARALLEL_ENV] = str(LOCAL_LOOP_PARALLELISM)  # the tasks inherit it (runtime.share_cores)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root),
               raise_on_error=True)


class StepRefused(UserError, RuntimeError):
    """A step refused its input (its UserError, in the task's process): the run failed
    before its commit, and the message is the step's own (exit 2 from ``python -m gem``)."""


class StepStopped(MachineError, RuntimeError):
    """The machine stopped a step (a full disk, the file size limit): the resource and
    what to do (exit 1 from ``python -m gem``, in one line)."""


def run_pipeline(workspace: str | Path, *, refresh: bool = False, cuts: list[str] | None = None, **params) -> dict:
    """Run gem_pipeline (or refresh_pipeline) locally; returns the summary it wrote to the
    workspace. ``tracking_root`` defaults to the workspace (MLflow on sqlite there).
    ``cuts``: [teacher_end, student_end] time cut points instead of the last-days split."""
    import json

    from gem_app.locks import exclusive
    from gem_app.pipelines.console import PipelineConsole
    from gem_app.pipelines.gem_pipeline import make_gem_pipeline
    from gem_app.stages.ingest import write_cuts

    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    init_local(workspace / "kfp")
    run_id = params.pop("run_id", None) or new_run_id()
    with exclusive(workspace, "pipeline", what="pipeline run"), PipelineConsole(workspace) as console:
        write_cuts(workspace, cuts)  # ingest reads them there (the compiled graph has no such parameter)
        try:
            make_gem_pipeline(None, refresh=refresh)(workspace=str(workspace), run_id=run_id, **params)
        except RuntimeError as exc:  # a task failed; the console read why in its log
            step = console.failed.name if console.failed else "a step"
            if console.refused:
                raise StepRefused(f"{console.refused}\n(the pipeline's {step} refused it; its log: "
                                  f"{console.failed.log if console.failed else workspace / 'logs'})") from None
            if console.machine:
                raise StepStopped(f"{console.machine} (in the pipeline's {step})") from exc
            raise
    return json.loads((workspace / "summary.json").read_text())


def run_gem_pipeline(workspace: str | Path, **params) -> dict:
    return run_pipeline(workspace, refresh=False, **params)
