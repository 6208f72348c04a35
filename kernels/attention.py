"""Multi-head attention over jagged sequences: the one public entry point.

    out = jagged_attention(q, k, v, offsets, max_seq_len=512)                  # softmax
    out = jagged_attention(q, k, v, offsets, max_seq_len=512, form="gdpa",      # HSTU-style
                           causal=True, attn_bias=table, num_targets=nt)

Shapes: q, k (T, H, D); v (T, H, Dv); offsets (B+1,) int64 with offsets[-1] == T;
out (T, H, Dv). Conventions (truncation, targets, bias, GDPA normalization) are in
kernels/attention_spec.py and kernels/README.md.
"""

from __future__ import annotations

import math

import torch

import kernels.avx2.function as native_function
from kernels.attention_op import check_offsets  # importing it registers torch.ops.gem_kernels.*
from kernels.attention_spec import ACTIVATIONS, FORMS, TRITON_ACTIVATIONS, Spec
from kernels.common import Backend, select_backend

Tensor = torch.Tensor


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_seq_len: int, form: str,
                  attn_bias: Tensor | None, num_targets: Tensor | None, activation: str) -> None:
    """Shape/dtype/device rules; they read no tensor data, so torch.compile traces them."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 3:
            raise ValueError(f"{name} must be (tokens, heads, head_dim); got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor; got {x.dtype}")
        if x.device != q.device or x.dtype != q.dtype:
            raise ValueError(f"{name} ({x.dtype}, {x.device}) must match q ({q.dtype}, {q.device})")
    if k.shape != q.shape:
        raise ValueError(f"k shape {tuple(k.shape)} must equal q shape {tuple(q.shape)}")
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(f"v shape {tuple(v.shape)} must match q's tokens and heads {tuple(q.shape[:2])}")
    if offsets.dim() != 1 or offsets.shape[0] < 1 or offsets.dtype != torch.int64:
        raise ValueError(f"offsets must be a 1-D int64 tensor of B+1 >= 1 entries; got "
                         f"{offsets.dtype} of shape {tuple(offsets.shape)}")
    if offsets.device != q.device:
        raise ValueError(f"offsets device {offsets.device} must match q device {q.device}")
    if not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool) or max_seq_len < 1:
        raise ValueError(f"max_seq_len must be a positive int (not a bool); got {max_seq_len!r}")
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}; got {form!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}; got {activation!r}")
    if attn_bias is not None:
        if attn_bias.dim() != 2 or attn_bias.shape[0] != q.shape[1] or attn_bias.shape[1] % 2 != 1:
            raise ValueError(f"attn_bias must be (heads={q.shape[1]}, 2R+1) with an odd number of "
                             f"relative positions; got shape {tuple(attn_bias.shape)}")
        if attn_bias.device != q.device or attn_bias.dtype != q.dtype:
            raise ValueError(f"attn_bias must have q's dtype and device ({q.dtype}, {q.device}); "
                             f"got {attn_bias.dtype} on {attn_bias.device}")
    if num_targets is not None:
        if num_targets.shape != (offsets.shape[0] - 1,) or num_targets.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"num_targets must be an int tensor of shape (B={offsets.shape[0] - 1},); "
                             f"got {num_targets.dtype} of shape {tuple(num_targets.shape)}")
        if num_targets.device != q.device:
            raise ValueError(f"num_targets device {num_targets.device} must match q device {q.device}")


def _check_options(scale: float | None, max_attn_len: int, contextual_len: int,
                   dropout_p: float) -> None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"scale must be None (1/sqrt(D)) or a finite float; got {scale!r}")
    for name, value in (("max_attn_len", max_attn_len), ("contextual_len", contextual_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an int >= 0 (0 = off); got {value!r}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) \
            or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1); got {dropout_p!r}")


def _check_backend_supports(backend: Backend, form: str, activation: str, max_attn_len: int,
                            contextual_len: int, dropout_p: float) -> None:
    if backend is not Backend.TRITON:
        return
    if form == "gdpa" and activation not in TRITON_ACTIVATIONS:
        raise ValueError(f"the triton backend implements activations {TRITON_ACTIVATIONS}; "
                         f"got {activation!r}")
    unsupported = {name: value for name, value in (
        ("max_attn_len", max_attn_len), ("contextual_len", contextual_len),
        ("dropout_p", dropout_p)) if value}
    if unsupported:
        raise NotImplementedError(
            f"the triton backend does not implement {unsupported}; use backend='bucketed' "
            "or 'pytorch' for attention windows, contextual tokens and dropout")


def jagged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    max_seq_len: int,
    form: str = "softmax",
    causal: bool = False,
    attn_bias: Tensor | None = None,
    num_targets: Tensor | None = None,
    activation: str = "silu",
    scale: float | None = None,
    max_attn_len: int = 0,
    contextual_len: int = 0,
    dropout_p: float = 0.0,
    dropout_seed: int | None = None,
    backend: Backend | str | None = None,
) -> Tensor:
    """Attention within each jagged sequence, all heads at once.

    Args:
        q, k: (T, H, D) values of B concatenated sequences; v: (T, H, Dv).
        offsets: (B+1,) int64, sequence b is tokens offsets[b]:offsets[b+1].
        max_seq_len: sequences keep their last max_seq_len tokens; the rest get output 0.
        form: "softmax" = softmax(QK^T/sqrt(D) + bias) V;
            "gdpa" = act(QK^T/sqrt(D) + bias) V / L, L the sequence's kept length.
        causal: query i sees keys j <= i.
        attn_bias: (H, 2R+1) learned relative-position table (gets a gradient), or None.
        num_targets: (B,) int; the last num_targets[b] tokens are candidates that see the
            history and themselves only, and history never sees them. None = no targets.
        activation: GDPA activation name ("silu", "relu", "sigmoid" or registered ones).
        scale: score scale (HSTU's alpha); None = 1/sqrt(D).
        max_attn_len: > 0 limits attention to keys within this distance (HSTU's window,
            see attention_spec.py); 0 = unlimited.
        contextual_len: the first contextual_len kept tokens are contextual (HSTU's
            contextual_seq_len): they see all history and every query sees them.
        dropout_p: attention-weight dropout probability, applied whenever > 0 (pass 0 in
            eval, as with F.scaled_dot_product_attention).
        dropout_seed: seed of the dropout mask; None draws one from torch's generator.
        backend: Backend or its name; default $GEM_ATTENTION_BACKEND, else automatic
            (Triton on CUDA, bucketed on CPU).

    Returns:
        (T, H, Dv) in q's dtype; differentiable w.r.t. q, k, v and attn_bias.
    """
    _check_inputs(q, k, v, offsets, max_seq_len, form, attn_bias, num_targets, activation)
    _check_options(scale, max_attn_len, contextual_len, dropout_p)
    chosen = select_backend(q.device, backend, q.dtype)
    _check_backend_supports(chosen, form, activation, max_attn_len, contextual_len, dropout_p)
    if num_targets is not None:
        num_targets = num_targets.to(torch.int64)
    if dropout_p > 0 and dropout_seed is None:
        dropout_seed = int(torch.randint(0, 2**31 - 1, (1,)))
    scale = float(1.0 / math.sqrt(q.shape[2]) if scale is None else scale)
    spec = Spec(max_seq_len, form, causal, activation, scale, max_attn_len, contextual_len, float(dropout_p))
    if chosen is Backend.BUCKETED and native_function.takes_whole_call(
            q, v, offsets, spec, attn_bias, num_targets is not None):
        check_offsets(offsets, q.shape[0])
        return native_function.NativeSoftmaxAttention.apply(
            q.contiguous(), k.contiguous(), v.contiguous(), offsets.contiguous(), scale)
    out, _ = torch.ops.gem_kernels.jagged_attention_fwd(
        q.contiguous(), k.contiguous(), v.contiguous(), offsets.contiguous(), max_seq_len, form,
        causal, None if attn_bias is None else attn_bias.contiguous(), num_targets, activation,
        chosen.value, scale, max_attn_len, contextual_len, float(dropout_p), int(dropout_seed or 0))
    return out
