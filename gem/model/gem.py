"""GEM: InterFormer-style sequence layers over a Wukong interaction stack, with
multi-surface, click-then-convert heads.

    x0 (B, n0, D), seq (N, D) --prepend CLS--> L x InterFormerLayer --> top
    top = concat(x (B, n, D), summary (B, s, D)) -> trunk -> surface towers
"""

from __future__ import annotations

import torch
from torch import nn

from gem.data.batch import Batch, FeatureSpec
from gem.model.config import ModelConfig
from gem.model.heads import MultiTaskHeads, RankingModel, TwoTower
from gem.model.inputs import InputArch
from gem.model.interformer import InterFormerLayer, apply_pyramid
from gem.model.jagged import prepend_tokens


class GEM(RankingModel):
    def __init__(self, cfg: ModelConfig, spec: FeatureSpec) -> None:
        super().__init__()
        self.cfg, self.spec = cfg.validate(), spec
        dim = cfg.embedding_dim
        self.inputs = InputArch(spec, dim, cfg.age_buckets, cfg.item_features, cfg.first_order, cfg.counter_norm,
                                cfg.counter_wide)
        self.cls_tokens = nn.Parameter(torch.randn(cfg.num_cls_tokens, dim) * 0.02) if cfg.num_cls_tokens else None
        num_out = cfg.fm_tokens + cfg.lcb_tokens
        self.layers = nn.ModuleList(
            InterFormerLayer(cfg, self.inputs.num_tokens if i == 0 else num_out, last=i == cfg.num_layers - 1)
            for i in range(cfg.num_layers)
        )
        summary_tokens = self.layers[-1].summary.num_tokens
        self.two_tower = TwoTower(self.inputs.user_in_dim, self.inputs.item_in_dim, cfg.encode_dim)
        self.heads = MultiTaskHeads(
            (num_out + summary_tokens) * dim, cfg.trunk_hidden, cfg.tower_hidden,
            len(spec.surfaces), len(spec.tasks), cfg.dropout,
        )
        self.max_seq_len = spec.max_seq_len + cfg.num_cls_tokens
        # the target-attention query reads the target item's own input token
        self.target_token = list(spec.sparse).index("item_id") if cfg.target_attention else None

    def trunk(self, batch: Batch) -> tuple[torch.Tensor, object]:
        inp = self.inputs(batch)
        x_BnD, seq_ND, offsets = inp.tokens_BnD, inp.seq_ND, inp.offsets
        if self.cls_tokens is not None:
            cls_BCD = self.cls_tokens.to(seq_ND.dtype).expand(x_BnD.shape[0], -1, -1)
            seq_ND, offsets = prepend_tokens(seq_ND, offsets, cls_BCD)
        summary_BsD = x_BnD[:, :0]
        target_BD = None if self.target_token is None else x_BnD[:, self.target_token]
        for i, layer in enumerate(self.layers):
            budget = self.cfg.pyramid[i] if self.cfg.pyramid else None
            seq_ND, offsets = apply_pyramid(seq_ND, offsets, self.cfg.num_cls_tokens, budget)
            x_BnD, seq_ND, summary_BsD = layer(x_BnD, seq_ND, offsets, self.max_seq_len, target_BD)
        return torch.cat([x_BnD.flatten(1), summary_BsD.flatten(1)], dim=1), inp
