"""Triton backward kernels of jagged attention.

dkdv kernel: one tile of BLOCK_N keys per program, looping over queries; it also adds
the bias-table gradient with atomics. dq kernel: one tile of BLOCK_M queries, looping
over keys. Both recompute the scores; softmax uses the forward's log-sum-exp `Lse` and
Delta = rowsum(dO * O). Loop bounds: see triton_jagged_attention_fwd.py.
"""

import triton
import triton.language as tl

from kernels.triton.triton_attention_helpers import (
    activation,
    activation_grad,
    allowed_tile,
    bias_grad_tile,
    bias_tile,
    matmul,
    sequence_bounds,
)


@triton.jit
def softmax_stats(Lse, Delta, start, offs_m, row_ok, num_heads, head,
                  IS_SOFTMAX: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per-query log-sum-exp and rowsum(dO * O); zeros (and no reads) for GDPA, whose
    Lse and Delta are 1-element placeholders."""
    if IS_SOFTMAX:
        lse = tl.load(Lse + (start + offs_m) * num_heads + head, mask=row_ok, other=0.0)
        delta = tl.load(Delta + (start + offs_m) * num_heads + head, mask=row_ok, other=0.0)
    else:
        lse = tl.zeros([BLOCK_M], dtype=tl.float32)
        delta = tl.zeros([BLOCK_M], dtype=tl.float32)
    return lse, delta


@triton.jit
def _score_grad(q, k, v, do, lse, delta, offs_m, offs_n, length, history, Bias, head, scale,
                bias_radius, inv_length, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                IS_SOFTMAX: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
                DOT_UPCAST: tl.constexpr):
    """(weights, dS, allowed) for one (BLOCK_M, BLOCK_N) tile; dS is d loss / d score."""
    s = matmul(q, tl.trans(k), DOT_PRECISION, DOT_UPCAST) * scale
    allowed = allowed_tile(offs_m, offs_n, length, history, CAUSAL)
    if HAS_BIAS:
        s += bias_tile(Bias, head, offs_m, offs_n, history, bias_radius, allowed)
    d_weights = matmul(do, tl.trans(v), DOT_PRECISION, DOT_UPCAST)
    if IS_SOFTMAX:
        weights = tl.where(allowed, tl.exp(s - lse[:, None]), 0.0)
        ds = weights * (d_weights - delta[:, None])
    else:
        weights = tl.where(allowed, activation(s, ACTIVATION), 0.0) * inv_length
        ds = tl.where(allowed, d_weights * activation_grad(s, ACTIVATION), 0.0) * inv_length
    return weights, ds, allowed


@triton.jit
def jagged_attention_dkdv_kernel(
    Q, K, V, DO, Lse, Delta, DK, DV, DBias, Offsets, NumTargets, Bias,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    num_heads, max_seq_len, scale, bias_radius,
    DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_SOFTMAX: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_TARGETS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, STATIC_LOOPS: tl.constexpr, STATIC_LEN: tl.constexpr,
):
    block_n = tl.program_id(1)
    seq = tl.program_id(0) // num_heads  # B * H on axis 0: CUDA caps axis 1 at 65,535
    head = tl.program_id(0) % num_heads
    start, length, history = sequence_bounds(Offsets, NumTargets, seq, max_seq_len, HAS_TARGETS)
    if block_n * BLOCK_N < length:
        offs_n = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        col_ok = offs_n < length
        k = tl.load(K + (start + offs_n)[:, None] * stride_kt + head * stride_kh + offs_d[None, :],
                    mask=col_ok[:, None] & (offs_d[None, :] < DIM), other=0.0)
        v = tl.load(V + (start + offs_n)[:, None] * stride_vt + head * stride_vh + offs_dv[None, :],
                    mask=col_ok[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
        inv_length = 1.0 / length.to(tl.float32)
        # Causal: queries before this key tile never see it.
        query_begin = (block_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
        for block_start in range(0 if STATIC_LOOPS else query_begin,
                                 STATIC_LEN if STATIC_LOOPS else length, BLOCK_M):
            offs_m = block_start + tl.arange(0, BLOCK_M)
            row_ok = offs_m < length
            q = tl.load(Q + (start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                        mask=row_ok[:, None] & (offs_d[None, :] < DIM), other=0.0)
            do = tl.load(DO + (start + offs_m)[:, None] * stride_dot + head * stride_doh + offs_dv[None, :],
                         mask=row_ok[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
            lse, delta = softmax_stats(Lse, Delta, start, offs_m, row_ok, num_heads, head,
                                       IS_SOFTMAX, BLOCK_M)
            weights, ds, allowed = _score_grad(
                q, k, v, do, lse, delta, offs_m, offs_n, length, history, Bias, head, scale,
                bias_radius, inv_length, CAUSAL, HAS_BIAS, IS_SOFTMAX, ACTIVATION, DOT_PRECISION,
                DOT_UPCAST)
            dv += matmul(tl.trans(weights.to(do.dtype)), do, DOT_PRECISION, DOT_UPCAST)
            dk += matmul(tl.trans(ds.to(q.dtype)), q, DOT_PRECISION, DOT_UPCAST)
            if HAS_BIAS:
                bias_grad_tile(DBias, head, offs_m, offs_n, history, bias_radius, allowed, ds)
        tl.store(DK + (start + offs_n)[:, None] * stride_kt + head * stride_kh + offs_d[None, :],
                 (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None] & (offs_d[None, :] < DIM))
        tl.store(DV + (start + offs_n)[:, None] * stride_vt + head * stride_vh + offs_dv[None, :],
                 dv.to(DV.dtype.element_ty), mask=col_ok[:, None] & (offs_dv[None, :] < VALUE_DIM))


@triton.jit
def jagged_attention_dq_kernel(
    Q, K, V, DO, Lse, Delta, DQ, Offsets, NumTargets, Bias,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
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
        do = tl.load(DO + (start + offs_m)[:, None] * stride_dot + head * stride_doh + offs_dv[None, :],
                     mask=row_ok[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
        lse, delta = softmax_stats(Lse, Delta, start, offs_m, row_ok, num_heads, head,
                                   IS_SOFTMAX, BLOCK_M)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        inv_length = 1.0 / length.to(tl.float32)
        key_end = tl.minimum(length, (block_m + 1) * BLOCK_M) if CAUSAL else length
        for block_start in range(0, STATIC_LEN if STATIC_LOOPS else key_end, BLOCK_N):
            offs_n = block_start + tl.arange(0, BLOCK_N)
            col_ok = offs_n < length
            k = tl.load(K + (start + offs_n)[:, None] * stride_kt + head * stride_kh + offs_d[None, :],
                        mask=col_ok[:, None] & (offs_d[None, :] < DIM), other=0.0)
            v = tl.load(V + (start + offs_n)[:, None] * stride_vt + head * stride_vh + offs_dv[None, :],
                        mask=col_ok[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
            _, ds, _ = _score_grad(
                q, k, v, do, lse, delta, offs_m, offs_n, length, history, Bias, head, scale,
                bias_radius, inv_length, CAUSAL, HAS_BIAS, IS_SOFTMAX, ACTIVATION, DOT_PRECISION,
                DOT_UPCAST)
            dq += matmul(ds.to(k.dtype), k, DOT_PRECISION, DOT_UPCAST)
        tl.store(DQ + (start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < DIM))
