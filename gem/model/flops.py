"""Model size and cost: parameter counts and forward FLOPs per example.

FLOPs are counted with ``torch.utils.flop_counter`` on a synthetic batch, with the
attention switched to the per-sequence reference so padding is not counted.
Embedding lookups count as 0 FLOPs (they are memory-bound gathers).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gem.data.batch import Batch, synthetic_batch
from gem.model.attention import JaggedMultiHeadAttention
from gem.model.embeddings import SparseArch


def count_parameters(model: nn.Module) -> dict[str, int]:
    """{"total", "embedding", "dense"}: embedding = torchrec tables (EBC + EC)."""
    embedding = 0
    for module in model.modules():
        if isinstance(module, SparseArch):
            embedding += sum(p.numel() for p in module.ebc.parameters())
            embedding += sum(p.numel() for p in module.ec.parameters()) if module.ec is not None else 0
    total = sum(p.numel() for p in model.parameters())
    return {"total": total, "embedding": embedding, "dense": total - embedding}


@contextmanager
def _attention_backend(model: nn.Module, backend: str):
    blocks = [m for m in model.modules() if isinstance(m, JaggedMultiHeadAttention)]
    saved = [m.backend for m in blocks]
    for m in blocks:
        m.backend = backend
    try:
        yield
    finally:
        for m, b in zip(blocks, saved):
            m.backend = b


def batch_forward_flops(model: nn.Module, batch: Batch) -> int:
    """Forward FLOPs of one batch (exact jagged attention, no padding counted)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _attention_backend(model, "loop"), FlopCounterMode(display=False) as counter:
            model(batch)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())


def forward_flops_per_example(model: nn.Module, batch_size: int = 64, mean_len: float | None = None,
                              seed: int = 0) -> float:
    """Forward FLOPs per example on a synthetic batch with histories of ``mean_len``
    (default: half the spec's max_seq_len)."""
    spec = model.spec
    mean = float(spec.max_seq_len) / 2 if mean_len is None else mean_len
    batch = synthetic_batch(spec, batch_size, seed=seed, mean_len=mean)
    return batch_forward_flops(model, batch) / batch_size
