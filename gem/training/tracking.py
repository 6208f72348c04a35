"""MLflow tracking: params, metrics, the input data window and digest, plots and the
(unsharded) model. Only rank 0 talks to MLflow; the other ranks get a no-op tracker.

The MLflow client lives in a worker process (``serve``), fed through a pipe in call
order, so training never waits for it and never shares the GIL with it: importing
MLflow and opening a store is ~3.5 s of pure Python, which on a thread of the training
process slowed model building and the first steps by as much (seen: startup 5.4 s ->
9 s, MFU -20%). ``prestart_worker()`` at the top of an entry point does those imports
while the training process imports torch. Calls that must not be lost silently
(``run_id``, figures, ``end``) wait for the worker and raise its first error; the model
itself is logged from this process into the worker's run.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from gem.tracking import ensure_reachable, features_columns, prepare_sqlite_store, redact

log = logging.getLogger(__name__)

# the run tag naming the model a run logs (the pipeline's train run: gem_teacher)
MODEL_NAME_TAG = "gem.model_name"


def dataset_digest(features: str, spec: dict) -> tuple[str, dict[str, str]]:
    """The features window's digest and time window. A finished build (manifest with a
    content digest) is named by that digest, spelt as every other run's dataset input
    and ``gem.data_digest`` tag spell it (gem.utils.digest.lineage_digest), so one window
    is one MLflow dataset; anything else by a digest of its manifest, spec and files'
    names and sizes."""
    from gem.utils.digest import lineage_digest

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
                window.update({f"window_{k}": str(v) for k, v in (raw.get("window") or {}).items()
                               if not isinstance(v, (dict, list))})
                if raw.get("digest"):
                    return lineage_digest(str(raw["digest"])), window
            except json.JSONDecodeError:
                pass
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            h.update(f"{path.relative_to(root)}:{path.stat().st_size}".encode())
    else:
        h.update(features.encode())
    return h.hexdigest()[:16], window


def window_examples(features: str) -> int:
    """The examples a finished features window holds (its manifest's count), else 0."""
    try:
        return int(json.loads((Path(features) / "manifest.json").read_text())["counts"]["examples"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


# -- the worker process ----------------------------------------------------------------
class _Worker:
    """A child Python process running ``serve()``; messages are pickled (name, wait, args)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "from gem.training.tracking import serve; serve()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def send(self, name: str, *args: Any, wait: bool = False) -> Any:
        pickle.dump((name, wait, args), self.proc.stdin)
        self.proc.stdin.flush()
        if not wait:
            return None
        result, error = pickle.load(self.proc.stdout)
        if error:
            raise RuntimeError(f"MLflow tracking failed: {error}")
        return result

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()
        self.proc.wait()


_prestarted: _Worker | None = None


def prestart_worker() -> None:
    """Start the tracking worker now (its imports then overlap the caller's), on the
    process that will track: not on torchrun ranks other than 0."""
    global _prestarted
    if _prestarted is None and os.environ.get("RANK", "0") == "0":
        _prestarted = _Worker()


def _take_worker() -> _Worker:
    global _prestarted
    worker, _prestarted = _prestarted, None
    return worker if worker is not None and worker.proc.poll() is None else _Worker()


def serve() -> None:
    """The worker's loop: run each call with MLflow's fluent API (the run stays active
    here); reply to the calls that wait. The first error stops every later call but
    ``end``, and is what they reply. A closed pipe (the trainer died) ends the run as
    KILLED, which a resumed run reopens."""
    calls, replies = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything MLflow prints goes to stderr, not into the replies
    import mlflow
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  (the slow imports, before the first call)

    handlers = {"open": _open_run, "run_id": lambda: mlflow.active_run().info.run_id,
                "log_params": mlflow.log_params, "log_metrics": _log_metrics, "log_input": _log_input,
                "log_artifact": _log_artifact, "log_dict": mlflow.log_dict, "end": _end_run}
    error = ""
    while True:
        try:
            name, wait, args = pickle.load(calls)
        except EOFError:
            if mlflow.active_run() is not None:
                mlflow.end_run(status="KILLED")
            return
        result = None
        if not error or name == "end":
            try:
                result = handlers[name](*args)
            except BaseException as exc:  # noqa: BLE001 - replied to the trainer
                error = error or redact(f"{name}: {exc!r}\n{traceback.format_exc(limit=4)}")
        if wait:
            pickle.dump((result, error), replies)
            replies.flush()
        if name == "end":
            return


def _open_run(uri: str, experiment: str, run_name: str, run_id: str | None, system_metrics: bool,
              environ: dict[str, str]) -> str:
    import mlflow

    os.environ.clear()
    os.environ.update(environ)  # the trainer's, as of this call (e.g. MLFLOW_RUN_ID)
    prepare_sqlite_store(uri)
    mlflow.set_tracking_uri(uri)
    artifact_root = None
    if uri.startswith("sqlite:///"):
        artifact_root = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    if mlflow.get_experiment_by_name(experiment) is None:
        mlflow.create_experiment(experiment, artifact_location=artifact_root)
    mlflow.set_experiment(experiment)
    return mlflow.start_run(run_id=run_id, run_name=run_name or None, log_system_metrics=system_metrics).info.run_id


def _log_metrics(metrics: dict[str, float], step: int) -> None:
    import mlflow

    mlflow.log_metrics(metrics, step=step)


def _log_input(features: str, digest: str, num_examples: int, context: str, tags: dict[str, str],
               columns: dict[str, str] | None = None) -> None:
    import mlflow
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    from gem.tracking import dataset_entity

    # named as the pipeline's other runs name a features window (gem_app.stages.features)
    name = f"features/{Path(features).name or features}"
    tags = {"mlflow.data.context": context, "num_examples": str(num_examples), **tags}
    if Path(features).is_dir():  # a URI, not a machine path; counts and columns for the UI's drawer
        profile = {"num_examples": num_examples, **({"window": tags["window"]} if "window" in tags else {})}
        entity = dataset_entity(Path(features).resolve().as_uri(), name, digest, profile=profile, columns=columns)
    else:
        entity = MetaDataset(source=CodeDatasetSource(tags={"uri": features}), name=name,
                             digest=digest)._to_mlflow_entity()
    mlflow.MlflowClient().log_inputs(mlflow.active_run().info.run_id, datasets=[
        DatasetInput(entity, [InputTag(k, str(v)) for k, v in tags.items()])])


def _log_artifact(name: str, data: bytes) -> None:
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(name).name
        path.write_bytes(data)
        mlflow.log_artifact(str(path), artifact_path=str(Path(name).parent) if Path(name).parent.name else None)


def _end_run(status: str) -> None:
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.end_run(status=status)


# -- the trainer's side -----------------------------------------------------------------
class Tracker:
    def __init__(self, enabled: bool, uri: str, experiment: str, run_name: str = "",
                 run_id: str | None = None, system_metrics: bool = True) -> None:
        """Returns at once: the worker opens the store and the run."""
        self.enabled, self.uri = enabled, uri
        self._run_id, self._opened = run_id, False
        self._inputs: dict[str, str] = {}  # context -> features window logged as the run's input
        if not enabled:
            return
        ensure_reachable(uri)  # an unreachable server: TrackingUnavailable in ~20 s, URI redacted
        self._worker = _take_worker()
        self._worker.send("open", uri, experiment, run_name, run_id, system_metrics, dict(os.environ))

    @property
    def run_id(self) -> str | None:
        """The run's id (waits for the worker to have opened it)."""
        if self.enabled and not self._opened:
            self._run_id, self._opened = self._worker.send("run_id", wait=True), True
        return self._run_id

    def log_params(self, params: dict[str, Any]) -> None:
        if self.enabled:
            self._worker.send("log_params", {k: redact(v)[:500] for k, v in params.items()})

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.enabled and metrics:
            self._worker.send("log_metrics", {k: float(v) for k, v in metrics.items()}, step)

    def log_input(self, features: str, spec: dict, num_examples: int, context: str = "training") -> None:
        if not self.enabled:
            return
        digest, window = dataset_digest(features, spec)
        if "window_start" in window and "window_end" in window:  # one spelling of a window: start..end
            window = {"window": f"{window.pop('window_start')}..{window.pop('window_end')}", **window}
        num_examples = num_examples or window_examples(features)  # an evaluation window: its manifest's count
        self._inputs[context] = features
        self._worker.send("log_input", features, digest, num_examples, context, window, features_columns(spec))
        self.log_params({f"data.{context}.digest": digest, f"data.{context}.num_examples": num_examples,
                         **{f"data.{context}.{k}": v for k, v in window.items()}})

    def log_figure(self, figure, name: str) -> None:
        if self.enabled:
            png = io.BytesIO()
            figure.savefig(png, format="png")
            self._worker.send("log_artifact", name, png.getvalue(), wait=True)

    def log_dict(self, payload: dict, name: str) -> None:
        if self.enabled:
            self._worker.send("log_dict", payload, name, wait=True)

    def log_model(self, folder: Path) -> None:
        """Log the exported model folder (gem.model.store: tensors, JSON and digests, no
        pickle) as the run's MLflow pyfunc model (gem/training/pyfunc.py: signature, an
        input example from the run's evaluation window, weights-only loading), with the
        run's final evaluation metrics and its model settings. Its name is the run's
        ``gem.model_name`` tag (the pipeline's: the registered name), else ``model``;
        ``runs:/<run_id>/model`` and a registered version load with
        gem.model.store.load_model or mlflow.pyfunc.load_model. Logged from this process
        (the worker has no torch) into the worker's run."""
        if not self.enabled:
            return
        run_id = self.run_id
        import mlflow

        from gem.model.store import SPEC, log_pyfunc_model
        from gem.training import pyfunc

        mlflow.set_tracking_uri(self.uri)
        client = mlflow.MlflowClient(self.uri)
        self._worker.send("run_id", wait=True)  # every earlier call (metrics, inputs) has reached the store
        run = client.get_run(run_id)
        # the run's own experiment: one set earlier in this process (another store, another
        # experiment) would make start_run refuse the run id
        mlflow.set_experiment(experiment_id=run.info.experiment_id)
        tasks = json.loads((Path(folder) / SPEC).read_text())["tasks"]
        name = run.data.tags.get(MODEL_NAME_TAG, "model")
        params = {k: v for k, v in run.data.params.items() if k.startswith(("model.", "size.", "data."))}
        metrics = {k: v for k, v in run.data.metrics.items() if k.startswith("eval/")}
        example = pyfunc.input_example(self._inputs.get("evaluation") or self._inputs.get("training"))
        # Active here too while logging (MLflow links the logged model to the active run);
        # leaving it marks the run finished, and the worker's ``end`` sets the final status.
        with mlflow.start_run(run_id=run_id):
            uri = log_pyfunc_model(folder, name=name, code=pyfunc.CODE, signature=pyfunc.signature(tasks),
                                   input_example=example, pip_requirements=pyfunc.PIP_REQUIREMENTS,
                                   params=params, tags={"gem.run_id": run_id})
            if metrics:  # on the model, and again on the run: at the run's last step, not 0 (no flat line)
                step = max(m.step for m in client.get_metric_history(run_id, next(iter(metrics))))
                mlflow.log_metrics(metrics, step=step, model_id=uri[len("models:/"):])

    def end(self, status: str = "FINISHED") -> None:
        """End the run and the worker (waits for every call before it)."""
        if not self.enabled or self._worker.proc.stdin.closed:
            return
        try:
            self.run_id  # noqa: B018 - kept for RunResult after the worker is gone
            self._worker.send("end", status, wait=True)
        except RuntimeError:
            if status != "FAILED":
                raise
            log.warning("MLflow tracking failed as well", exc_info=True)  # the training error wins
        finally:
            self._worker.close()
