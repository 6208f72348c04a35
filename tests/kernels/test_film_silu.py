"""kernels/film_silu.py: the personalized FFN's FiLM + SiLU walked in token blocks gives
the reference's forward to the bit and its gradients to float rounding, for any block size,
examples without tokens, a single block, and bf16."""

from __future__ import annotations

import pytest
import torch

from kernels.film_silu import film_silu, film_silu_reference


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
    fast, ref = film_silu(up, film, seg, rows=rows), film_silu_reference(up, film, seg)
    assert torch.equal(fast, ref)
    grad = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(fast, (up, film), grad), torch.autograd.grad(ref, (up, film), grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gradients_match_finite_differences():
    up, film, seg = _inputs(torch.float64, batch=5, hidden=3)
    assert torch.autograd.gradcheck(lambda u, f: film_silu(u, f, seg, rows=4), (up, film))


def test_only_the_inputs_that_need_a_gradient_get_one():
    up, film, seg = _inputs()
    frozen = film.detach()
    out = film_silu(up, frozen, seg, rows=8)
    (grad,) = torch.autograd.grad(out.sum(), (up,))
    torch.testing.assert_close(grad, torch.autograd.grad(film_silu_reference(up, frozen, seg).sum(), (up,))[0])


def test_no_tokens_and_bf16():
    up, film, seg = _inputs()
    empty = film_silu(up[:0], film, seg[:0], rows=4)
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
    torch.testing.assert_close(ffn(x, ctx, seg), want, rtol=0, atol=0)
