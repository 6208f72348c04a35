"""MLflow as the record: where runs go, lineage tags, and a bounded wait for a server.

Local default: ``sqlite:///<root>/mlflow.db`` with artifacts under ``<root>/mlartifacts``
(no server needed). ``MLFLOW_TRACKING_URI`` points everything at a real server.

Two rules for every caller (training, knowledge, the pipeline):

- ``redact(text)`` before a tracking URI is printed, raised or logged as a param:
  ``https://user:secret@host/?token=abc`` -> ``https://***@host/?token=***``;
- one retry policy, ``RETRY`` (tenacity): a tracking server that does not answer fails
  with TrackingUnavailable naming the redacted URI within about ``RETRY.total_s``
  seconds, and ``bound_http_retries()`` bounds MLflow's own HTTP retries likewise
  (MLflow's defaults wait minutes: 266 s were seen for an unreachable URI).

Every run carries the lineage tags below, so that from a registered student one can
walk back to the teacher and to the data both were trained on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from gem.utils.cache import cache_dir

log = logging.getLogger(__name__)

# lineage tags set on every run of a pipeline
TAG_PIPELINE_RUN = "gem.pipeline_run_id"
TAG_STAGE = "gem.stage"
TAG_DATA_WINDOW = "gem.data_window"
TAG_DATA_DIGEST = "gem.data_digest"
TAG_FEATURE_VIEWS = "gem.feature_views"
TAG_TEACHER_VERSION = "gem.teacher_version"
TAG_SURFACE = "gem.surface"
TAG_MODEL_ROLE = "gem.model_role"  # teacher | student: what the run's holdout/* figures are of

# One vocabulary for every model's holdout figures (click task): the teacher's run (every
# surface, gem.surface "all") and each student's run (its surface) log the same names, so
# MLflow compares them column by column; the surface is the gem.surface tag, not the name.
HOLDOUT_FIGURES = ("auc", "ne", "calibration", "positives", "negatives", "rows")

DEFAULT_EXPERIMENT = "gem"
# the UI opens an experiment of this kind on its training runs (not the GenAI pages)
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
NOTE_TAG = "mlflow.note.content"  # the description the UI shows for a run or an experiment
EXPERIMENT_DESCRIPTION = (
    "Runs of gem: the GEM ads foundation model (the teacher) and its per-surface vertical models "
    "(students). Start with a pipeline run, named `gem-pipeline <data> <time>`: its description is the "
    "run's summary (each model's decision and why), its metrics the run's headline figures, so that "
    "pipeline runs compare side by side. Its child runs are the stages: `features-*`, `feast`, `train` "
    "(the teacher), `knowledge`, `distill-<surface>` (a student) and `gate-<model>` (the decision). "
    "The teacher's and the students' runs share the `holdout/*` metric names, the surface being the "
    "`gem.surface` tag: select them and compare.")


def ui_link(experiment_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """The experiment's runs in the UI's model-training view (MLflow 3 opens the GenAI
    pages by default, whatever the experiment's kind)."""
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def holdout_metrics(figures: dict[str, float]) -> dict[str, float]:
    """``holdout/<figure>`` for the HOLDOUT_FIGURES in ``figures`` that are numbers (an AUC
    short of evidence is NaN and left out); ``rows`` = positives + negatives when absent."""
    import math

    values = dict(figures)
    if "rows" not in values and "positives" in values and "negatives" in values:
        values["rows"] = float(values["positives"]) + float(values["negatives"])
    return {f"holdout/{k}": float(values[k]) for k in HOLDOUT_FIGURES
            if values.get(k) is not None and math.isfinite(float(values[k]))}


def dataset_entity(source_uri: str, name: str, digest: str, *, profile: dict | None = None,
                   columns: dict[str, str] | None = None):
    """An MLflow dataset (``mlflow.entities.Dataset``) whose drawer in the UI shows its
    counts (``profile``, e.g. ``{"num_examples": 5917}``) and its columns (``columns``:
    name -> MLflow type, ``long`` / ``double`` / ``string`` / ``boolean`` / ``datetime``)."""
    import json

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.entities import Dataset
    from mlflow.types import ColSpec, Schema

    source = resolve_dataset_source(source_uri)
    schema = Schema([ColSpec(kind, column) for column, kind in columns.items()]) if columns else None
    return Dataset(name=name, digest=digest, source_type=source._get_source_type(), source=source.to_json(),
                   schema=json.dumps({"mlflow_colspec": schema.to_dict()}) if schema else None,
                   profile=json.dumps(profile) if profile else None)


def features_columns(spec: dict) -> dict[str, str]:
    """The columns a features window gives a model, from its manifest's ``spec``: sparse
    ids, the history sequences (ids per event), dense features and labels."""
    columns = {name: "long" for name in spec.get("sparse", {})}
    columns.update({name: "long" for name in spec.get("sequence", {})})
    columns.update({name: "double" for name in spec.get("dense", [])})
    columns.update({f"label_{task}": "double" for task in spec.get("tasks", [])})
    return columns


class TrackingUnavailable(RuntimeError):
    """The configured MLflow server did not answer within the retry budget."""


# -- redaction --------------------------------------------------------------------------
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_HIDDEN = "***"


def _redact_url(url: str) -> str:
    url = re.sub(r"^([^:]+://)[^/?#]*@", rf"\1{_HIDDEN}@", url)  # user:password@ in the authority
    head, sep, query = url.partition("?")
    if not sep:
        return url
    query, hash_, fragment = query.partition("#")
    query = "&".join(f"{p.split('=', 1)[0]}={_HIDDEN}" if "=" in p else (_HIDDEN if p else p) for p in query.split("&"))
    return f"{head}?{query}{hash_}{fragment}"


def redact(text: object) -> str:
    """``text`` with every URL's credentials (user:password@) and query values hidden;
    the rest (scheme, host, port, path) kept so that the URI is still recognisable."""
    return _URL.sub(lambda m: _redact_url(m.group(0)), str(text))


# -- bounded retries --------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    total_s: float = 20.0  # stop retrying after this long (a last attempt may start before)
    backoff_s: float = 1.0  # first wait; doubles, at most max_wait_s
    max_wait_s: float = 8.0
    timeout_s: float = 5.0  # one request

    def retrying(self, *retry_on: type[BaseException]):
        import tenacity

        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts) | tenacity.stop_after_delay(self.total_s),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s, max=self.max_wait_s),
            retry=tenacity.retry_if_exception_type(retry_on or (OSError,)), reraise=True)


