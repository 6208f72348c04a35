"""MLflow as the record: where runs go, lineage tags, and a bounded wait for a server.

Local default: ``sqlite:///<root>/mlflow.db`` with artifacts under ``<root>/mlartifacts``
(no server needed). ``MLFLOW_TRACKING_URI`` points everything at a real server.

Every run carries the lineage tags below, so that from a registered student one can
walk back to the teacher and to the data both were trained on.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

# lineage tags set on every run of a pipeline
TAG_PIPELINE_RUN = "gem.pipeline_run_id"
TAG_STAGE = "gem.stage"
TAG_DATA_WINDOW = "gem.data_window"
TAG_DATA_DIGEST = "gem.data_digest"
TAG_FEATURE_VIEWS = "gem.feature_views"
TAG_TEACHER_VERSION = "gem.teacher_version"
TAG_SURFACE = "gem.surface"

DEFAULT_EXPERIMENT = "gem"


class TrackingUnavailable(RuntimeError):
    """The configured MLflow server did not answer within the retry budget."""


def default_tracking_uri(root: str | Path = "runs") -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"


def configure(root: str | Path = "runs", *, experiment: str = DEFAULT_EXPERIMENT, retries: int = 3,
              backoff_s: float = 1.0, timeout_s: float = 5.0) -> str:
    """Point MLflow at the tracking store and make sure it answers; returns the URI.

    For an HTTP server, probes ``/health`` at most ``retries`` times with exponential
    backoff and raises TrackingUnavailable with the URI and the last error, instead of
    letting the first log call hang. MLflow's own HTTP retries are bounded likewise.
    """
    import mlflow

    uri = default_tracking_uri(root)
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(retries))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", str(backoff_s))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(timeout_s)))
        wait_for_server(uri, retries=retries, backoff_s=backoff_s, timeout_s=timeout_s)
    else:
        Path(root).mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)  # the registry follows the tracking URI
    if mlflow.get_experiment_by_name(experiment) is None:
        artifact_location = None
        if uri.startswith("sqlite:"):
            artifact_location = (Path(root).resolve() / "mlartifacts" / experiment).as_uri()
        mlflow.create_experiment(experiment, artifact_location=artifact_location)
    mlflow.set_experiment(experiment)
    return uri


def wait_for_server(uri: str, *, retries: int = 3, backoff_s: float = 1.0, timeout_s: float = 5.0) -> None:
    last: Exception | None = None
    for attempt in range(retries):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as response:
                if response.status == 200:
                    return
                last = RuntimeError(f"HTTP {response.status}")
        except (urllib.error.URLError, OSError) as exc:
            last = exc
        if attempt + 1 < retries:
            time.sleep(backoff_s * 2**attempt)
    raise TrackingUnavailable(
        f"MLflow tracking server {uri} unreachable after {retries} attempts ({last}); "
        "unset MLFLOW_TRACKING_URI to use the local sqlite store"
    )


@contextlib.contextmanager
def stage_run(stage: str, *, tags: dict[str, str] | None = None, parent_run_id: str | None = None,
              run_name: str | None = None) -> Iterator["object"]:
    """A run for one pipeline stage, nested under the pipeline's parent run when given
    (the parent may live in another process, as with kfp components)."""
    import mlflow

    all_tags = {TAG_STAGE: stage, **(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    with mlflow.start_run(run_name=run_name or stage, tags=all_tags, nested=mlflow.active_run() is not None) as run:
        yield run
