"""kernels/jagged_pool.py: the jagged weighted sums' C kernel (kernels/avx2/jagged_pool.c)
give the reference's output and gradients to float rounding on any number of threads, with
examples without tokens; what it cannot take (float64, D not a multiple of 8, a dispatch
mode) runs the reference."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from kernels.jagged_pool import jagged_weighted_sum, jagged_weighted_sum_reference, native_library

native = pytest.mark.skipif(native_library() is None, reason="the AVX2 pooling kernel does not build on this machine")


def _inputs(batch=300, queries=2, dim=64, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 60, (batch,), generator=gen)
    lengths[[0, batch // 2, -1]] = 0  # examples without tokens, first and last among them
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    seg = torch.repeat_interleave(torch.arange(batch), lengths)
    weights = torch.rand(len(seg), queries, generator=gen).to(dtype).requires_grad_()
    values = torch.randn(len(seg), dim, generator=gen).to(dtype).requires_grad_()
    return weights, values, offsets, seg


@native
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_c_kernel_gives_the_reference_and_its_gradients(threads):
    weights, values, offsets, seg = _inputs()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = jagged_weighted_sum(weights, values, offsets, seg)
        grad = torch.randn_like(fast).transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous
        got = torch.autograd.grad(fast, (weights, values), grad)
    finally:
        torch.set_num_threads(previous)
    assert "WeightedSumNative" in type(fast.grad_fn).__name__
    ref = jagged_weighted_sum_reference(weights, values, seg, len(offsets) - 1)
    assert fast.shape == ref.shape == (300, 2, 64)
    assert torch.equal(fast[0], torch.zeros(2, 64))  # no tokens: zeros
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    for g, want in zip(got, torch.autograd.grad(ref, (weights, values), grad)):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)


@native
def test_only_the_gradients_asked_for():
    weights, values, offsets, seg = _inputs(batch=20, queries=3, dim=16, seed=1)
    fast = jagged_weighted_sum(weights.detach(), values, offsets, seg)
    assert "WeightedSumNative" in type(fast.grad_fn).__name__
    (grad_v,) = torch.autograd.grad(fast.sum(), (values,))
    ref = jagged_weighted_sum_reference(weights.detach(), values, seg, 20)
    torch.testing.assert_close(grad_v, torch.autograd.grad(ref.sum(), (values,))[0])


def test_what_the_kernel_cannot_take_runs_the_reference():
    weights, values, offsets, seg = _inputs(batch=8, dim=12, seed=2)  # D not a multiple of 8
    out = jagged_weighted_sum(weights, values, offsets, seg)
    assert "WeightedSumNative" not in type(out.grad_fn).__name__
    assert torch.equal(out, jagged_weighted_sum_reference(weights, values, seg, 8))
    weights, values, offsets, seg = _inputs(batch=8, dim=16, dtype=torch.float64, seed=3)
    assert torch.autograd.gradcheck(lambda w, v: jagged_weighted_sum(w, v, offsets, seg), (weights, values))
    with FlopCounterMode(display=False):
        counted = jagged_weighted_sum(weights.float(), values.float(), offsets, seg)
    assert "WeightedSumNative" not in type(counted.grad_fn).__name__
