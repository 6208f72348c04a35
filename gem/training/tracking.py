"""MLflow tracking: params, metrics, the input data window and digest, plots and the
(unsharded) model. Only rank 0 talks to MLflow; the other ranks get a no-op tracker.

MLflow calls run on one background thread, in call order, so training never waits for
the tracking store: opening it (importing MLflow, creating a fresh sqlite schema) takes
seconds, and each logged batch of metrics a few milliseconds. Calls that hand over
objects (figures, the model) and ``end`` wait for the thread; an error on the thread is
raised by the next call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import threading
from pathlib import Path
from typing import Any, Callable

from gem.utils.cache import cache_dir

log = logging.getLogger(__name__)

# Loading the logged model needs these; torchrec itself must be installed with
# --no-deps (its metadata pins the CUDA fbgemm-gpu), see the model's description.
MODEL_PIP_REQUIREMENTS = [
    "torch==2.13.0", "fbgemm-gpu-cpu==1.8.0", "tensordict", "pyre-extensions",
    "torchmetrics==1.0.3", "numpy", "pyyaml",
]


def dataset_digest(features: str, spec: dict) -> tuple[str, dict[str, str]]:
    """A digest of the features directory (manifest + file names and sizes) and its
    time window (from the manifest's window_* keys when present)."""
    h = hashlib.sha256(json.dumps(spec, sort_keys=True).encode())
    window: dict[str, str] = {}
    root = Path(features)
    if root.is_dir():
        manifest = root / "manifest.json"
        if manifest.is_file():
            text = manifest.read_text()
            h.update(text.encode())
            try:
                raw = json.loads(text)
                window = {k: str(v) for k, v in raw.items() if "window" in k and not isinstance(v, (dict, list))}
            except json.JSONDecodeError:
                pass
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            h.update(f"{path.relative_to(root)}:{path.stat().st_size}".encode())
    else:
        h.update(features.encode())
    return h.hexdigest()[:16], window


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


class Tracker:
    def __init__(self, enabled: bool, uri: str, experiment: str, run_name: str = "",
                 run_id: str | None = None, system_metrics: bool = True) -> None:
        """Returns at once; the store and the run are opened on the tracking thread."""
        self.enabled = enabled
        self._run_id = run_id
        self._opened = threading.Event()
        self._error: BaseException | None = None
        if not enabled:
            return
        self.mlflow = None
        self._jobs: queue.Queue[tuple[Callable[[], None], threading.Event | None, bool] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="mlflow-tracking", daemon=True)
        self._thread.start()
        self._submit(lambda: self._open(uri, experiment, run_name, run_id, system_metrics))

    # -- the tracking thread ---------------------------------------------------------
    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, done, always = item
            if self._error is None or always:
                try:
                    job()
                except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                    self._error = self._error or exc
                    self._opened.set()  # nobody waits for a run that will not open
            if done is not None:
                done.set()

    def _open(self, uri: str, experiment: str, run_name: str, run_id: str | None, system_metrics: bool) -> None:
        prepare_sqlite_store(uri)
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(uri)
        artifact_root = None
        if uri.startswith("sqlite:///"):
            artifact_root = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
        if mlflow.get_experiment_by_name(experiment) is None:
            mlflow.create_experiment(experiment, artifact_location=artifact_root)
        mlflow.set_experiment(experiment)
        # MLflow's active run is per thread: this one stays active on the tracking thread.
        run = mlflow.start_run(run_id=run_id, run_name=run_name or None, log_system_metrics=system_metrics)
        self._run_id = run.info.run_id
        self._opened.set()

    def _submit(self, job: Callable[[], None], wait: bool = False) -> None:
        self._raise_error()
        done = threading.Event() if wait else None
        self._jobs.put((job, done, False))
        if done is not None:
            done.wait()
            self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"MLflow tracking failed: {self._error}") from self._error

    # -- the caller's side -----------------------------------------------------------
    @property
    def run_id(self) -> str | None:
        """The run's id (waits for the run to be opened)."""
        if self.enabled:
            self._opened.wait()
            self._raise_error()
        return self._run_id

    def log_params(self, params: dict[str, Any]) -> None:
        if self.enabled:
            clean = {k: str(v)[:500] for k, v in params.items()}
            self._submit(lambda: self.mlflow.log_params(clean))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.enabled and metrics:
            clean = {k.replace("/", "."): float(v) for k, v in metrics.items()}
            self._submit(lambda: self.mlflow.log_metrics(clean, step=step))

    def log_input(self, features: str, spec: dict, num_examples: int, context: str = "training") -> None:
        if not self.enabled:
            return
        digest, window = dataset_digest(features, spec)

        def job() -> None:
            from mlflow.data.code_dataset_source import CodeDatasetSource
            from mlflow.data.dataset_source_registry import resolve_dataset_source
            from mlflow.data.meta_dataset import MetaDataset

            if Path(features).is_dir():
                source = resolve_dataset_source(str(Path(features).resolve()))
            else:
                source = CodeDatasetSource(tags={"uri": features})
            dataset = MetaDataset(source=source, name=Path(features).name or features, digest=digest)
            self.mlflow.log_input(dataset, context=context, tags={"num_examples": str(num_examples), **window})

        self._submit(job)
        self.log_params({f"data.{context}.digest": digest, f"data.{context}.num_examples": num_examples,
                         **{f"data.{context}.{k}": v for k, v in window.items()}})

    def log_figure(self, figure, name: str) -> None:
        if self.enabled:
            self._submit(lambda: self.mlflow.log_figure(figure, name), wait=True)

    def log_dict(self, payload: dict, name: str) -> None:
        if self.enabled:
            self._submit(lambda: self.mlflow.log_dict(payload, name), wait=True)

    def log_model(self, model, code_path: str) -> None:
        if not self.enabled:
            return

        def job() -> None:
            import mlflow.pytorch

            mlflow.pytorch.log_model(
                model, name="model", serialization_format="pickle", pip_requirements=MODEL_PIP_REQUIREMENTS,
                code_paths=[code_path],
                metadata={"note": "install torchrec==1.8.0 with --no-deps (it pins the CUDA fbgemm-gpu)"},
            )

        self._submit(job, wait=True)

    def end(self, status: str = "FINISHED") -> None:
        """End the run and stop the thread (waits for every queued call)."""
        if not self.enabled or not self._thread.is_alive():
            return
        failed = self._error is not None

        def job() -> None:
            if self.mlflow is not None and self.mlflow.active_run() is not None:
                self.mlflow.end_run(status="FAILED" if failed else status)

        self._jobs.put((job, None, True))
        self._jobs.put(None)
        self._thread.join()
        if status != "FAILED":
            self._raise_error()
