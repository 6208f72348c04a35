"""The AVX2 kernel as an autograd Function: eager calls it takes whole skip the op layer.

`jagged_attention` routes a call here when the bucketed backend's own routing would give
the kernel every sequence of it (`takes_whole_call`: fused softmax and the kernel's share,
kernels/bucketed), in float32, no sequence truncated or over `NATIVE_MAX_LEN`. The result is the
one the `gem_kernels` op gives (the same kernel), without the op's per-call layers (the
custom-op dispatch, the chunk planning of the forward and again of the backward), ~1 ms
per forward+backward of a small batch: a tenth of a tiny-preset train step across its two
layers. Under torch.compile or a dispatch mode (FLOP counting) the op runs instead.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

import kernels.avx2.loader as native
import kernels.bucketed.bucketed_jagged_attention as bucketed
from kernels.attention_spec import Spec

Tensor = torch.Tensor


def takes_whole_call(q: Tensor, v: Tensor, offsets: Tensor, spec: Spec, attn_bias: Tensor | None,
                     with_targets: bool) -> bool:
    """Whether the bucketed backend would give the kernel every sequence of this call (its
    own routing: fused softmax, then the kernel's share), in eager float32."""
    if not (q.dtype == torch.float32 and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None
            and bucketed.uses_fused_softmax(spec, attn_bias, q, v)
            and bucketed.native_applies(spec, q, with_targets)):
        return False
    if offsets.shape[0] < 2:
        return False
    longest = int((offsets[1:] - offsets[:-1]).max())
    return longest <= min(spec.max_seq_len, bucketed.NATIVE_MAX_LEN or longest)


class NativeSoftmaxAttention(torch.autograd.Function):
    """softmax(q k^T * scale) v within each sequence; q, k, v (T, H, D) float32 contiguous."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, scale: float) -> Tensor:
        starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
        out = q.new_empty(v.shape)
        lse = q.new_empty(q.shape[:2])
        native.forward(q, k, v, out, lse, starts, lengths, scale)
        ctx.save_for_backward(q, k, v, out, lse, starts, lengths)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, starts, lengths = ctx.saved_tensors
        grads = [torch.empty_like(x) for x in (q, k, v)]
        native.backward(grad_out.contiguous(), q, k, v, out, lse, *grads, starts, lengths, ctx.scale)
        return (*grads, None, None)
