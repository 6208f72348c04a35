"""The personalized FFN whole, over jagged tokens: ``down(silu(up(x) * (1 + scale[seg]) + shift[seg]))``.

    from kernels.film_ffn import film_ffn
    y_ND = film_ffn(x_ND, film_B2H, offsets, seg_N, ffn.up, ffn.down)   # two nn.Linear: D -> H -> D

``x_ND``: the tokens (N, D), in example order; ``film_B2H``: each example's FiLM scale and
shift (B, 2H); ``offsets``: the examples' token offsets (B + 1); ``seg_N``: each token's
example, made from them (the fallback's FiLM takes it). ``film_ffn_reference`` is
the same expression in torch's ops (kernels/film_silu.py's reference in the middle); it is
what the tests compare against.

Why a fast path: with the demo's histories (N ~ 52k tokens, D = 64, H = 256) the FFN is a
third of a train step. Run as torch ops, each of its six (N, 64) x (64, 256)-sized products
reads or writes an (N, 256) tensor of ~53 MB from memory, and the FiLM's pass between them
reads ``up`` back from memory too. kernels/avx2/film_silu.c's ``film_ffn_*`` runs the up
product, the FiLM + SiLU and the down product in blocks of 96 tokens whose (96, 256)
intermediates stay in L2, on register-tiled products (kernels/avx2/tile_gemm.h); only
``up`` is written out, for the backward, which recomputes the activation block by block.
On a late demo layer alone (2 threads): forward 39 -> 27 ms, backward 78 -> 51 ms
(docs/training-efficiency.md). Same math to float rounding (sums in another order).

Where it runs: x86-64 with AVX2 and FMA and a C compiler (the loader builds the kernel on
first use), fp32 on CPU without autocast, D and H multiples of 8, eager (under
torch.compile or a dispatch mode such as the FLOP counter, torch's ops run, so they see
the products). Elsewhere, or with $GEM_NATIVE_FILM=0, ``film_ffn`` runs the reference's
ops with kernels/film_silu.py's fast middle.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from kernels.avx2.loader import pointer as _ptr
from kernels.film_silu import film_silu, film_silu_reference, native_library


def film_ffn_reference(x_ND: torch.Tensor, film_B2H: torch.Tensor, seg_N: torch.Tensor, up: nn.Linear,
                       down: nn.Linear) -> torch.Tensor:
    return down(film_silu_reference(up(x_ND), film_B2H, seg_N))


def film_ffn(x_ND: torch.Tensor, film_B2H: torch.Tensor, offsets: torch.Tensor, seg_N: torch.Tensor, up: nn.Linear,
             down: nn.Linear) -> torch.Tensor:
    """The C kernel where it runs (see the module's notes), else ``down(film_silu(up(x)))``."""
    if len(offsets) != film_B2H.shape[0] + 1 or int(offsets[-1]) != x_ND.shape[0]:
        raise ValueError(f"offsets ({len(offsets)}, last {int(offsets[-1])}) do not describe "
                         f"{film_B2H.shape[0]} examples of {x_ND.shape[0]} tokens")
    if _native_applies(x_ND, film_B2H, up, down):
        inputs = (x_ND, film_B2H, up.weight, up.bias, down.weight, down.bias)
        keep_up = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)  # for the backward
        return _FilmFfnNative.apply(x_ND.contiguous(), film_B2H.contiguous(), offsets.to(torch.int64).contiguous(),
                                    up.weight, up.bias, down.weight, down.bias, keep_up)
    return down(film_silu(up(x_ND), film_B2H, seg_N, offsets=offsets))


def _native_applies(x: torch.Tensor, film: torch.Tensor, up: nn.Linear, down: nn.Linear) -> bool:
    tensors = (x, film, up.weight, up.bias, down.weight, down.bias)
    return (x.shape[0] > 0 and all(t is not None and t.device.type == "cpu" and t.dtype == torch.float32
                                   for t in tensors)
            and x.shape[1] % 8 == 0 and up.weight.shape[0] % 8 == 0
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()
            and _get_current_dispatch_mode() is None and native_library() is not None)


def _check(status: int, what: str, x: torch.Tensor, hidden: int) -> None:
    if status:
        reason = "out of memory" if status == 2 else "D or H not a multiple of 8"
        raise RuntimeError(f"{what} failed ({reason}) on {tuple(x.shape)} tokens, H={hidden}")


class _FilmFfnNative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, film, offsets, w_up, b_up, w_down, b_down, keep_up):
        w_up, b_up, w_down, b_down = (t.detach().contiguous() for t in (w_up, b_up, w_down, b_down))
        hidden = w_up.shape[0]
        up = x.new_empty(x.shape[0], hidden) if keep_up else None
        y = x.new_empty(x.shape)
        _check(native_library().film_ffn_forward(
            _ptr(x), _ptr(w_up), _ptr(b_up), _ptr(film), _ptr(w_down), _ptr(b_down), _ptr(offsets), _ptr(up),
            _ptr(y), film.shape[0], x.shape[1], hidden, torch.get_num_threads()), "film_ffn_forward", x, hidden)
        ctx.save_for_backward(x, up, film, offsets, w_up, w_down)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, up, film, offsets, w_up, w_down = ctx.saved_tensors
        grad_y = grad_y.contiguous()  # held here: the C call reads its memory
        need = ctx.needs_input_grad
        grad_x = torch.empty_like(x) if need[0] else None
        grad_film = torch.zeros_like(film) if need[1] else None
        grad_w_up, grad_b_up = torch.empty_like(w_up), w_up.new_empty(w_up.shape[0])
        grad_w_down, grad_b_down = torch.empty_like(w_down), w_down.new_empty(w_down.shape[0])
        _check(native_library().film_ffn_backward(
            _ptr(grad_y), _ptr(x), _ptr(up), _ptr(film), _ptr(w_up), _ptr(w_down), _ptr(offsets), _ptr(grad_x),
            _ptr(grad_film), _ptr(grad_w_up), _ptr(grad_b_up), _ptr(grad_w_down), _ptr(grad_b_down),
            film.shape[0], x.shape[1], w_up.shape[0], torch.get_num_threads()), "film_ffn_backward", x, w_up.shape[0])
        return (grad_x, grad_film, None, grad_w_up if need[3] else None, grad_b_up if need[4] else None,
                grad_w_down if need[5] else None, grad_b_down if need[6] else None, None)
