"""What every stage shares, written once: which pipeline run it belongs to, its MLflow
run, and reuse of a finished result keyed on the content of its inputs.

A stage function does its step's work and returns a typed result (a dataclass with
``as_dict``); ``tracked`` gives it an MLflow run nested under the pipeline's parent run
with the lineage tags; ``Reuse`` records the result beside the stage's outputs under a
key of input digests, config and code version, and hands it back on a rerun only when
every part of that key is unchanged.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from gem import registry, tracking
from gem.utils.atomic import write_json
from gem.utils.digest import code_version, value_digest

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class RunContext:
    """Which pipeline run a stage belongs to and where MLflow lives (JSON-serialised
    into every component as one string parameter)."""

    pipeline_run_id: str
    tracking_root: str  # local MLflow store root (ignored when MLFLOW_TRACKING_URI is set)
    parent_run_id: str = ""
    experiment: str = registry.EXPERIMENT

    def __post_init__(self) -> None:
        if not self.tracking_root:
            raise ValueError("RunContext.tracking_root is empty; give the local MLflow store's folder")

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> "RunContext":
        return cls(**json.loads(text))

    def configure(self) -> str:
        """Point MLflow at the run's store; paths the stage records are then shown relative
        to the run's workspace, its tracking root (gem.utils.paths)."""
        from gem.utils.paths import WORKSPACE_ENV

        os.environ[WORKSPACE_ENV] = str(Path(self.tracking_root).resolve())
        return tracking.configure(self.tracking_root, experiment=self.experiment)


class StageResult:
    """Base of every stage's typed result: ``as_dict`` is what a kfp component returns
    (kfp parameters can't carry None: nested None becomes "")."""

    def as_dict(self) -> dict:
        return without_nulls(asdict(self))  # type: ignore[call-overload]


