"""The personalized FFN's middle over jagged tokens: ``silu(up * (1 + scale[seg]) + shift[seg])``.

    from kernels.film_silu import film_silu
    act_NH = film_silu(up_NH, film_B2H, seg_N)     # film_B2H = [scale | shift] per example

``up_NH``: the tokens' up-projection (N, H); ``film_B2H``: each example's FiLM scale and
shift (B, 2H); ``seg_N``: each token's example (int64, N). ``film_silu_reference`` is the
same expression in three autograd ops; it is what the tests compare against.

Why a fast path: on CPU the reference is memory-bound. With the demo's histories (N ~ 48k
tokens of a 512-example batch, H = 256), every elementwise pass over an (N, H) tensor moves
~50 MB, and autograd makes ~12 of them per layer and step (the gathered (N, 2H) FiLM rows,
the sum, the product, SiLU, their backwards, the concatenated FiLM gradient), about a
third of the train step (docs/training-efficiency.md). ``film_silu`` walks the tokens in
blocks of ``rows`` so that each block's intermediates stay in cache, saves only ``up``
(the pre-activation is recomputed in backward, block by block) and sums each block's FiLM
gradient straight into (B, 2H). Same math, same dtype: the forward equal to the
reference's to the bit, the gradients to float rounding.

Faster still where it builds (x86-64 with AVX2 and FMA, a C compiler; fp32 on CPU, H a
multiple of 8, tokens in example order): kernels/avx2/film_silu.c makes one pass over the
tokens each way, the FiLM gradient summed per example in registers and cache (threads own
whole examples). Its SiLU uses a polynomial exp (relative error < 2e-7), so it matches the
reference to float rounding, not to the bit. ``native=False`` or $GEM_NATIVE_FILM=0 keep
the blocks.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch.nn import functional as F

from kernels.avx2.loader import native_library as build_native
from kernels.avx2.loader import pointer as _ptr

ROWS = 1024  # tokens per block: 1024 x H=256 x 4 bytes = 1 MB of each intermediate
NATIVE_SOURCE = Path(__file__).with_name("avx2") / "film_silu.c"
NATIVE_SWITCH = "GEM_NATIVE_FILM"


def film_silu_reference(up_NH: torch.Tensor, film_B2H: torch.Tensor, seg_N: torch.Tensor) -> torch.Tensor:
    scale_NH, shift_NH = film_B2H.index_select(0, seg_N).chunk(2, dim=-1)
    return F.silu(torch.addcmul(up_NH + shift_NH, up_NH, scale_NH))


def film_silu(up_NH: torch.Tensor, film_B2H: torch.Tensor, seg_N: torch.Tensor, rows: int = ROWS,
              native: bool = True, offsets: torch.Tensor | None = None) -> torch.Tensor:
    """``rows`` <= 0: the reference; ``native``: the C kernel where it runs, else the blocks.
    ``offsets``: the examples' token offsets (B + 1) that ``seg_N`` was made from, when the
    caller has them (a jagged layout: tokens in example order); else the C kernel's path
    derives them from ``seg_N``, checking its order."""
    if up_NH.shape[0] == 0 or rows <= 0:
        return film_silu_reference(up_NH, film_B2H, seg_N)
    if native and (offsets := _native_offsets(up_NH, film_B2H, seg_N, offsets)) is not None:
        return _FilmSiluNative.apply(up_NH.contiguous(), film_B2H.contiguous(), offsets)
    if up_NH.shape[0] <= rows:
        return film_silu_reference(up_NH, film_B2H, seg_N)  # one block: nothing to keep in cache
    return _FilmSilu.apply(up_NH.contiguous(), film_B2H.contiguous(), seg_N, rows)


@functools.lru_cache(maxsize=1)
def native_library() -> ctypes.CDLL | None:
    """kernels/avx2/film_silu.c: film_silu_* (here) and film_ffn_* (kernels/film_ffn.py)."""
    lib, _ = build_native(NATIVE_SOURCE, NATIVE_SWITCH, "FiLM", "torch's ops in token blocks")
    if lib is not None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.film_silu_forward.argtypes = [ptr] * 4 + [i64, i64, ctypes.c_int]
        lib.film_silu_backward.argtypes = [ptr] * 6 + [i64, i64, ctypes.c_int]
        lib.film_ffn_forward.argtypes = [ptr] * 9 + [i64, i64, i64, ctypes.c_int]
        lib.film_ffn_backward.argtypes = [ptr] * 13 + [i64, i64, i64, ctypes.c_int]
        for fn in (lib.film_silu_forward, lib.film_silu_backward, lib.film_ffn_forward, lib.film_ffn_backward):
            fn.restype = ctypes.c_int
    return lib


def _native_offsets(up: torch.Tensor, film: torch.Tensor, seg: torch.Tensor,
                    offsets: torch.Tensor | None) -> torch.Tensor | None:
    """The examples' token offsets (B + 1) when the C kernel can take these inputs, else None."""
    if not (up.device.type == "cpu" and up.dtype == film.dtype == torch.float32 and up.shape[1] % 8 == 0
            and not torch.is_autocast_enabled("cpu") and native_library() is not None):
        return None
    if offsets is not None:
        return offsets.to(torch.int64).contiguous()
    if seg.numel() > 1 and not bool((seg[1:] >= seg[:-1]).all()):
        return None  # tokens not in example order
    counts = torch.bincount(seg, minlength=film.shape[0])
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


