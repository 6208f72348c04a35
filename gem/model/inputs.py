"""InputArch: a Batch -> the tokens every model consumes.

Shapes: B batch, F sparse keys, n0 = F + 2 non-sequence tokens (sparse, dense
projection, surface), N history tokens, D dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gem.data.batch import Batch, FeatureSpec, dense_groups
from gem.model.embeddings import SparseArch
from gem.model.jagged import lengths_of, segment_ids

ITEM_KEY_HINTS = ("item", "ad_", "advertiser", "category", "format", "objective", "creative", "campaign")


def item_keys(spec: FeatureSpec, configured: list[str] | None) -> list[str]:
    """Sparse keys on the item side: the configured ones, else guessed from key names,
    else none (the item tower then sees every sparse key)."""
    if configured is not None:
        unknown = sorted(set(configured) - set(spec.sparse))
        if unknown:
            raise ValueError(f"item_features {unknown} are not sparse keys of the spec {list(spec.sparse)}")
        return list(configured)
    return [k for k in spec.sparse if any(h in k.lower() for h in ITEM_KEY_HINTS)]


@dataclass
class Inputs:
    tokens_BnD: torch.Tensor
    seq_ND: torch.Tensor
    offsets: torch.Tensor
    pooled_seq_BD: torch.Tensor
    user_in: torch.Tensor
    item_in: torch.Tensor
    first_order: torch.Tensor | None = None  # (B,) per-id weights' sum, added to the click logit


class InputArch(nn.Module):
    def __init__(self, spec: FeatureSpec, dim: int, age_buckets: int, item_features: list[str] | None,
                 first_order: bool = False, counter_norm: bool = False, counter_wide: bool = False) -> None:
        super().__init__()
        self.sparse = SparseArch(spec, dim, age_buckets, first_order)
        groups = dense_groups(list(spec.dense))
        self.dense_proj = nn.Linear(max(len(groups[0]), 1), dim)
        self.num_dense = len(groups[0])
        for i, group in enumerate(groups):
            self.register_buffer(f"dense_group_{i}", torch.tensor(group, dtype=torch.long), persistent=False)
        # one token per key kind of the point-in-time counters: rates and counts relate to
        # the label through a curve (log-odds, saturation), so a small MLP, not a projection
        self.counter_proj = nn.ModuleList(
            nn.Sequential(nn.BatchNorm1d(len(g)) if counter_norm else nn.Identity(), nn.Linear(len(g), dim),
                          nn.SiLU(), nn.Linear(dim, dim)) for g in groups[1:])
        # the wide part: a linear term of the (normalised) counters in the click logit
        counted = sum(len(g) for g in groups[1:])
        self.counter_wide = nn.Linear(counted, 1) if counter_wide and counted else None
        self.surface_embedding = nn.Embedding(len(spec.surfaces), dim)
        keys = list(spec.sparse)
        items = item_keys(spec, item_features)
        self.register_buffer("item_idx", torch.tensor([keys.index(k) for k in items] or list(range(len(keys)))),
                             persistent=False)
        self.register_buffer("user_idx", torch.tensor([i for i, k in enumerate(keys) if k not in items]),
                             persistent=False)
        self.num_tokens = len(keys) + 2 + len(self.counter_proj)
        self.user_in_dim = (len(self.user_idx) + 1) * dim
        self.item_in_dim = len(self.item_idx) * dim

    def forward(self, batch: Batch) -> Inputs:
        x_BFD, seq_ND = self.sparse(batch)
        batch_size, _, dim = x_BFD.shape
        dense = batch.dense[:, self.dense_group_0] if self.num_dense else batch.dense.new_zeros(batch_size, 1)
        kinds = [batch.dense[:, getattr(self, f"dense_group_{i + 1}")] for i in range(len(self.counter_proj))]
        counters = [proj(x)[:, None, :] for proj, x in zip(self.counter_proj, kinds)]
        tokens = torch.cat(
            [x_BFD, self.dense_proj(dense)[:, None, :], self.surface_embedding(batch.surface)[:, None, :], *counters],
            dim=1)
        offsets = batch.sequence_offsets()
        seg = segment_ids(offsets, seq_ND.shape[0])
        pooled = seq_ND.new_zeros(batch_size, dim).index_add(0, seg, seq_ND)
        pooled = pooled / lengths_of(offsets).clamp(min=1)[:, None].to(pooled.dtype)
        user_in = torch.cat([x_BFD[:, self.user_idx].flatten(1), pooled], dim=1)
        item_in = x_BFD[:, self.item_idx].flatten(1)
        bias = self.sparse.first_order(batch)
        if self.counter_wide is not None:
            normed = torch.cat([proj[0](x) for proj, x in zip(self.counter_proj, kinds)], dim=1)
            wide = self.counter_wide(normed)[:, 0]
            bias = wide if bias is None else bias + wide
        return Inputs(tokens, seq_ND, offsets, pooled, user_in, item_in, bias)