def without_nulls(value):
    """``value`` as kfp can carry it: None, and a figure not computed (NaN, e.g. an AUC
    short of evidence), become ""."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return value


def start_pipeline(ctx: RunContext, *, params: dict | None = None, tags: dict | None = None,
                   run_name: str = "") -> RunContext:
    """Create the pipeline's parent run (left open; ``finish_pipeline`` closes it), named
    ``run_name`` (default ``pipeline-<id>``). A promotion commit that died half-way in
    an earlier run is undone first (gem_app.promotion.recover)."""
    import mlflow
    from mlflow.entities import Param

    from gem_app.promotion import recover

    ctx.configure()
    recover(Path(ctx.tracking_root) / ".runs")
    client = mlflow.MlflowClient()
    _close_abandoned_parent(client, ctx.tracking_root)
    experiment = client.get_experiment_by_name(ctx.experiment)
    run = client.create_run(experiment.experiment_id, run_name=run_name or f"pipeline-{ctx.pipeline_run_id}",
                            tags={**tracking.source_tags(), tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id,
                                  tracking.TAG_STAGE: "pipeline", **(tags or {})})
    client.log_batch(run.info.run_id, params=[Param(key, str(value)[:500]) for key, value in (params or {}).items()])
    return RunContext(pipeline_run_id=ctx.pipeline_run_id, tracking_root=ctx.tracking_root,
                      parent_run_id=run.info.run_id, experiment=ctx.experiment)


def _close_abandoned_parent(client, tracking_root: str) -> None:
    """The parent run of an earlier pipeline run on this tracking root that was killed
    (still RUNNING: its summary never closed it) is marked KILLED; a local run holds the
    workspace lock, so no other run is active here. Its stage runs stay as they are (a
    rerun resumes the pretraining run)."""
    from mlflow.exceptions import MlflowException

    path = Path(tracking_root) / ".runs" / "active.json"
    try:
        earlier = json.loads(path.read_text()).get("parent_run_id", "")
        if earlier and client.get_run(earlier).info.status == "RUNNING":
            client.set_terminated(earlier, status="KILLED")
    except (OSError, ValueError, MlflowException):
        return


def run_label(data: str, params: dict, keys: dict) -> tuple[str, str, str]:
    """(parent run name, ``data`` param, ``data_digest`` param) of a pipeline run: what
    ran on which data when (``refresh-pipeline movielens 2026-01-08 03:00Z``), and
    params that are never empty (a simulated dataset is named by its simulator preset
    and config digest)."""
    import datetime as dt

    when = f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%MZ}"
    if data:
        name = Path(data).name
        try:
            name = json.loads((Path(data) / "manifest.json").read_text()).get("name") or name
        except (OSError, ValueError):
            pass
        data_param, digest = data, keys.get("data", "")
    else:
        name = f"simulated-{params.get('sim_preset', '')}"
        data_param, digest = f"simulated (simulator preset {params.get('sim_preset', '')})", \
            f"simulator config {keys.get('sim', '')}"
    return f"{params.get('pipeline', 'gem-pipeline')} {name} {when}", data_param, digest


def finish_pipeline(ctx: RunContext, summary: dict, status: str = "FINISHED", description: str = "") -> None:
    """Close the parent run; ``description`` (Markdown: the summary table) becomes what
    its page shows first."""
    import mlflow

    ctx.configure()
    client = mlflow.MlflowClient()
    client.log_dict(ctx.parent_run_id, summary, "pipeline_summary.json")
    if description:
        client.set_tag(ctx.parent_run_id, "mlflow.note.content", description)
    client.set_terminated(ctx.parent_run_id, status=status)


@contextmanager
def tracked(ctx: RunContext, name: str, *, tags: dict | None = None) -> Iterator[object]:
    """An MLflow run for one stage, nested under the pipeline run, with lineage tags."""
    ctx.configure()
    all_tags = {tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id, **(tags or {})}
    with tracking.stage_run(name, tags=all_tags, parent_run_id=ctx.parent_run_id or None) as run:
        fault_point(f"{name}:mid")
        yield run


FAULT_ENV = "GEM_FAULT"


class InjectedFault(RuntimeError):
    """The failure ``$GEM_FAULT=fail@<point>`` asks for."""


def fault_point(name: str) -> None:
    """The fault-injection benchmark's hook (benchmarks/reliability_bench.py): when
    ``$GEM_FAULT`` names this point, the whole pipeline run (this process group) dies
    by SIGKILL here, as a lost machine would; ``fail@<point>`` makes the step fail
    here instead (an error, as a bug or bad data would raise)."""
    wanted = os.environ.get(FAULT_ENV, "")
    if wanted == name:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    if wanted == f"fail@{name}":
        raise InjectedFault(f"injected failure at {name} ({FAULT_ENV}={wanted})")


def record_path(out: str | Path, stage: str) -> Path:
    """Where a stage keeps its records about an output folder it does not own (beside it,
    so the folder itself stays exactly what its writer put there)."""
    out = Path(out)
    return out.parent / ".stages" / f"{out.name}.{stage}.json"


def log_model_input(model_uri: str, run_id: str | None = None) -> None:
    """A registered model (``models:/<name>/<version>``) as an MLflow 3 model input of the
    active run: the teacher -> student link the UI follows."""
    import mlflow
    from mlflow.entities import LoggedModelInput

    if not model_uri.startswith("models:/"):
        return
    client, rest = mlflow.MlflowClient(), model_uri[len("models:/"):]
    if "@" in rest:
        mv = client.get_model_version_by_alias(*rest.split("@", 1))
    else:
        mv = client.get_model_version(*rest.split("/", 1))
    # a version registered from models:/<model_id> names its logged model in its source
    # (MLflow 3.17 leaves model_id empty on it)
    model_id = mv.model_id or (mv.source[len("models:/"):] if (mv.source or "").startswith("models:/m-") else "")
    if model_id:
        client.log_inputs(run_id or mlflow.active_run().info.run_id, models=[LoggedModelInput(model_id)])


class Reuse:
    """A finished stage's result, recorded at ``path`` under a content key.

    The key holds what the result depends on: digests of the input data, the resolved
    config, upstream model versions, and the code version (added here). A path or a
    file's existence alone never makes a result reusable."""

    def __init__(self, path: str | Path, key: dict):
        self.path = Path(path)
        self.key = {**key, "code": code_version()}
        self.digest = value_digest(self.key)

    def get(self) -> dict | None:
        if not self.path.is_file():
            return None
        record = json.loads(self.path.read_text())
        if record.get("digest") != self.digest:
            log.info("%s: inputs changed since it was recorded; running the stage again", self.path)
            return None
        log.info("%s: same inputs as the finished run; reusing its result", self.path)
        return record["result"]

    def put(self, result: dict) -> dict:
        write_json({"digest": self.digest, "key": self.key, "result": result}, self.path)
        fault_point(f"{self.path.stem}:recorded")
        return result
