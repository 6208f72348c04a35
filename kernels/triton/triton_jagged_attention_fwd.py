"""Triton forward kernel of jagged attention (flash-attention style, one tile of
BLOCK_M queries of one sequence and one head per program).

Loop bounds: on a GPU the key loop stops at the sequence's own length (that is where
the speed on jagged batches comes from). Under TRITON_INTERPRET=1 the interpreter can't
use a loaded value as a `range` bound, so STATIC_LOOPS makes every loop run to the
constexpr STATIC_LEN (max_seq_len rounded up) and relies on the masks alone.
"""

import triton
import triton.language as tl

from kernels.triton.triton_attention_helpers import (
    activation,
    allowed_tile,
    bias_tile,
    matmul,
    sequence_bounds,
)


@triton.jit
def jagged_attention_fwd_kernel(
    Q, K, V, Out, Lse, Offsets, NumTargets, Bias,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    num_heads, max_seq_len, scale, bias_radius,
    DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_SOFTMAX: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_TARGETS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, STATIC_LOOPS: tl.constexpr, STATIC_LEN: tl.constexpr,
):
    block_m = tl.program_id(1)
    seq = tl.program_id(0) // num_heads  # B * H on axis 0: CUDA caps axis 1 at 65,535
    head = tl.program_id(0) % num_heads
    start, length, history = sequence_bounds(Offsets, NumTargets, seq, max_seq_len, HAS_TARGETS)
    if block_m * BLOCK_M < length:
        offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        row_ok = offs_m < length
        q = tl.load(Q + (start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < DIM), other=0.0)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        inv_length = 1.0 / length.to(tl.float32)
        # Causal: keys past this tile's last query are never allowed.
        key_end = tl.minimum(length, (block_m + 1) * BLOCK_M) if CAUSAL else length
        for block_start in range(0, STATIC_LEN if STATIC_LOOPS else key_end, BLOCK_N):
            offs_n = block_start + tl.arange(0, BLOCK_N)
            col_ok = offs_n < length
            k = tl.load(K + (start + offs_n)[:, None] * stride_kt + head * stride_kh + offs_d[None, :],
                        mask=col_ok[:, None] & (offs_d[None, :] < DIM), other=0.0)
            v = tl.load(V + (start + offs_n)[:, None] * stride_vt + head * stride_vh + offs_dv[None, :],
                        mask=col_ok[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
            s = matmul(q, tl.trans(k), DOT_PRECISION, DOT_UPCAST) * scale
            allowed = allowed_tile(offs_m, offs_n, length, history, CAUSAL)
            if HAS_BIAS:
                s += bias_tile(Bias, head, offs_m, offs_n, history, bias_radius, allowed)
            if IS_SOFTMAX:
                s = tl.where(allowed, s, float("-inf"))
                new_max = tl.maximum(row_max, tl.max(s, 1))
                safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
                p = tl.exp(s - safe_max[:, None])
                rescale = tl.exp(row_max - safe_max)
                row_sum = row_sum * rescale + tl.sum(p, 1)
                acc = acc * rescale[:, None]
                row_max = new_max
            else:
                p = tl.where(allowed, activation(s, ACTIVATION), 0.0) * inv_length
            acc += matmul(p.to(v.dtype), v, DOT_PRECISION, DOT_UPCAST)
        if IS_SOFTMAX:
            safe_sum = tl.where(row_sum == 0.0, 1.0, row_sum)
            acc = acc / safe_sum[:, None]
            lse = tl.where(row_sum == 0.0, 0.0, row_max + tl.log(safe_sum))
            tl.store(Lse + (start + offs_m) * num_heads + head, lse, mask=row_ok)
        tl.store(Out + (start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_dv[None, :],
                 acc.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < VALUE_DIM))
