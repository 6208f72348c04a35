"""DLRM-style baseline: the same embeddings and heads as GEM, the history mean-pooled
into one token, and an MLP as the interaction: (B, (n0 + 1) * D) -> trunk -> towers."""

from __future__ import annotations

import torch
from torch import nn

from gem.data.batch import Batch, FeatureSpec
from gem.model.config import ModelConfig
from gem.model.heads import Encoded, ModelOutput, MultiTaskHeads, TwoTower
from gem.model.inputs import InputArch


class DLRMBaseline(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: FeatureSpec) -> None:
        super().__init__()
        self.cfg, self.spec = cfg.validate(), spec
        dim = cfg.embedding_dim
        self.inputs = InputArch(spec, dim, cfg.age_buckets, cfg.item_features)
        self.two_tower = TwoTower(self.inputs.user_in_dim, self.inputs.item_in_dim, cfg.encode_dim)
        self.heads = MultiTaskHeads(
            (self.inputs.num_tokens + 1) * dim, cfg.dlrm_over_hidden, cfg.tower_hidden,
            len(spec.surfaces), len(spec.tasks), cfg.dropout,
        )

    def _trunk(self, batch: Batch, all_surfaces: bool) -> tuple[ModelOutput, Encoded]:
        inp = self.inputs(batch)
        top = torch.cat([inp.tokens_BnD.flatten(1), inp.pooled_seq_BD], dim=1)
        user, item = self.two_tower(inp.user_in, inp.item_in)
        out, joint = self.heads(top, batch.surface, self.two_tower.score(user, item), all_surfaces)
        return out, Encoded(user=user, item=item, joint=joint)

    def forward(self, batch: Batch, all_surfaces: bool = False) -> ModelOutput:
        return self._trunk(batch, all_surfaces)[0]

    def encode(self, batch: Batch) -> Encoded:
        return self._trunk(batch, False)[1]
