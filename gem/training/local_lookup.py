"""Sharded tables looked up by their own fbgemm kernel when one rank holds them all.

A torchrec sharded collection routes every lookup through input and output
distribution: KJT splits and permutes, all-to-all awaitables, profiler markers. On a
world of one with a table-wise plan these move nothing, yet on a tiny-preset train step
(Ciao, 1 thread) the two collections' forward and backward took 3.4 ms through them
against 1.6 ms for the same kernels called directly, ~7% of the step.

Where each collection's plan is one fused kernel module (``BatchedFusedEmbeddingBag`` /
``BatchedFusedEmbedding``) over whole tables, ``install`` makes ``SparseArch`` call that
module (the batch's keys permuted to its features' order first, as torchrec's input
distribution does): the same weights, the same row-wise Adagrad applied in backward, the
same state dict and checkpoints. Anything else (several ranks, tables split in rows or
columns, several kernels) keeps torchrec's path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from torchrec.distributed.batched_embedding_kernel import BatchedFusedEmbedding, BatchedFusedEmbeddingBag
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem.model.embeddings import SparseArch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelLookup:
    """A collection's one fused kernel module; ``order``: the batch's key indices in the
    kernel's feature order (None: the same order)."""

    kernel: nn.Module
    order: list[int] | None

    def __call__(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.kernel(kjt if self.order is None else kjt.permute(self.order))


@dataclass(frozen=True)
class DirectLookup:
    """The one-kernel lookups of a SparseArch's pooled (``ebc``) and sequence (``ec``)
    collections. Shapes as in gem/model/embeddings.py."""

    pooled_lookup: KernelLookup
    sequence_lookup: KernelLookup | None
    num_keys: int
    num_sequence_keys: int
    dim: int
    restore: list[int] | None  # the kernel's output position of each batch key (any device)

    def pooled(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        """(B, F, D) in the batch's key order, from the kernel's (B, F * D)."""
        out = self.pooled_lookup(kjt)
        out = out.view(out.shape[0], self.num_keys, self.dim)
        return out if self.restore is None else out[:, self.restore]

    def sequence_sum(self, kjt: KeyedJaggedTensor, num_tokens: int) -> torch.Tensor:
        """(N, D): each token's embeddings summed over the keys. The kernel's (K * N, D)
        output is key by key, and every key has the same lengths (gem/data/batch.py)."""
        return self.sequence_lookup(kjt).view(self.num_sequence_keys, num_tokens, self.dim).sum(0)


def _single_kernel(collection: nn.Module, kind: type, keys: list[str]) -> KernelLookup | None:
    """The collection's one fused kernel module over whole tables whose features are
    ``keys`` (in any order)."""
    lookups = getattr(collection, "_lookups", None)
    if not lookups or len(lookups) != 1 or len(getattr(lookups[0], "_emb_modules", ())) != 1:
        return None
    kernel = lookups[0]._emb_modules[0]
    config = kernel.config
    if not isinstance(kernel, kind) or config.has_feature_processor or config.is_weighted:
        return None
    whole = all(t.local_rows == t.num_embeddings and t.local_cols == t.embedding_dim for t in config.embedding_tables)
    features = config.feature_names()
    if not whole or sorted(features) != sorted(keys) or len(set(keys)) != len(keys):
        return None
    return KernelLookup(kernel, None if features == keys else [keys.index(f) for f in features])


def direct_lookup(arch: SparseArch, sparse_keys: list[str], sequence_keys: list[str]) -> DirectLookup | None:
    """The direct lookups of a sharded SparseArch whose batches hold these keys, or None
    where its plan does not qualify."""
    pooled = _single_kernel(arch.ebc, BatchedFusedEmbeddingBag, sparse_keys)
    sequence = _single_kernel(arch.ec, BatchedFusedEmbedding, sequence_keys) if arch.ec is not None else None
    if pooled is None or (arch.ec is not None and sequence is None):
        return None
    tables = [t for k in (pooled, sequence) if k is not None for t in k.kernel.config.embedding_tables]
    if {t.embedding_dim for t in tables} != {arch.dim}:
        return None
    restore = None if pooled.order is None else [pooled.order.index(i) for i in range(len(pooled.order))]
    return DirectLookup(pooled, sequence, len(sparse_keys), len(sequence_keys), arch.dim, restore)


def install(model: nn.Module, world_size: int) -> int:
    """Direct lookups on every SparseArch of a sharded ``model`` that qualifies (see the
    module docstring); returns how many were installed."""
    if world_size != 1:
        return 0
    count = 0
    for arch in (m for m in model.modules() if isinstance(m, SparseArch)):
        arch.direct = direct_lookup(arch, arch.sparse_keys, arch.sequence_keys)
        if arch.direct is None:
            log.info("embedding lookups go through torchrec's distribution (the plan is not one "
                     "fused kernel over whole tables per collection)")
        count += arch.direct is not None
    return count
