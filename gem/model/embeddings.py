"""SparseArch: torchrec embedding tables for the non-sequence and sequence features.

Shapes (B = batch size, F = number of sparse keys, N = total history tokens, D = dim):

- non-sequence: ``EmbeddingBagCollection`` (sum pooling over the single id) ->
  (B, F, D), stacked in ``FeatureSpec.sparse`` order via ``KeyedTensor.to_dict()``
  (a sharded EBC may return its keys in another order).
- sequence: ``EmbeddingCollection`` (no pooling, jagged) -> one (N, D) tensor per
  key, summed over keys, plus a learned embedding of the log2-bucketed event age.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from gem.data.batch import Batch, FeatureSpec

SPARSE_TABLE_PREFIX = "t_"
SEQUENCE_TABLE_PREFIX = "s_"
FIRST_ORDER_TABLE_PREFIX = "w_"
# first-order tables are this wide, their columns summed: fbgemm's fused (sharded) tables
# want widths that are multiples of 4
FIRST_ORDER_DIM = 4


def sparse_table_configs(spec: FeatureSpec, dim: int) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"{SPARSE_TABLE_PREFIX}{key}", embedding_dim=dim, num_embeddings=max(int(card), 1),
            feature_names=[key], pooling=PoolingType.SUM,
        )
        for key, card in spec.sparse.items()
    ]


def first_order_table_configs(spec: FeatureSpec) -> list[EmbeddingBagConfig]:
    """One weight per id of every sparse key (the linear part of a factorization machine),
    starting at 0."""
    return [
        EmbeddingBagConfig(
            name=f"{FIRST_ORDER_TABLE_PREFIX}{key}", embedding_dim=FIRST_ORDER_DIM,
            num_embeddings=max(int(card), 1), feature_names=[key], pooling=PoolingType.SUM,
            init_fn=torch.nn.init.zeros_,
        )
        for key, card in spec.sparse.items()
    ]


def sequence_table_configs(spec: FeatureSpec, dim: int) -> list[EmbeddingConfig]:
    return [
        EmbeddingConfig(
            name=f"{SEQUENCE_TABLE_PREFIX}{key}", embedding_dim=dim,
            num_embeddings=max(int(card), 1), feature_names=[key],
        )
        for key, card in spec.sequence.items()
    ]


class SparseArch(nn.Module):
    """Embeds a Batch's sparse and sequence KJTs.

    ``forward(batch) -> (x_BFD, seq_ND)``: pooled non-sequence embeddings (B, F, D) and
    summed per-token sequence embeddings (N, D) aligned with ``batch.sequence_offsets()``.
    """

    def __init__(self, spec: FeatureSpec, dim: int, age_buckets: int = 32, first_order: bool = False) -> None:
        super().__init__()
        if not spec.sparse:
            raise ValueError(f"spec.sparse={spec.sparse} must name at least one sparse feature")
        self.sparse_keys = list(spec.sparse)
        self.sequence_keys = list(spec.sequence)
        self.dim = dim
        self.ebc = EmbeddingBagCollection(tables=sparse_table_configs(spec, dim), device=torch.device("cpu"))
        self.ec = (
            EmbeddingCollection(tables=sequence_table_configs(spec, dim), device=torch.device("cpu"))
            if self.sequence_keys else None
        )
        # first-order (per-id) weights added to the click logit: ``first_order(batch)``
        self.first_order_ebc = (
            EmbeddingBagCollection(tables=first_order_table_configs(spec), device=torch.device("cpu"))
            if first_order else None
        )
        self.age_buckets = age_buckets
        self.age_embedding = nn.Embedding(age_buckets, dim)
        nn.init.normal_(self.age_embedding.weight, std=0.02)
        # the sharded tables' own kernels, called directly where one rank holds them all
        # (gem/training/local_lookup.py); a plain attribute, not a submodule
        self.direct = None

    def tables(self) -> list[nn.Module]:
        """Every torchrec collection (sharded and optimized in backward as one)."""
        return [m for m in (self.ebc, self.ec, self.first_order_ebc) if m is not None]

    def first_order(self, batch: Batch) -> torch.Tensor | None:
        """(B,) the sum of every sparse id's first-order weight, or None when off."""
        if self.first_order_ebc is None:
            return None
        pooled = self.first_order_ebc(batch.sparse).to_dict()
        return torch.stack([pooled[k] for k in self.sparse_keys], dim=1).sum(dim=(1, 2))

    def _stacked(self, pooled) -> torch.Tensor:
        """(B, F, D) from the collection's KeyedTensor: a view of its values when they hold
        the keys in spec order (one split and one stack fewer each way a step)."""
        if list(pooled.keys()) == self.sparse_keys:
            values = pooled.values()
            return values.reshape(values.shape[0], len(self.sparse_keys), self.dim)
        by_key = pooled.to_dict()
        return torch.stack([by_key[k] for k in self.sparse_keys], dim=1)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        direct = self.direct
        x_BFD = direct.pooled(batch.sparse) if direct is not None else self._stacked(self.ebc(batch.sparse))
        age_N = batch.sequence_age
        bucket_N = torch.log2(age_N.clamp(min=1.0)).long().clamp(0, self.age_buckets - 1)
        seq_ND = self.age_embedding(bucket_N)
        if self.ec is None:
            return x_BFD, seq_ND
        if direct is not None:
            return x_BFD, seq_ND + direct.sequence_sum(batch.sequence, age_N.shape[0])
        jagged = self.ec(batch.sequence)
        for key in self.sequence_keys:
            seq_ND = seq_ND + jagged[key].values()
        return x_BFD, seq_ND
