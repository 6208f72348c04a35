"""Load a frozen GEM teacher from a local run/model folder or an MLflow model URI, with
the version string every knowledge row is tagged with.

- a local folder: a training run directory (``gem train --out``) or its ``model/``
  folder (weights.pt, model_config.json, feature_spec.json); version
  ``local:<folder>@<sha256 of weights.pt, 12 hex>``;
- ``runs:/<run_id>/model``: version ``runs:/<run_id>``;
- ``models:/<name>/<version>`` or ``models:/<name>@<alias>``: version
  ``models:/<name>/<version>`` (an alias is resolved to its version at load time).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gem.data.batch import FeatureSpec


@dataclass
class Teacher:
    model: nn.Module
    uri: str
    version: str
    run_id: str = ""

    @property
    def spec(self) -> FeatureSpec:
        return self.model.spec


def _local(path: Path) -> Teacher:
    folder = path / "model" if (path / "model" / "weights.pt").is_file() else path
    if not (folder / "weights.pt").is_file():
        raise FileNotFoundError(f"{path}: neither a run directory with model/weights.pt nor a model folder")
    from gem.config import from_dict
    from gem.model import ModelConfig, build_model

    cfg = from_dict(ModelConfig, json.loads((folder / "model_config.json").read_text()))
    spec = FeatureSpec.from_dict(json.loads((folder / "feature_spec.json").read_text()))
    model = build_model(cfg, spec)
    model.load_state_dict(torch.load(folder / "weights.pt", map_location="cpu", weights_only=True))
    digest = hashlib.sha256((folder / "weights.pt").read_bytes()).hexdigest()[:12]
    return Teacher(model.eval(), str(path), f"local:{folder.resolve()}@{digest}")


def _mlflow(uri: str, tracking_uri: str | None) -> Teacher:
    import mlflow
    import mlflow.pytorch
    from mlflow import MlflowClient

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient()
    run_id = ""
    if uri.startswith("models:/"):
        rest = uri[len("models:/"):]
        if "@" in rest:
            name, alias = rest.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        else:
            name, _, number = rest.partition("/")
            mv = client.get_model_version(name, number)
        version, run_id = f"models:/{mv.name}/{mv.version}", mv.run_id or ""
        load_uri = f"models:/{mv.name}/{mv.version}"
    elif uri.startswith("runs:/"):
        run_id = uri[len("runs:/"):].split("/", 1)[0]
        version, load_uri = f"runs:/{run_id}", uri
    else:
        raise ValueError(f"teacher URI {uri!r}: expected a local folder, runs:/... or models:/...")
    model = mlflow.pytorch.load_model(load_uri, map_location="cpu")
    return Teacher(model.eval(), uri, version, run_id)


def load_teacher(uri: str | Path, tracking_uri: str | None = None) -> Teacher:
    """The teacher in eval mode with its version (see module docstring)."""
    text = str(uri)
    if text.startswith(("runs:/", "models:/")):
        return _mlflow(text, tracking_uri)
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(f"teacher {text!r}: no such folder, and not a runs:/ or models:/ URI")
    return _local(path)


def teacher_outputs(model: nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass: own-surface joint logits (B, T), every surface's (B, S, T), user and item
    embeddings (B, E), through the model's ``outputs`` (gem.model.heads.RankingModel)."""
    out, enc = model.outputs(batch, all_surfaces=True)
    return out.logits, out.all_logits, enc.user, enc.item
