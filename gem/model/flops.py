"""Model size and cost: parameter counts and forward FLOPs per example.

FLOPs are counted with ``torch.utils.flop_counter`` on a batch, real tokens only:
the jagged attention op counts QK^T and PV over each sequence's own length (its
padded CPU buckets are not counted; see ``jagged_attention_flops``), or, without the
kernels package, the attention runs as the per-sequence reference loop. Embedding
lookups count as 0 FLOPs (memory-bound gathers), as do the pooling's per-sequence
softmax and weighted sums (``attention_pool``: only its scores, M queries x D per token,
are a matmul). Counted
although the loss does not use it: the surface towers of the S - 1 other surfaces
(``SurfaceTowers`` runs all of them; 1.5% of the small preset's FLOPs, 6% of tiny's).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry, register_flop_formula

from gem.data.batch import Batch, synthetic_batch
from gem.model.attention import JaggedMultiHeadAttention, _kernels_attention
from gem.model.embeddings import SparseArch


def count_parameters(model: nn.Module) -> dict[str, int]:
    """{"total", "embedding", "dense"}: embedding = torchrec tables (EBC + EC)."""
    embedding = 0
    for module in model.modules():
        if isinstance(module, SparseArch):
            embedding += sum(p.numel() for table in module.tables() for p in table.parameters())
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


def jagged_attention_flops(q, k, v, offsets, max_seq_len, form, causal, *args, **kwargs) -> int:
    """FLOPs of the real work of ``gem_kernels::jagged_attention_fwd``: S = QK^T and
    O = PV over each sequence's kept tokens (causal: the L(L+1)/2 allowed pairs)."""
    lengths = (offsets[1:] - offsets[:-1]).clamp(max=max_seq_len)
    pairs = lengths * (lengths + 1) // 2 if causal else lengths * lengths
    return 2 * int(pairs.sum()) * q.shape[1] * (q.shape[2] + v.shape[2])


def jagged_attention_backward_flops(grad_out, q, k, v, offsets, out, lse, max_seq_len, form, causal,
                                    *args, **kwargs) -> int:
    """dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: twice the forward (recomputing
    S is not model work)."""
    return 2 * jagged_attention_flops(q, k, v, offsets, max_seq_len, form, causal)


def _counting_backend() -> str:
    """The kernels op with its FLOP formulas registered, else the per-sequence loop."""
    if _kernels_attention() is None:
        return "loop"
    ops = torch.ops.gem_kernels
    if ops.jagged_attention_fwd not in flop_registry:
        register_flop_formula(ops.jagged_attention_fwd, get_raw=True)(jagged_attention_flops)
        register_flop_formula(ops.jagged_attention_bwd, get_raw=True)(jagged_attention_backward_flops)
    return "kernels"


def batch_forward_flops(model: nn.Module, batch: Batch) -> int:
    """Forward FLOPs of one batch (exact jagged attention, no padding counted)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _attention_backend(model, _counting_backend()), \
                FlopCounterMode(display=False) as counter:
            model(batch)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())


def count_forward_flops(forward) -> int:
    """FLOPs of ``forward()`` (any model: the jagged attention op's real work counted, as
    for GEM), without gradients."""
    _counting_backend()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        forward()
    return int(counter.get_total_flops())


def forward_flops_per_example(model: nn.Module, batch_size: int = 64, mean_len: float | None = None,
                              seed: int = 0) -> float:
    """Forward FLOPs per example on a synthetic batch with histories of ``mean_len``
    (default: half the spec's max_seq_len)."""
    spec = model.spec
    mean = float(spec.max_seq_len) / 2 if mean_len is None else mean_len
    batch = synthetic_batch(spec, batch_size, seed=seed, mean_len=mean)
    return batch_forward_flops(model, batch) / batch_size
