"""torch.library registration of jagged attention: forward and backward custom ops.

`gem_kernels::jagged_attention_fwd` returns (out, lse); lse is the per-(token, head)
log-sum-exp that the Triton and the fused bucketed softmax backwards need, and an empty
tensor elsewhere. `gem_kernels::jagged_attention_bwd` returns (dq, dk, dv, dbias), dbias empty
when there is no bias. Both have fake (meta) impls, so torch.compile traces through them
without running a kernel; autograd links them through register_autograd. The backward op
has no autograd of its own: second derivatives are not supported.

The scalar options after `backend` (scale, max_attn_len, contextual_len, dropout_p,
dropout_seed) come last so that FLOP formulas written for the older signature still bind.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.attention_spec import Spec
from kernels.common import Backend

Tensor = torch.Tensor


def check_offsets(offsets: Tensor, num_tokens: int) -> None:
    """Value checks that read offsets; only on CPU, where they cost no device sync."""
    if offsets.device.type != "cpu" or offsets.numel() == 0:
        return
    if int(offsets[0]) != 0:
        raise ValueError(f"offsets[0] ({int(offsets[0])}) must be 0: every token belongs to a "
                         "sequence")
    if int(offsets[-1]) != num_tokens:
        raise ValueError(f"offsets[-1] ({int(offsets[-1])}) must equal the number of tokens "
                         f"q.shape[0] ({num_tokens})")
    if int(offsets[0]) < 0 or bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"offsets must be non-negative and non-decreasing; got {offsets.tolist()[:16]}")


def _lse_shape(q: Tensor, v: Tensor, spec: Spec, backend: str,
               attn_bias: Optional[Tensor]) -> tuple[int, ...]:
    """(T, H) where the backend's softmax backward needs the forward's log-sum-exp."""
    from kernels.bucketed.bucketed_jagged_attention import uses_fused_softmax

    if backend == Backend.TRITON.value and spec.form == "softmax":
        return (q.shape[0], q.shape[1])
    if backend == Backend.BUCKETED.value and uses_fused_softmax(spec, attn_bias, q, v):
        return (q.shape[0], q.shape[1])
    return (0,)


def _spec(max_seq_len, form, causal, activation, scale, max_attn_len, contextual_len,
          dropout_p, dropout_seed) -> Spec:
    return Spec(max_seq_len, form, causal, activation, scale, max_attn_len, contextual_len,
                dropout_p, dropout_seed)


@torch.library.custom_op("gem_kernels::jagged_attention_fwd", mutates_args=())
def jagged_attention_fwd(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_seq_len: int, form: str,
    causal: bool, attn_bias: Optional[Tensor], num_targets: Optional[Tensor],
    activation: str, backend: str, scale: float, max_attn_len: int, contextual_len: int,
    dropout_p: float, dropout_seed: int,
) -> tuple[Tensor, Tensor]:
    check_offsets(offsets, q.shape[0])
    spec = _spec(max_seq_len, form, causal, activation, scale, max_attn_len, contextual_len,
                 dropout_p, dropout_seed)
    args = (q, k, v, offsets, attn_bias, num_targets, spec)
    lse = q.new_empty(0, dtype=torch.float32)
    if backend == Backend.PYTORCH.value:
        from kernels.pytorch.pt_jagged_attention import reference_attention

        out = reference_attention(*args).contiguous()
    elif backend == Backend.BUCKETED.value:
        from kernels.bucketed.bucketed_jagged_attention import bucketed_forward

        out, lse = bucketed_forward(*args)
    elif backend == Backend.TRITON.value:
        from kernels.triton.triton_jagged_attention import triton_jagged_attention_fwd

        out, lse = triton_jagged_attention_fwd(*args)
    else:
        raise ValueError(f"unknown backend {backend!r}")
    return out, lse


@jagged_attention_fwd.register_fake
def _jagged_attention_fwd_fake(q, k, v, offsets, max_seq_len, form, causal, attn_bias,
                               num_targets, activation, backend, scale, max_attn_len,
                               contextual_len, dropout_p, dropout_seed):
    spec = _spec(max_seq_len, form, causal, activation, scale, max_attn_len, contextual_len,
                 dropout_p, dropout_seed)
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
    return out, q.new_empty(_lse_shape(q, v, spec, backend, attn_bias), dtype=torch.float32)


def _reference_backward(grad_out, q, k, v, offsets, attn_bias, num_targets, spec):
    """Gradients of the reference by torch.func.vjp: plain autograd is switched off inside
    a custom op's implementation, functorch's transform is not."""
    from kernels.pytorch.pt_jagged_attention import reference_attention

    def forward(*leaves):
        bias = leaves[3] if attn_bias is not None else None
        return reference_attention(leaves[0], leaves[1], leaves[2], offsets, bias, num_targets,
                                   spec)

    leaves = (q, k, v) + ((attn_bias,) if attn_bias is not None else ())
    _, vjp = torch.func.vjp(forward, *leaves)
    grads = vjp(grad_out)
    return grads[0], grads[1], grads[2], (grads[3] if attn_bias is not None else None)


@torch.library.custom_op("gem_kernels::jagged_attention_bwd", mutates_args=())
def jagged_attention_bwd(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, out: Tensor,
    lse: Tensor, max_seq_len: int, form: str, causal: bool, attn_bias: Optional[Tensor],
    num_targets: Optional[Tensor], activation: str, backend: str, scale: float,
    max_attn_len: int, contextual_len: int, dropout_p: float, dropout_seed: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    spec = _spec(max_seq_len, form, causal, activation, scale, max_attn_len, contextual_len,
                 dropout_p, dropout_seed)
    if backend == Backend.PYTORCH.value:
        dq, dk, dv, dbias = _reference_backward(grad_out, q, k, v, offsets, attn_bias,
                                                num_targets, spec)
    elif backend == Backend.BUCKETED.value:
        from kernels.bucketed.bucketed_jagged_attention import bucketed_backward

        dq, dk, dv, dbias = bucketed_backward(grad_out, q, k, v, offsets, out, lse, attn_bias,
                                              num_targets, spec)
    elif backend == Backend.TRITON.value:
        from kernels.triton.triton_jagged_attention import triton_jagged_attention_bwd

        dq, dk, dv, dbias = triton_jagged_attention_bwd(grad_out, q, k, v, offsets, out, lse,
                                                        attn_bias, num_targets, spec)
    else:
        raise ValueError(f"unknown backend {backend!r}")
    if dbias is None:
        dbias = q.new_empty(0)
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), dbias.contiguous()


@jagged_attention_bwd.register_fake
def _jagged_attention_bwd_fake(grad_out, q, k, v, offsets, out, lse, max_seq_len, form, causal,
                               attn_bias, num_targets, activation, backend, scale, max_attn_len,
                               contextual_len, dropout_p, dropout_seed):
    dbias = q.new_empty(0) if attn_bias is None else torch.empty_like(attn_bias)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias


def _setup_context(ctx, inputs, output):
    (q, k, v, offsets, max_seq_len, form, causal, attn_bias, num_targets, activation, backend,
     *options) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, offsets, out, lse, attn_bias, num_targets)
    ctx.params = (max_seq_len, form, causal, activation, backend, *options)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, offsets, out, lse, attn_bias, num_targets = ctx.saved_tensors
    max_seq_len, form, causal, activation, backend, *options = ctx.params
    dq, dk, dv, dbias = torch.ops.gem_kernels.jagged_attention_bwd(
        grad_out.contiguous(), q, k, v, offsets, out, lse, max_seq_len, form, causal, attn_bias,
        num_targets, activation, backend, *options)
    return (dq, dk, dv, None, None, None, None, (dbias if attn_bias is not None else None),
            None, None, None, None, None, None, None, None)


jagged_attention_fwd.register_autograd(_backward, setup_context=_setup_context)
