"""Weighted sums of jagged tokens: ``out[b, m] = sum over example b's tokens i of w[i, m] v[i]``.

    from kernels.jagged_pool import jagged_weighted_sum
    pooled_BMD = jagged_weighted_sum(weights_NM, values_ND, offsets)

The last step of the summary's attention pooling (gem/model/jagged.py ``attention_pool``):
M learned queries' softmax weights over each history, applied to its tokens.
``jagged_weighted_sum_reference`` is the expression in torch's ops, an (N, M, D) product
summed per example in fp32 at least; it is what the tests compare against.

Why a fast path: on the demo's late batches (N ~ 52k tokens, M = 2, D = 64) torch's ops
move the (N, M, D) product through memory three times forward and backward (the product,
its gradient gathered back from (B, M, D), the product and sum that split it), ~25 ms of a
train step for a few MFLOP. kernels/avx2/jagged_pool.c reads the tokens once each way and
keeps an example's sums in cache. Same math, float rounding aside (sums in token order).
Where it runs: x86-64 with AVX2 and FMA and a C compiler, fp32 on CPU, D a multiple of 8,
eager (not under torch.compile or a dispatch mode); elsewhere, or with
$GEM_NATIVE_POOL=0, the reference runs.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from kernels.avx2.loader import native_library as build_native
from kernels.avx2.loader import pointer as _ptr

NATIVE_SOURCE = Path(__file__).with_name("avx2") / "jagged_pool.c"
NATIVE_SWITCH = "GEM_NATIVE_POOL"


def jagged_weighted_sum_reference(weights_NM: torch.Tensor, values_ND: torch.Tensor, seg_N: torch.Tensor,
                                  batch: int) -> torch.Tensor:
    """(B, M, D), accumulated in fp32 at least (0 for an example without tokens)."""
    weighted_NMD = weights_NM[:, :, None] * values_ND[:, None, :]
    dtype = torch.promote_types(weighted_NMD.dtype, torch.float32)
    summed = torch.zeros(batch, weighted_NMD.shape[1] * weighted_NMD.shape[2], dtype=dtype, device=values_ND.device)
    summed.index_add_(0, seg_N, weighted_NMD.reshape(len(seg_N), -1).to(dtype))
    return summed.to(weighted_NMD.dtype).view(batch, *weighted_NMD.shape[1:])


def jagged_weighted_sum(weights_NM: torch.Tensor, values_ND: torch.Tensor, offsets: torch.Tensor,
                        seg_N: torch.Tensor) -> torch.Tensor:
    """The C kernel where it runs (see the module's notes), else the reference;
    ``seg_N``: each token's example, the ``offsets`` (B + 1) it was made from."""
    batch = offsets.numel() - 1
    if _native_applies(weights_NM, values_ND):
        return _WeightedSumNative.apply(weights_NM.contiguous(), values_ND.contiguous(),
                                        offsets.to(torch.int64).contiguous())
    return jagged_weighted_sum_reference(weights_NM, values_ND, seg_N, batch)


def _native_applies(weights: torch.Tensor, values: torch.Tensor) -> bool:
    return (values.shape[0] > 0 and values.shape[1] % 8 == 0
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (weights, values))
            and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None
            and native_library() is not None)


@functools.lru_cache(maxsize=1)
def native_library() -> ctypes.CDLL | None:
    lib, _ = build_native(NATIVE_SOURCE, NATIVE_SWITCH, "pooling", "torch's ops")
    if lib is not None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.jagged_weighted_sum_forward.argtypes = [ptr] * 4 + [i64, i64, i64, ctypes.c_int]
        lib.jagged_weighted_sum_backward.argtypes = [ptr] * 6 + [i64, i64, i64, ctypes.c_int]
        lib.jagged_weighted_sum_forward.restype = lib.jagged_weighted_sum_backward.restype = ctypes.c_int
    return lib


class _WeightedSumNative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights, values, offsets):
        batch, (_, m), d = offsets.numel() - 1, weights.shape, values.shape[1]
        out = values.new_empty(batch, m, d)
        status = native_library().jagged_weighted_sum_forward(
            _ptr(weights), _ptr(values), _ptr(offsets), _ptr(out), batch, m, d, torch.get_num_threads())
        if status:
            raise RuntimeError(f"jagged_weighted_sum_forward failed ({status})")
        ctx.save_for_backward(weights, values, offsets)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        weights, values, offsets = ctx.saved_tensors
        grad_out = grad_out.contiguous()  # held here: the C call reads its memory
        grad_w = torch.empty_like(weights) if ctx.needs_input_grad[0] else None
        grad_v = torch.empty_like(values) if ctx.needs_input_grad[1] else None
        status = native_library().jagged_weighted_sum_backward(
            _ptr(grad_out), _ptr(weights), _ptr(values), _ptr(offsets), _ptr(grad_w), _ptr(grad_v),
            offsets.numel() - 1, weights.shape[1], values.shape[1], torch.get_num_threads())
        if status:
            raise RuntimeError(f"jagged_weighted_sum_backward failed ({status})")
        return grad_w, grad_v, None