class _FilmSiluNative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, up, film, offsets):
        act = torch.empty_like(up)
        status = native_library().film_silu_forward(_ptr(up), _ptr(film), _ptr(offsets), _ptr(act),
                                                    film.shape[0], up.shape[1], torch.get_num_threads())
        if status:
            raise RuntimeError(f"film_silu_forward failed ({status})")
        ctx.save_for_backward(up, film, offsets)
        return act

    @staticmethod
    def backward(ctx, grad_act):
        up, film, offsets = ctx.saved_tensors
        grad_act = grad_act.contiguous()  # held here: the C call reads its memory
        grad_up = torch.empty_like(up) if ctx.needs_input_grad[0] else None
        grad_film = torch.zeros_like(film) if ctx.needs_input_grad[1] else None
        status = native_library().film_silu_backward(
            _ptr(grad_act), _ptr(up), _ptr(film), _ptr(offsets), _ptr(grad_up), _ptr(grad_film),
            film.shape[0], up.shape[1], torch.get_num_threads())
        if status:
            raise RuntimeError(f"film_silu_backward failed ({status})")
        return grad_up, grad_film, None


def _pre(up: torch.Tensor, film_rows: torch.Tensor, hidden: int) -> torch.Tensor:
    """(up + shift) + up * scale for one block, from its gathered (n, 2H) FiLM rows: the
    reference's order of operations, so the forward is the reference's to the bit."""
    return torch.add(up, film_rows[:, hidden:]).addcmul_(up, film_rows[:, :hidden])


class _FilmSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, up, film, seg, rows):
        hidden = up.shape[1]
        out = torch.empty_like(up)
        for lo in range(0, up.shape[0], rows):
            hi = min(lo + rows, up.shape[0])
            pre = _pre(up[lo:hi], film.index_select(0, seg[lo:hi]), hidden)
            torch.ops.aten.silu.out(pre, out=out[lo:hi])
        ctx.save_for_backward(up, film, seg)
        ctx.rows = rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        up, film, seg = ctx.saved_tensors
        hidden, rows = up.shape[1], ctx.rows
        grad_out = grad_out.contiguous()
        grad_up = torch.empty_like(up) if ctx.needs_input_grad[0] else None
        grad_film = torch.zeros_like(film) if ctx.needs_input_grad[1] else None
        for lo in range(0, up.shape[0], rows):
            hi = min(lo + rows, up.shape[0])
            film_rows = film.index_select(0, seg[lo:hi])
            d_pre = torch.ops.aten.silu_backward(grad_out[lo:hi], _pre(up[lo:hi], film_rows, hidden))
            if grad_up is not None:  # d_pre * (1 + scale)
                torch.addcmul(d_pre, d_pre, film_rows[:, :hidden], out=grad_up[lo:hi])
            if grad_film is not None:  # per token [d_pre * up | d_pre], summed per example
                torch.mul(d_pre, up[lo:hi], out=film_rows[:, :hidden])
                film_rows[:, hidden:].copy_(d_pre)
                grad_film.index_add_(0, seg[lo:hi], film_rows)
        return grad_up, grad_film, None, None
