"""The one way a model is saved and loaded: tensors and JSON, checked by digest, never
unpickled.

    save_model(model, cfg, spec, "runs/x/model")       # weights.pt, model_config.json,
                                                       # feature_spec.json, digests.json
    stored = load_model("runs/x")                      # a run folder or its model/ folder
    stored = load_model("models:/gem-teacher@prod")    # or runs:/<id>/model (MLflow)
    log_model(folder, registered_name="gem-teacher")   # into the active MLflow run

``weights.pt`` is ``torch.save`` of a plain state dict (tensors only); ``digests.json``
maps each file to its sha256. Loading verifies every digest first (a replaced or edited
file is refused with ModelStoreError naming it) and then reads the weights with
``torch.load(weights_only=True)``, which refuses any pickled object, so that even a
folder without digests (written before they existed: loaded with a warning) cannot run
code. MLflow models are logged as these files (an MLflow "logged model" holding them,
registrable) and downloaded with ``mlflow.artifacts.download_artifacts``: never through
``mlflow.pytorch.load_model``, which unpickles.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gem.data.batch import FeatureSpec
from gem.model.config import ModelConfig

if TYPE_CHECKING:  # torch loads where tensors are read or written: resolve() and verify() need none
    import torch
    from torch import nn

log = logging.getLogger(__name__)

WEIGHTS, CONFIG, SPEC, DIGESTS = "weights.pt", "model_config.json", "feature_spec.json", "digests.json"
FILES = (WEIGHTS, CONFIG, SPEC)
MODEL_DIR = "model"
MLFLOW_PREFIXES = ("runs:/", "models:/")
PYFUNC_ARTIFACTS = "artifacts"  # where MLflow puts a pyfunc model's artifacts


class ModelStoreError(ValueError):
    """A model folder that is incomplete, altered since it was saved, or not loadable safely."""


@dataclass
class StoredModel:
    model: nn.Module
    config: ModelConfig
    spec: FeatureSpec
    folder: Path  # the verified local folder (a download for MLflow URIs)
    digest: str  # sha256 of weights.pt
    version: str = ""  # see resolve()
    run_id: str = ""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_weights(model: nn.Module | dict[str, torch.Tensor], folder: str | Path) -> Path:
    """weights.pt: the plain CPU state dict, written atomically; returns the folder."""
    import torch
    from torch import nn

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = model.state_dict() if isinstance(model, nn.Module) else model
    plain = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    tmp = folder / f".{WEIGHTS}.tmp-{os.getpid()}"
    torch.save(plain, tmp)
    os.replace(tmp, folder / WEIGHTS)
    return folder


def save_model(model: nn.Module | dict[str, torch.Tensor], cfg: ModelConfig, spec: FeatureSpec,
               folder: str | Path) -> Path:
    """Write the model folder (see module docstring); returns it."""
    folder = save_weights(model, folder)
    (folder / CONFIG).write_text(json.dumps(asdict(cfg), indent=2))
    (folder / SPEC).write_text(json.dumps(spec.to_dict(), indent=2))
    write_digests(folder)
    return folder


def model_folder(path: str | Path) -> Path:
    """``path`` itself, its ``model/`` when ``path`` is a run folder, or its
    ``artifacts/model/`` when it is an MLflow pyfunc model (``log_pyfunc_model``)."""
    path = Path(path)
    if (path / WEIGHTS).is_file():
        return path
    for inner in (path / MODEL_DIR, path / PYFUNC_ARTIFACTS / MODEL_DIR):
        if (inner / WEIGHTS).is_file():
            return inner
    return path


def write_digests(folder: str | Path, files: tuple[str, ...] = FILES) -> None:
    folder = Path(folder)
    digests = {name: _sha256(folder / name) for name in files}
    (folder / DIGESTS).write_text(json.dumps(digests, indent=2, sort_keys=True) + "\n")


def load_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """The folder's weights.pt as a plain tensor state dict, read weights-only."""
    import torch

    path = Path(folder) / WEIGHTS
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - an unpickling refusal, a truncated file...
        raise ModelStoreError(f"{path}: not a plain tensor state dict, refused by the "
                              f"weights-only loader ({type(exc).__name__}: {str(exc)[:300]})") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelStoreError(f"{path}: not a state dict of tensors")
    return state