RETRY = RetryPolicy()


def bound_http_retries(policy: RetryPolicy = RETRY) -> None:
    """Bound MLflow's own HTTP client retries (unless set explicitly by the user)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(max(0, policy.attempts - 2)))
    # MLflow reads the factor as an int: "0.1" made every later MLflow call fail to parse it
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", str(int(round(policy.backoff_s))))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(policy.timeout_s)))


def ensure_reachable(uri: str, policy: RetryPolicy = RETRY) -> None:
    """For an http(s) tracking URI: bound MLflow's retries and wait (boundedly) for the
    server; other stores (sqlite, file) need nothing."""
    if uri.startswith(("http://", "https://")):
        bound_http_retries(policy)
        wait_for_server(uri, policy=policy)


_HONOURED_ENV: set[str] = set()


def _user_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when a user (or the pipeline's task env) gave it, not when
    ``mlflow.set_tracking_uri`` wrote it: mlflow copies every URI it is pointed at into
    that variable, which would otherwise pin every later store to the first one used."""
    from mlflow.tracking._tracking_service import utils as mlflow_uri

    env = os.environ.get("MLFLOW_TRACKING_URI", "")
    if env and (env in _HONOURED_ENV or env != getattr(mlflow_uri, "_tracking_uri", None)):
        _HONOURED_ENV.add(env)
        return env
    return ""


def default_tracking_uri(root: str | Path = "runs") -> str:
    return _user_tracking_uri() or f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"


def configure(root: str | Path = "runs", *, experiment: str = DEFAULT_EXPERIMENT, policy: RetryPolicy = RETRY,
              retries: int | None = None, backoff_s: float | None = None, timeout_s: float | None = None) -> str:
    """Point MLflow at the tracking store and make sure it answers; returns the URI.

    For an HTTP server, probes ``/health`` under ``policy`` and raises
    TrackingUnavailable with the redacted URI and the last error, instead of letting the
    first log call hang. MLflow's own HTTP retries are bounded likewise.
    """
    import mlflow

    policy = dataclasses.replace(policy, **{k: v for k, v in (("attempts", retries), ("backoff_s", backoff_s),
                                                             ("timeout_s", timeout_s)) if v is not None})
    uri = default_tracking_uri(root)
    if uri.startswith(("http://", "https://")):
        ensure_reachable(uri, policy)
    else:
        Path(root).mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)  # the registry follows the tracking URI
    with _store_lock(uri):  # concurrent first users of one sqlite store: one creates it
        prepare_sqlite_store(uri)
        found = mlflow.get_experiment_by_name(experiment)
        if found is None:
            artifact_location = None
            if uri.startswith("sqlite:///"):  # beside the store, whichever workspace opened it first
                artifact_location = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts" / experiment).as_uri()
            mlflow.create_experiment(experiment, artifact_location=artifact_location,
                                     tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND, NOTE_TAG: EXPERIMENT_DESCRIPTION})
            if uri.startswith("sqlite:///"):
                _retire_default_experiment()
        elif NOTE_TAG not in found.tags:  # a store made before experiments were described
            mlflow.MlflowClient().set_experiment_tag(found.experiment_id, NOTE_TAG, EXPERIMENT_DESCRIPTION)
    mlflow.set_experiment(experiment)
    return uri


