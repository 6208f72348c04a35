"""MLflow tracking: params, metrics, the input data window and digest, plots and the
(unsharded) model. Only rank 0 talks to MLflow; the other ranks get a no-op tracker."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

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


def warm_up(uri: str) -> "threading.Thread":
    """Create (migrate) the tracking store in a background thread while the model is
    built: a fresh sqlite store takes seconds to initialise."""
    import threading

    def work() -> None:
        try:
            import mlflow

            mlflow.MlflowClient(uri).search_experiments(max_results=1)
        except Exception as exc:  # noqa: BLE001 - Tracker() will raise the real error
            log.debug("tracking warm-up failed: %s", exc)

    thread = threading.Thread(target=work, name="mlflow-warm-up", daemon=True)
    thread.start()
    return thread


class Tracker:
    def __init__(self, enabled: bool, uri: str, experiment: str, run_name: str = "",
                 run_id: str | None = None, system_metrics: bool = True) -> None:
        self.enabled = enabled
        self.run_id = run_id
        if not enabled:
            return
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(uri)
        artifact_root = None
        if uri.startswith("sqlite:///"):
            artifact_root = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
        if mlflow.get_experiment_by_name(experiment) is None:
            mlflow.create_experiment(experiment, artifact_location=artifact_root)
        mlflow.set_experiment(experiment)
        run = mlflow.start_run(run_id=run_id, run_name=run_name or None, log_system_metrics=system_metrics)
        self.run_id = run.info.run_id

    def log_params(self, params: dict[str, Any]) -> None:
        if self.enabled:
            self.mlflow.log_params({k: str(v)[:500] for k, v in params.items()})

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.enabled and metrics:
            clean = {k.replace("/", "."): float(v) for k, v in metrics.items()}
            self.mlflow.log_metrics(clean, step=step)

    def log_input(self, features: str, spec: dict, num_examples: int, context: str = "training") -> None:
        if not self.enabled:
            return
        from mlflow.data.code_dataset_source import CodeDatasetSource
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        digest, window = dataset_digest(features, spec)
        if Path(features).is_dir():
            source = resolve_dataset_source(str(Path(features).resolve()))
        else:
            source = CodeDatasetSource(tags={"uri": features})
        dataset = MetaDataset(source=source, name=Path(features).name or features, digest=digest)
        tags = {"num_examples": str(num_examples), **window}
        self.mlflow.log_input(dataset, context=context, tags=tags)
        self.log_params({f"data.{context}.digest": digest, f"data.{context}.num_examples": num_examples,
                         **{f"data.{context}.{k}": v for k, v in window.items()}})

    def log_figure(self, figure, name: str) -> None:
        if self.enabled:
            self.mlflow.log_figure(figure, name)

    def log_dict(self, payload: dict, name: str) -> None:
        if self.enabled:
            self.mlflow.log_dict(payload, name)

    def log_model(self, model, code_path: str) -> None:
        if not self.enabled:
            return
        import mlflow.pytorch

        mlflow.pytorch.log_model(
            model, name="model", serialization_format="pickle", pip_requirements=MODEL_PIP_REQUIREMENTS,
            code_paths=[code_path],
            metadata={"note": "install torchrec==1.8.0 with --no-deps (it pins the CUDA fbgemm-gpu)"},
        )

    def end(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self.mlflow.end_run(status=status)