def verify(folder: str | Path, files: tuple[str, ...] = FILES) -> str:
    """Check every file against digests.json; returns the weights' sha256."""
    folder = Path(folder)
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        raise ModelStoreError(f"{folder}: not a model folder: missing {missing} (expected {list(files)})")
    actual = {name: _sha256(folder / name) for name in files}
    if not (folder / DIGESTS).is_file():
        log.warning("%s: no %s (saved before digests existed): loading without a digest check, "
                    "weights-only", folder, DIGESTS)
        return actual[WEIGHTS]
    try:
        expected = json.loads((folder / DIGESTS).read_text())
    except ValueError as exc:
        raise ModelStoreError(f"{folder / DIGESTS}: not valid JSON ({exc})") from exc
    for name in files:
        if expected.get(name) != actual[name]:
            raise ModelStoreError(
                f"{folder / name}: sha256 {actual[name][:16]}... does not match {DIGESTS} "
                f"({str(expected.get(name))[:16]}...): the file was replaced or altered after it was saved; "
                "refusing to load it")
    return actual[WEIGHTS]


def load_state(folder: str | Path) -> tuple[dict[str, torch.Tensor], ModelConfig, FeatureSpec, str]:
    """Verified (state dict, model config, feature spec, weights sha256) of a local folder."""
    from gem.config import from_dict

    folder = model_folder(folder)
    digest = verify(folder)
    state = load_weights(folder)
    cfg = from_dict(ModelConfig, json.loads((folder / CONFIG).read_text()))
    spec = FeatureSpec.from_dict(json.loads((folder / SPEC).read_text()))
    return state, cfg, spec, digest


def load_model(source: str | Path, tracking_uri: str | None = None) -> StoredModel:
    """The model in eval mode from a local run/model folder or an MLflow URI."""
    from gem.model import build_model

    folder, version, run_id = resolve(source, tracking_uri)
    state, cfg, spec, digest = load_state(folder)
    model = build_model(cfg, spec)
    model.load_state_dict(state)
    if not version:
        version = f"local:{folder.resolve()}@{digest[:12]}"
    model.stored_as = version  # named by the checks that pair it with a features window
    return StoredModel(model.eval(), cfg, spec, folder, digest, version, run_id)


