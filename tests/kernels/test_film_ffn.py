"""kernels/film_ffn.py: the personalized FFN in C token blocks (kernels/avx2/film_silu.c's
film_ffn_*) gives the reference's output and every gradient to float rounding, on any
number of threads, with examples without tokens and blocks that do not divide the tokens;
it keeps nothing for a backward under no_grad, and leaves to torch's ops what it cannot
take (a dispatch mode such as the FLOP counter, bf16 autocast, dims not multiples of 8)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from kernels.film_ffn import film_ffn, film_ffn_reference
from kernels.film_silu import native_library

native = pytest.mark.skipif(native_library() is None, reason="the AVX2 FiLM kernel does not build on this machine")


def _inputs(batch=40, dim=16, hidden=40, longest=300, seed=1):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, longest, (batch,), generator=gen)
    lengths[[0, batch // 2, -1]] = 0  # examples without tokens, first and last among them
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    seg = torch.repeat_interleave(torch.arange(batch), lengths)
    torch.manual_seed(seed)
    up, down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
    x = torch.randn(len(seg), dim, generator=gen).requires_grad_()
    film = (0.5 * torch.randn(batch, 2 * hidden, generator=gen)).requires_grad_()
    return x, film, offsets, seg, up, down


def _grads(out, x, film, up, down, grad):
    return torch.autograd.grad(out, (x, film, up.weight, up.bias, down.weight, down.bias), grad)


@native
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_c_kernel_gives_the_reference_and_its_gradients(threads):
    """> 4096 tokens, so the kernel splits the examples over threads; 96-token blocks
    leave a remainder, and the 6-row tiles one inside each block."""
    x, film, offsets, seg, up, down = _inputs()
    assert len(seg) > 4096 and len(seg) % 96
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = film_ffn(x, film, offsets, seg, up, down)
        grad = torch.randn_like(fast).t().contiguous().t()  # a non-contiguous gradient
        got = _grads(fast, x, film, up, down, grad)
    finally:
        torch.set_num_threads(previous)
    assert "FilmFfnNative" in type(fast.grad_fn).__name__
    ref = film_ffn_reference(x, film, seg, up, down)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    for name, g, want in zip(("x", "film", "w_up", "b_up", "w_down", "b_down"), got,
                             _grads(ref, x, film, up, down, grad)):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()), msg=name)


@native
def test_few_tokens_in_one_block_and_only_the_gradients_asked_for():
    x, film, offsets, seg, up, down = _inputs(batch=5, dim=8, hidden=24, longest=8, seed=4)
    assert 0 < len(seg) < 96  # 11 tokens of two examples: one block, one thread
    frozen = film.detach()
    fast = film_ffn(x, frozen, offsets, seg, up, down)
    assert "FilmFfnNative" in type(fast.grad_fn).__name__
    (grad_x,) = torch.autograd.grad(fast.sum(), (x,))
    ref = film_ffn_reference(x, frozen, seg, up, down)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_x, torch.autograd.grad(ref.sum(), (x,))[0], rtol=1e-5, atol=1e-6)


@native
def test_inference_keeps_no_up_and_gives_the_training_forward():
    x, film, offsets, seg, up, down = _inputs(seed=4)
    trained = film_ffn(x, film, offsets, seg, up, down)
    assert "FilmFfnNative" in type(trained.grad_fn).__name__
    with torch.no_grad():
        scored = film_ffn(x, film, offsets, seg, up, down)
    assert scored.grad_fn is None and torch.equal(scored, trained)


def test_what_the_kernel_cannot_take_runs_as_torch_ops():
    x, film, offsets, seg, up, down = _inputs(batch=6, seed=5)
    with FlopCounterMode(display=False) as flops:  # a dispatch mode: the products must be seen
        out = film_ffn(x, film, offsets, seg, up, down)
    assert "FilmFfnNative" not in type(out.grad_fn).__name__
    assert flops.get_total_flops() == 2 * 2 * len(seg) * 16 * 40
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert film_ffn(x, film, offsets, seg, up, down).dtype == torch.bfloat16
    odd_up, odd_down = nn.Linear(16, 36), nn.Linear(36, 16)  # H not a multiple of 8
    odd = film_ffn(x, film[:, :72], offsets, seg, odd_up, odd_down)
    torch.testing.assert_close(odd, film_ffn_reference(x, film[:, :72], seg, odd_up, odd_down))
    with pytest.raises(ValueError, match="do not describe"):
        film_ffn(x[:-1], film, offsets, seg[:-1], up, down)


def test_the_personalized_ffn_fuses_only_without_dropout_in_training():
    from gem.model.interformer import PersonalizedFFN

    x, film, offsets, seg, _, _ = _inputs(batch=8, seed=6)
    ctx = torch.randn(8, 16)
    ffn = PersonalizedFFN(dim=16, hidden=40, dropout=0.1)
    torch.nn.init.normal_(ffn.film.weight, std=0.3)
    fused_name = "FilmFfnNative" if native_library() is not None else "AddmmBackward"
    assert "FilmFfnNative" not in type(ffn(x, ctx, seg, offsets).grad_fn).__name__  # dropout active
    ffn.eval()
    scale, shift = ffn.film(ctx)[seg].chunk(2, dim=-1)
    want = ffn.down(torch.nn.functional.silu(ffn.up(x) * (1 + scale) + shift))
    got = ffn(x, ctx, seg, offsets)
    assert fused_name in type(got.grad_fn).__name__
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    ffn.fused = False
    assert "FilmFfnNative" not in type(ffn(x, ctx, seg, offsets).grad_fn).__name__
