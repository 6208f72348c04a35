"""kernels/film_silu.py: the personalized FFN's FiLM + SiLU walked in token blocks gives
the reference's forward to the bit and its gradients to float rounding, for any block size,
examples without tokens, a single block, and bf16; its C kernel (kernels/avx2/film_silu.c)
gives both to float rounding, on any number of threads."""

from __future__ import annotations

import pytest
import torch

from kernels.film_silu import film_silu, film_silu_reference, native_library


def _inputs(dtype=torch.float32, batch=24, hidden=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 30, (batch,), generator=gen)
    lengths[3] = 0  # an example without history tokens
    seg = torch.repeat_interleave(torch.arange(batch), lengths)
    up = torch.randn(len(seg), hidden, generator=gen).to(dtype).requires_grad_()
    film = (0.5 * torch.randn(batch, 2 * hidden, generator=gen)).to(dtype).requires_grad_()
    return up, film, seg


@pytest.mark.parametrize("rows", [1, 7, 64, 10_000])
def test_blocks_give_the_reference_forward_exactly_and_its_gradients(rows):
    up, film, seg = _inputs()
    fast, ref = film_silu(up, film, seg, rows=rows, native=False), film_silu_reference(up, film, seg)
    assert torch.equal(fast, ref)
    grad = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(fast, (up, film), grad), torch.autograd.grad(ref, (up, film), grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gradients_match_finite_differences():
    up, film, seg = _inputs(torch.float64, batch=5, hidden=3)
    assert torch.autograd.gradcheck(lambda u, f: film_silu(u, f, seg, rows=4, native=False), (up, film))


def test_only_the_inputs_that_need_a_gradient_get_one():
    up, film, seg = _inputs()
    frozen = film.detach()
    out = film_silu(up, frozen, seg, rows=8, native=False)
    (grad,) = torch.autograd.grad(out.sum(), (up,))
    torch.testing.assert_close(grad, torch.autograd.grad(film_silu_reference(up, frozen, seg).sum(), (up,))[0])


def test_no_tokens_and_bf16():
    up, film, seg = _inputs()
    empty = film_silu(up[:0], film, seg[:0], rows=4, native=False)
    assert empty.shape == (0, up.shape[1])
    up16, film16 = up.detach().bfloat16().requires_grad_(), film.detach().bfloat16().requires_grad_()
    out = film_silu(up16, film16, seg, rows=8)
    assert out.dtype == torch.bfloat16 and torch.equal(out, film_silu_reference(up16, film16, seg))
    out.float().sum().backward()
    assert up16.grad.dtype == film16.grad.dtype == torch.bfloat16


def test_the_personalized_ffn_computes_the_reference_expression():
    from gem.model.interformer import PersonalizedFFN

    torch.manual_seed(0)
    ffn = PersonalizedFFN(dim=8, hidden=32, dropout=0.0)
    torch.nn.init.normal_(ffn.film.weight, std=0.3)  # zero-initialised: make the FiLM do something
    seg = torch.repeat_interleave(torch.arange(6), torch.tensor([5, 0, 900, 3, 400, 1]))
    x, ctx = torch.randn(len(seg), 8), torch.randn(6, 8)
    want = ffn.down(film_silu_reference(ffn.up(x), ffn.film(ctx), seg))
    torch.testing.assert_close(ffn(x, ctx, seg), want, rtol=1e-5, atol=1e-6)  # the C kernel where it builds
    ffn.film_native = False  # the blocks: the reference to the bit
    torch.testing.assert_close(ffn(x, ctx, seg), want, rtol=0, atol=0)


native = pytest.mark.skipif(native_library() is None, reason="the AVX2 FiLM kernel does not build on this machine")


def _native_inputs(batch=40, hidden=24, seed=1):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 300, (batch,), generator=gen)
    lengths[[0, batch // 2, -1]] = 0  # examples without tokens, first and last among them
    seg = torch.repeat_interleave(torch.arange(batch), lengths)
    up = (3 * torch.randn(len(seg), hidden, generator=gen)).requires_grad_()
    film = torch.randn(batch, 2 * hidden, generator=gen).requires_grad_()
    return up, film, seg


@native
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_c_kernel_gives_the_reference_to_float_rounding(threads):
    """> 4096 tokens, so the kernel splits the examples over threads (balanced by tokens)."""
    up, film, seg = _native_inputs()
    assert len(seg) > 4096
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = film_silu(up, film, seg)
        grad = torch.randn_like(fast).t().contiguous().t()  # a non-contiguous gradient
        grads = torch.autograd.grad(fast, (up, film), grad)
    finally:
        torch.set_num_threads(previous)
    assert fast.grad_fn is not None and "Native" in type(fast.grad_fn).__name__
    counts = torch.bincount(seg, minlength=film.shape[0])  # the offsets seg came from, as a jagged caller has them
    given = film_silu(up, film, seg, offsets=torch.cat([counts.new_zeros(1), counts.cumsum(0)]))
    assert torch.equal(given, fast)
    ref = film_silu_reference(up, film, seg)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, torch.autograd.grad(ref, (up, film), grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@native
def test_the_c_kernel_gives_only_the_gradients_asked_for_and_leaves_other_inputs_to_the_blocks():
    up, film, seg = _native_inputs(batch=6)
    (grad_film,) = torch.autograd.grad(film_silu(up.detach(), film, seg).sum(), (film,))
    torch.testing.assert_close(grad_film, torch.autograd.grad(film_silu_reference(up, film, seg).sum(), (film,))[0],
                               rtol=1e-4, atol=1e-4)
    shuffled = torch.randperm(len(seg))  # tokens out of example order: the blocks take them
    out = film_silu(up[shuffled], film, seg[shuffled], rows=64)
    assert "Native" not in type(out.grad_fn).__name__
    assert torch.equal(out, film_silu_reference(up[shuffled], film, seg[shuffled]))
    odd = film_silu(up[:, :20], film[:, :40], seg)  # H not a multiple of 8
    assert "Native" not in type(odd.grad_fn).__name__