def prepare_sqlite_store(uri: str) -> bool:
    """Start a new sqlite store as a copy of an empty, fully migrated one, kept in the
    cache per MLflow version: MLflow builds a fresh schema by running every migration
    (~2.7 s on 2 cores), a copy takes milliseconds. MLflow still verifies the schema
    revision on open and adds its default experiment. Returns whether it copied; on any
    failure MLflow creates the schema itself as before."""
    if not uri.startswith("sqlite:///"):
        return False
    path = Path(uri[len("sqlite:///"):])
    if path.exists():
        return False
    try:
        import mlflow

        template = cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"
        if not template.is_file():
            from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine_with_retry

            template.parent.mkdir(parents=True, exist_ok=True)
            fresh = template.with_suffix(f".{os.getpid()}.tmp")
            engine = create_sqlalchemy_engine_with_retry(f"sqlite:///{fresh}")
            _initialize_tables(engine)
            engine.dispose()
            os.replace(fresh, template)
        path.parent.mkdir(parents=True, exist_ok=True)
        copy = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        shutil.copyfile(template, copy)
        try:
            os.link(copy, path)  # never replaces a store another process just created
        except FileExistsError:
            pass
        finally:
            copy.unlink()
        return True
    except Exception as exc:  # noqa: BLE001 - MLflow initialises the store itself
        log.debug("no sqlite store template: %s", exc)
        return False


def _retire_default_experiment() -> None:
    """MLflow gives a new store a ``Default`` experiment whose artifacts would go under
    the current directory; nothing of gem logs there, so it is deleted (hidden in the UI)
    when the store's first gem experiment is created."""
    import mlflow

    client = mlflow.MlflowClient()
    with contextlib.suppress(Exception):
        default = client.get_experiment("0")
        if default.name == "Default" and default.lifecycle_stage == "active" and not client.search_runs(["0"],
                                                                                                       max_results=1):
            client.delete_experiment("0")


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    if not uri.startswith("sqlite:///"):
        yield
        return
    from filelock import FileLock

    db = Path(uri[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(db.parent / f".{db.name}.lock", timeout=300):
        yield


class _NotHealthy(OSError):
    pass


def wait_for_server(uri: str, *, policy: RetryPolicy = RETRY) -> None:
    """Probe ``<uri>/health`` under ``policy``; TrackingUnavailable (redacted) if it never answers."""
    parts = urllib.parse.urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]  # credentials go in a header, not the URL
    health = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    request = urllib.request.Request(health)
    if parts.username is not None:
        import base64

        token = base64.b64encode(f"{urllib.parse.unquote(parts.username)}:"
                                 f"{urllib.parse.unquote(parts.password or '')}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    attempts = 0

    def probe() -> None:
        nonlocal attempts
        attempts += 1
        with urllib.request.urlopen(request, timeout=policy.timeout_s) as response:
            if response.status != 200:
                raise _NotHealthy(f"HTTP {response.status}")

    try:
        policy.retrying(OSError)(probe)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise TrackingUnavailable(
            f"MLflow tracking server {redact(uri)} unreachable after {attempts} attempts "
            f"({redact(exc)}); check MLFLOW_TRACKING_URI, or unset it to use the local sqlite store"
        ) from None


@functools.lru_cache(maxsize=1)
def source_tags() -> dict[str, str]:
    """Who ran it and which code: MLflow's user and git commit tags (its own detection
    looks at the entry point's file, which under kfp is kfp's executor, and runs made
    with MlflowClient.create_run get neither). The commit comes from ``$GEM_GIT_COMMIT``
    (an image build) or the project's git checkout; ``gem.git_dirty`` says whether
    tracked files differed from it."""
    import getpass
    import subprocess

    tags = {"mlflow.source.type": "JOB", "mlflow.source.name": "gem (python -m gem)"}
    with contextlib.suppress(Exception):
        tags["mlflow.user"] = os.environ.get("GEM_USER") or getpass.getuser()
    commit = os.environ.get("GEM_GIT_COMMIT", "")
    root = Path(__file__).resolve().parents[1]
    if not commit and (root / ".git").exists():
        def git(*args: str) -> str:
            try:
                done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                return ""
            return done.stdout.strip() if done.returncode == 0 else ""

        commit = git("rev-parse", "HEAD")
        if commit:
            tags["gem.git_dirty"] = str(bool(git("status", "--porcelain", "--untracked-files=no"))).lower()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


@contextlib.contextmanager
def stage_run(stage: str, *, tags: dict[str, str] | None = None, parent_run_id: str | None = None,
              run_name: str | None = None) -> Iterator["object"]:
    """A run for one pipeline stage, nested under the pipeline's parent run when given
    (the parent may live in another process, as with kfp components), with the source
    tags (user, git commit)."""
    import mlflow

    all_tags = {**source_tags(), TAG_STAGE: stage, **(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    with mlflow.start_run(run_name=run_name or stage, tags=all_tags, nested=mlflow.active_run() is not None) as run:
        yield run
