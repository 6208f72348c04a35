"""Multi-head jagged self-attention for the model: one call into ``kernels.jagged_attention``.

Shapes: q, k, v (N, H, Dh) with N = total tokens; offsets int64 (B+1,).

Forms (the kernels package's conventions, kernels/attention_spec.py):
- ``softmax``: softmax(q k^T / sqrt(Dh)) v within each sequence.
- ``gdpa``: SiLU pointwise attention, silu(q k^T / sqrt(Dh)) v / L with L the
  sequence's length.

Backends are the kernels package's (``pytorch``, ``bucketed``, ``triton``) or ``auto``
(``$GEM_ATTENTION_BACKEND``, else Triton on CUDA and bucketed on CPU). The names older
configs used still work: ``kernels`` = auto, ``loop`` = pytorch (the per-sequence
reference), ``padded`` = bucketed (the padded dense baseline now lives with the other
benchmark baselines, kernels/benchmarks/attention_baselines.py).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import Backend, jagged_attention

BACKENDS = ("auto",) + tuple(b.value for b in Backend)
LEGACY_BACKENDS = {"kernels": "auto", "loop": "pytorch", "padded": "bucketed"}


def kernels_backend(name: str) -> str | None:
    """The kernels backend for a model backend name; None lets kernels choose (auto)."""
    resolved = LEGACY_BACKENDS.get(name, name)
    if resolved not in BACKENDS:
        raise ValueError(f"attention backend {name!r} must be one of {BACKENDS} "
                         f"(or a legacy name: {sorted(LEGACY_BACKENDS)})")
    return None if resolved == "auto" else resolved


def _kernels_attention():
    """The kernels op (kept for gem/model/flops.py, which counts its FLOPs)."""
    return jagged_attention


def jagged_self_attention(q, k, v, offsets, *, max_seq_len: int, form: str = "softmax",
                          causal: bool = False, backend: str = "auto") -> torch.Tensor:
    """(N, H, Dh) x3 + offsets (B+1,) -> (N, H, Dh); see the module docstring."""
    return jagged_attention(q, k, v, offsets, max_seq_len=max_seq_len, form=form,
                            causal=causal, backend=kernels_backend(backend))


class JaggedMultiHeadAttention(nn.Module):
    """Pre-projected multi-head self-attention over jagged tokens: (N, D) -> (N, D)."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, *, form: str, causal: bool,
                 backend: str) -> None:
        super().__init__()
        kernels_backend(backend)  # fail at construction on an unknown name
        self.num_heads, self.head_dim = num_heads, head_dim
        self.form, self.causal, self.backend = form, causal, backend
        # No bias: a key bias gets a zero (noise-only) gradient under softmax, which Adam amplifies.
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim, bias=False)
        self.out = nn.Linear(num_heads * head_dim, dim)

    def forward(self, x_ND: torch.Tensor, offsets: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        # q, k, v by three matmuls on the one weight's row blocks: each comes out contiguous,
        # where one matmul's (N, 3, H, Dh) output needed three copies forward and a stacked
        # gradient backward (2.5% of a demo train step, alternating A/B)
        q, k, v = (nn.functional.linear(x_ND, w).view(-1, self.num_heads, self.head_dim)
                   for w in self.qkv.weight.split(self.num_heads * self.head_dim))
        attn = jagged_self_attention(
            q, k, v, offsets, max_seq_len=max_seq_len,
            form=self.form, causal=self.causal, backend=self.backend,
        )
        return self.out(attn.reshape(x_ND.shape[0], -1))
