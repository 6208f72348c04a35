"""Activation checkpointing and torch.compile applied to a built model (in place).

Compile targets the fixed-shape dense blocks (Wukong stacks, cross blocks, heads);
the jagged sequence blocks stay eager because their token count changes every batch.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from gem.model.heads import MultiTaskHeads
from gem.model.interformer import GatedCrossBlock, InterFormerLayer
from gem.model.wukong import WukongArch


def apply_activation_checkpointing(model: nn.Module) -> int:
    """Recompute each InterFormer layer in backward; returns how many were wrapped."""
    layers = getattr(model, "layers", None)
    if layers is None:
        return 0
    for i, layer in enumerate(layers):
        if isinstance(layer, InterFormerLayer):
            layers[i] = checkpoint_wrapper(layer)
    return len(layers)


def apply_compile(model: nn.Module) -> int:
    """torch.compile the dense blocks in place; returns how many were compiled."""
    count = 0
    for module in model.modules():
        if isinstance(module, (WukongArch, GatedCrossBlock, MultiTaskHeads)):
            module.compile()
            count += 1
    return count
