"""GEM model package (single-device; never imports Lightning).

    model = build_model(load_config(ModelConfig, section="model", preset="tiny"), spec)
    out = model(batch)            # ModelOutput: logits (B, 2) for the own surface
    emb = model.encode(batch)     # Encoded: user, item, joint embeddings
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gem.model.config import ModelConfig

if TYPE_CHECKING:
    from torch import nn

    from gem.data.batch import FeatureSpec

__all__ = [
    "GEM", "DLRMBaseline", "Encoded", "ModelConfig", "ModelOutput", "batch_forward_flops",
    "build_model", "count_parameters", "forward_flops_per_example", "joint_log_probs",
    "multitask_loss", "load_model_config",
]

_LAZY = {
    "GEM": "gem.model.gem", "DLRMBaseline": "gem.model.dlrm",
    "batch_forward_flops": "gem.model.flops", "count_parameters": "gem.model.flops",
    "forward_flops_per_example": "gem.model.flops",
    "Encoded": "gem.model.heads", "ModelOutput": "gem.model.heads", "joint_log_probs": "gem.model.heads",
    "multitask_loss": "gem.model.heads",
}


def __getattr__(name: str):
    # lazy: reading a model config (a run's fingerprint, a CLI's help) must not load torchrec
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gem.model' has no attribute {name!r}")


def build_model(cfg: ModelConfig, spec: FeatureSpec) -> nn.Module:
    """GEM or the DLRM baseline, by ``cfg.arch``."""
    from gem.model.dlrm import DLRMBaseline
    from gem.model.gem import GEM

    cfg.validate()
    return GEM(cfg, spec) if cfg.arch == "gem" else DLRMBaseline(cfg, spec)


def load_model_config(preset: str = "tiny", overrides: list[str] | None = None) -> ModelConfig:
    from gem.config import load_config

    return load_config(ModelConfig, section="model", preset=preset, overrides=overrides).validate()
