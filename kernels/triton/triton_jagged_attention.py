"""Host side of the Triton jagged attention kernels: checks, buffers, launch grids.

On CUDA the kernels compile for the GPU; on CPU tensors they need TRITON_INTERPRET=1
(set before triton is imported) and then use tiny tiles and static loop bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kernels.attention_spec import Spec, bias_radius
from kernels.common import TRITON_DTYPES, triton_interpreting
from kernels.triton.triton_attention_helpers import ACTIVATION_CODES
from kernels.triton.triton_jagged_attention_bwd import (
    jagged_attention_dkdv_kernel,
    jagged_attention_dq_kernel,
)
from kernels.triton.triton_jagged_attention_fwd import jagged_attention_fwd_kernel

Tensor = torch.Tensor


@dataclass(frozen=True)
class _Launch:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    static_loops: bool
    static_len: int


def _launch(q: Tensor, max_seq_len: int) -> _Launch:
    if triton_interpreting() or q.device.type != "cuda":
        # The interpreter is slow per program, and tl.dot needs tiles of at least 16.
        return _Launch(16, 16, 1, 1, True, triton.cdiv(max_seq_len, 16) * 16)
    return _Launch(64, 64, 4, 2, False, 0)


# CUDA caps grid axes 1 and 2 at 65,535 programs; axis 0 at 2**31 - 1.
MAX_GRID_AXIS_0 = 2**31 - 1
MAX_GRID_AXIS_12 = 65_535


def launch_grid(num_seqs: int, num_heads: int, max_seq_len: int, block: int) -> tuple[int, int]:
    """(B * H, tiles per sequence): sequence-heads on axis 0, which allows 2**31 - 1
    programs, and the tiles of one sequence on axis 1 (65,535 tiles of `block` tokens)."""
    grid = (num_seqs * num_heads, triton.cdiv(max_seq_len, block))
    if grid[0] > MAX_GRID_AXIS_0 or grid[1] > MAX_GRID_AXIS_12:
        raise ValueError(f"launch grid {grid} exceeds CUDA's limits ({MAX_GRID_AXIS_0}, "
                         f"{MAX_GRID_AXIS_12}): B * H = {num_seqs} * {num_heads}, "
                         f"max_seq_len {max_seq_len} in tiles of {block}")
    return grid


def _check_spec(spec: Spec) -> None:
    if not spec.plain_mask or spec.dropout_p:
        raise NotImplementedError("the triton backend does not implement max_attn_len, "
                                  "contextual_len or dropout_p")


def _common_args(q, k, v, offsets, attn_bias, num_targets, spec: Spec,
                 launch: _Launch) -> tuple[tuple, tuple, tuple, dict]:
    """(tensor args, stride args, runtime scalars, constexprs and launch options)."""
    if q.dtype not in TRITON_DTYPES:
        raise ValueError(f"the triton backend supports {TRITON_DTYPES}; got {q.dtype}")
    _check_spec(spec)
    max_seq_len, form, causal, activation = spec.max_seq_len, spec.form, spec.causal, spec.activation
    dummy = offsets  # stands in for absent optional tensors; never read
    dim, value_dim = q.shape[2], v.shape[2]
    tensors = (offsets, dummy if num_targets is None else num_targets,
               dummy if attn_bias is None else attn_bias)
    scalars = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    runtime = (q.shape[1], max_seq_len, spec.score_scale(dim),
               0 if attn_bias is None else bias_radius(attn_bias))
    meta = dict(
        DIM=dim, VALUE_DIM=value_dim,
        BLOCK_D=max(16, triton.next_power_of_2(dim)),
        BLOCK_DV=max(16, triton.next_power_of_2(value_dim)),
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n,
        IS_SOFTMAX=form == "softmax", CAUSAL=causal, HAS_BIAS=attn_bias is not None,
        HAS_TARGETS=num_targets is not None, ACTIVATION=ACTIVATION_CODES.get(activation, 0),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        DOT_UPCAST=launch.static_loops and q.dtype != torch.float32,
        STATIC_LOOPS=launch.static_loops, STATIC_LEN=launch.static_len,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )
    return tensors, scalars, runtime, meta


def triton_jagged_attention_fwd(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor,
                                attn_bias: Tensor | None, num_targets: Tensor | None,
                                spec: Spec) -> tuple[Tensor, Tensor]:
    """(out (T, H, Dv), lse (T, H) float32 for softmax, else empty)."""
    form = spec.form
    launch = _launch(q, spec.max_seq_len)
    tensors, strides, runtime, meta = _common_args(
        q, k, v, offsets, attn_bias, num_targets, spec, launch)
    num_tokens, num_heads, _ = q.shape
    out = q.new_zeros(num_tokens, num_heads, v.shape[2])
    lse = q.new_zeros((num_tokens, num_heads) if form == "softmax" else (0,), dtype=torch.float32)
    num_seqs = offsets.shape[0] - 1
    if num_tokens == 0 or num_seqs == 0:
        return out, lse
    grid = launch_grid(num_seqs, num_heads, spec.max_seq_len, launch.block_m)
    jagged_attention_fwd_kernel[grid](
        q, k, v, out, lse if lse.numel() else out, *tensors,
        *strides, out.stride(0), out.stride(1), *runtime, **meta)
    return out, lse


def triton_jagged_attention_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor,
                                offsets: Tensor, out: Tensor, lse: Tensor,
                                attn_bias: Tensor | None, num_targets: Tensor | None,
                                spec: Spec) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(dq, dk, dv, d attn_bias or None)."""
    form = spec.form
    launch = _launch(q, spec.max_seq_len)
    tensors, strides, runtime, meta = _common_args(
        q, k, v, offsets, attn_bias, num_targets, spec, launch)
    grad_out = grad_out.contiguous()
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dbias = None if attn_bias is None else torch.zeros_like(attn_bias, dtype=torch.float32)
    num_tokens, num_heads, _ = q.shape
    num_seqs = offsets.shape[0] - 1
    if num_tokens == 0 or num_seqs == 0:
        return dq, dk, dv, None if dbias is None else dbias.to(attn_bias.dtype)
    if form == "softmax":
        delta = (grad_out.float() * out.float()).sum(-1)  # (T, H)
    else:
        lse = delta = q.new_zeros(1, dtype=torch.float32)  # unread placeholders
    go_strides = (grad_out.stride(0), grad_out.stride(1))
    grid_kv = launch_grid(num_seqs, num_heads, spec.max_seq_len, launch.block_n)
    jagged_attention_dkdv_kernel[grid_kv](
        q, k, v, grad_out, lse, delta, dk, dv, dq if dbias is None else dbias, *tensors,
        *strides, *go_strides, *runtime, **meta)
    grid_q = launch_grid(num_seqs, num_heads, spec.max_seq_len, launch.block_m)
    jagged_attention_dq_kernel[grid_q](
        q, k, v, grad_out, lse, delta, dq, *tensors, *strides, *go_strides, *runtime, **meta)
    return dq, dk, dv, None if dbias is None else dbias.to(attn_bias.dtype)
