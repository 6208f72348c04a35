"""Load a frozen GEM teacher from a local run/model folder or an MLflow model URI, with
the version string every knowledge row is tagged with.

- a local folder: a training run directory (``gem train --out``) or its ``model/``
  folder (weights.pt, model_config.json, feature_spec.json, digests.json); version
  ``local:<folder>@<sha256 of weights.pt, 12 hex>``;
- ``runs:/<run_id>/model``: version ``runs:/<run_id>``;
- ``models:/<name>/<version>`` or ``models:/<name>@<alias>``: version
  ``models:/<name>/<version>`` (an alias is resolved to its version at load time).
"""

from __future__ import annotations

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
    digest: str = ""  # sha256 of its weights: the teacher itself, whatever registry or folder holds it

    @property
    def spec(self) -> FeatureSpec:
        return self.model.spec


def load_teacher(uri: str | Path, tracking_uri: str | None = None) -> Teacher:
    """The teacher in eval mode with its version (see module docstring), read through
    gem.model.store: files checked against their digests, weights-only, never unpickled."""
    from gem.model.store import load_model

    stored = load_model(uri, tracking_uri)
    return Teacher(stored.model, str(uri), stored.version, stored.run_id, stored.digest)


def teacher_outputs(model: nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass: own-surface joint logits (B, T), every surface's (B, S, T), user and item
    embeddings (B, E), through the model's ``outputs`` (gem.model.heads.RankingModel)."""
    out, enc = model.outputs(batch, all_surfaces=True)
    return out.logits, out.all_logits, enc.user, enc.item
