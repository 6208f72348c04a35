"""Triton device helpers shared by the jagged attention kernels.

They encode the conventions of kernels/attention_spec.py for one tile of
BLOCK_M queries by BLOCK_N keys of one sequence.
"""

import triton
import triton.language as tl

# The ACTIVATION constexpr of the kernels.
ACTIVATION_CODES = {"silu": 0, "relu": 1, "sigmoid": 2}


@triton.jit
def sequence_bounds(Offsets, NumTargets, seq, max_seq_len, HAS_TARGETS: tl.constexpr):
    """(start, length, history) of the kept part of sequence `seq`."""
    end = tl.load(Offsets + seq + 1)
    length = tl.minimum(end - tl.load(Offsets + seq), max_seq_len)
    if HAS_TARGETS:
        targets = tl.load(NumTargets + seq)
        history = length - tl.minimum(tl.maximum(targets, 0), length)
    else:
        history = length
    return end - length, length, history


@triton.jit
def allowed_tile(offs_m, offs_n, length, history, CAUSAL: tl.constexpr):
    """(BLOCK_M, BLOCK_N) bool: query offs_m may attend key offs_n."""
    key = offs_n[None, :]
    query = offs_m[:, None]
    allowed = ((key < history) | (key == query)) & (key < length) & (query < length)
    if CAUSAL:
        allowed = allowed & (key <= query)
    return allowed


@triton.jit
def bias_tile(Bias, head, offs_m, offs_n, history, radius, allowed):
    """(BLOCK_M, BLOCK_N) relative position bias (targets sit at position `history`)."""
    pos_m = tl.minimum(offs_m, history)
    pos_n = tl.minimum(offs_n, history)
    rel = pos_n[None, :] - pos_m[:, None]
    index = tl.minimum(tl.maximum(rel, -radius), radius) + radius
    return tl.load(Bias + head * (2 * radius + 1) + index, mask=allowed, other=0.0).to(tl.float32)


@triton.jit
def bias_grad_tile(DBias, head, offs_m, offs_n, history, radius, allowed, ds):
    pos_m = tl.minimum(offs_m, history)
    pos_n = tl.minimum(offs_n, history)
    rel = pos_n[None, :] - pos_m[:, None]
    index = tl.minimum(tl.maximum(rel, -radius), radius) + radius
    tl.atomic_add(DBias + head * (2 * radius + 1) + index, ds, mask=allowed)


@triton.jit
def activation(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == 0:
        y = x * tl.sigmoid(x)
    elif ACTIVATION == 1:
        y = tl.maximum(x, 0.0)
    else:
        y = tl.sigmoid(x)
    return y


@triton.jit
def activation_grad(x, ACTIVATION: tl.constexpr):
    """d activation(x) / dx."""
    if ACTIVATION == 0:
        sig = tl.sigmoid(x)
        g = sig * (1.0 + x * (1.0 - sig))
    elif ACTIVATION == 1:
        g = tl.where(x > 0.0, 1.0, 0.0)
    else:
        sig = tl.sigmoid(x)
        g = sig * (1.0 - sig)
    return g


@triton.jit
def matmul(a, b, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """tl.dot; DOT_UPCAST computes half inputs in float32, because Triton's interpreter
    gets tl.dot on bfloat16 operands wrong (numpy has no bfloat16)."""
    if DOT_UPCAST:
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        result = tl.dot(a, b, input_precision=DOT_PRECISION)
    return result