def resolve(source: str | Path, tracking_uri: str | None = None) -> tuple[Path, str, str]:
    """(local model folder, version, run_id) of a folder or an MLflow model URI:

    - a folder: itself (or its model/); version "" (load_model makes it local:<folder>@<sha>);
    - ``runs:/<run_id>/<name>``: the run's logged model ``name``; version ``runs:/<run_id>``;
    - ``models:/<name>/<version>`` or ``models:/<name>@<alias>``: version
      ``models:/<name>/<version>`` (an alias resolved now).
    MLflow artifacts are downloaded, never unpickled."""
    text = str(source)
    if not text.startswith(MLFLOW_PREFIXES):
        path = Path(text)
        if not path.exists():
            raise FileNotFoundError(f"model {text!r}: no such folder, and not a runs:/ or models:/ URI")
        return model_folder(path), "", ""
    import mlflow
    from mlflow import MlflowClient

    from gem.tracking import ensure_reachable, redact

    if tracking_uri:
        ensure_reachable(tracking_uri)
        mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient()
    if text.startswith("models:/"):
        rest = text[len("models:/"):]
        if "@" in rest:
            name, alias = rest.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        else:
            name, _, number = rest.partition("/")
            mv = client.get_model_version(name, number)
        version = download = f"models:/{mv.name}/{mv.version}"
        run_id = mv.run_id or ""
    else:
        run_id, _, name = text[len("runs:/"):].partition("/")
        version, download = f"runs:/{run_id}", text
        of_run = mlflow.search_logged_models(filter_string=f"source_run_id = '{run_id}'", output_format="list",
                                             order_by=[{"field_name": "creation_time", "ascending": False}])
        logged = [m for m in of_run if m.name == (name or MODEL_DIR)]
        if not logged and (name or MODEL_DIR) == MODEL_DIR:  # runs:/<id>/model: the run's model, whatever its name
            logged = of_run
        if logged:
            download = f"models:/{logged[0].model_id}"
    target = Path(tempfile.mkdtemp(prefix="gem-model-"))
    try:
        folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=download, dst_path=str(target)))
    except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds
        raise ModelStoreError(f"{text}: cannot download the model's files ({redact(exc)})") from exc
    if not (model_folder(folder) / WEIGHTS).is_file():
        raise ModelStoreError(f"{text}: the MLflow model has no {WEIGHTS} (logged by another tool, e.g. "
                              "mlflow.pytorch's pickle, which gem never loads); log it with gem.model.store.log_model")
    return model_folder(folder), version, run_id


def log_model(folder: str | Path, *, name: str = MODEL_DIR, registered_name: str | None = None,
              files: tuple[str, ...] = FILES) -> str:
    """Log a saved model folder into the active MLflow run as a logged model (its files
    only: no pickle), optionally registering it; returns the model URI
    (``models:/<model_id>``), which ``runs:/<run_id>/<name>`` also resolves to."""
    import mlflow
    from mlflow import MlflowClient

    folder = model_folder(folder)
    verify(folder, files)
    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("log_model needs an active MLflow run")
    logged = mlflow.initialize_logged_model(name=name, source_run_id=run.info.run_id,
                                            tags={"gem.format": "state_dict+digests"})
    MlflowClient().log_model_artifacts(logged.model_id, str(folder))
    mlflow.finalize_logged_model(logged.model_id, "READY")
    uri = f"models:/{logged.model_id}"
    if registered_name:
        mlflow.register_model(uri, registered_name)
    return uri


def log_pyfunc_model(folder: str | Path, *, name: str, code: str | Path, signature, input_example=None,
                     pip_requirements: list[str] | None = None, model_config: dict | None = None,
                     params: dict | None = None, tags: dict | None = None, files: tuple[str, ...] = FILES) -> str:
    """Log a saved model folder into the active MLflow run as an MLflow pyfunc model
    "from code": ``code`` (a file that calls ``mlflow.models.set_model``) is stored with
    it and run on ``mlflow.pyfunc.load_model``; the folder goes in as the artifact
    ``model``, which that code loads through this module (digests checked, weights-only).
    Nothing is pickled. MLflow scores ``input_example`` once to check it. Returns the
    model URI (``models:/<model_id>``)."""
    import shutil

    import mlflow

    folder = model_folder(folder)
    verify(folder, files)
    if mlflow.active_run() is None:
        raise RuntimeError("log_pyfunc_model needs an active MLflow run")
    with tempfile.TemporaryDirectory(prefix="gem-pyfunc-") as tmp:
        staged = Path(tmp) / MODEL_DIR  # MLflow keeps the folder's own name under artifacts/
        shutil.copytree(folder, staged)
        info = mlflow.pyfunc.log_model(
            name=name, python_model=str(code), artifacts={MODEL_DIR: str(staged)}, signature=signature,
            input_example=input_example, pip_requirements=pip_requirements, model_config=model_config,
            params={k: str(v)[:500] for k, v in (params or {}).items()} or None,
            tags={"gem.format": "pyfunc+state_dict+digests", **(tags or {})})
    return f"models:/{info.model_id}"

