"""DLRM-style baseline: the same embeddings and heads as GEM, the history mean-pooled
into one token, and an MLP as the interaction: (B, (n0 + 1) * D) -> trunk -> towers."""

from __future__ import annotations

import torch

from gem.data.batch import Batch, FeatureSpec
from gem.model.config import ModelConfig
from gem.model.heads import MultiTaskHeads, RankingModel, TwoTower
from gem.model.inputs import InputArch


class DLRMBaseline(RankingModel):
    def __init__(self, cfg: ModelConfig, spec: FeatureSpec) -> None:
        super().__init__()
        self.cfg, self.spec = cfg.validate(), spec
        dim = cfg.embedding_dim
        self.inputs = InputArch(spec, dim, cfg.age_buckets, cfg.item_features, cfg.first_order, cfg.counter_norm,
                                cfg.counter_wide)
        self.two_tower = TwoTower(self.inputs.user_in_dim, self.inputs.item_in_dim, cfg.encode_dim)
        self.heads = MultiTaskHeads(
            (self.inputs.num_tokens + 1) * dim, cfg.dlrm_over_hidden, cfg.tower_hidden,
            len(spec.surfaces), len(spec.tasks), cfg.dropout,
        )

    def trunk(self, batch: Batch) -> tuple[torch.Tensor, object]:
        inp = self.inputs(batch)
        return torch.cat([inp.tokens_BnD.flatten(1), inp.pooled_seq_BD], dim=1), inp
