"""GEM model package (single-device; never imports Lightning).

    model = build_model(load_config(ModelConfig, section="model", preset="tiny"), spec)
    out = model(batch)            # ModelOutput: logits (B, 2) for the own surface
    emb = model.encode(batch)     # Encoded: user, item, joint embeddings
"""

from __future__ import annotations

from torch import nn

from gem.data.batch import FeatureSpec
from gem.model.config import ModelConfig
from gem.model.dlrm import DLRMBaseline
from gem.model.flops import batch_forward_flops, count_parameters, forward_flops_per_example
from gem.model.gem import GEM
from gem.model.heads import Encoded, ModelOutput, joint_log_probs, multitask_loss

__all__ = [
    "GEM", "DLRMBaseline", "Encoded", "ModelConfig", "ModelOutput", "batch_forward_flops",
    "build_model", "count_parameters", "forward_flops_per_example", "joint_log_probs",
    "multitask_loss", "load_model_config",
]


def build_model(cfg: ModelConfig, spec: FeatureSpec) -> nn.Module:
    """GEM or the DLRM baseline, by ``cfg.arch``."""
    cfg.validate()
    return GEM(cfg, spec) if cfg.arch == "gem" else DLRMBaseline(cfg, spec)


def load_model_config(preset: str = "tiny", overrides: list[str] | None = None) -> ModelConfig:
    from gem.config import load_config

    return load_config(ModelConfig, section="model", preset=preset, overrides=overrides).validate()
