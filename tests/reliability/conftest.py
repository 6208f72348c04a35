"""Small shared inputs for the reliability tests: one features build of the tiny
simulator dataset and an (untrained) teacher exported for it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_features(tiny_dataset, tmp_path_factory) -> Path:
    from gem.features.build import build_features
    from tests.features.conftest import tiny_cfg

    out = tmp_path_factory.mktemp("reliability") / "features"
    build_features(tiny_dataset, out, tiny_cfg(max_seq_len=8, num_buckets=1, workers=1))
    return out


@pytest.fixture(scope="session")
def tiny_teacher(tiny_features, tmp_path_factory) -> Path:
    """A run folder holding ``model/`` as ``gem train`` exports it."""
    import torch

    from gem.features.loader import load_feature_spec
    from gem.model import build_model, load_model_config
    from gem.training.trainer import export_model

    torch.manual_seed(0)
    spec = load_feature_spec(tiny_features)
    cfg = load_model_config("tiny", ["attention_backend=padded"])
    out = tmp_path_factory.mktemp("reliability") / "teacher"
    export_model(build_model(cfg, spec).state_dict(), cfg, spec, out)
    return out
