"""gem/model/jagged.py's pooling runs on the jagged tokens (no padding to the longest
history) and gives what a softmax over each sequence's own tokens gives, sequence by
sequence: values and gradients, empty sequences pooled to 0, bf16 inputs."""

from __future__ import annotations

import math

import pytest
import torch

from gem.model.jagged import attention_pool, target_pool


def _per_sequence(values, offsets, queries, per_example: bool):
    out = []
    for b in range(offsets.numel() - 1):
        v = values[int(offsets[b]):int(offsets[b + 1])]
        q = queries[b:b + 1] if per_example else queries
        if v.shape[0] == 0:
            out.append(torch.zeros(q.shape[0], values.shape[1], dtype=values.dtype))
            continue
        out.append(torch.softmax(q @ v.t() / math.sqrt(values.shape[1]), -1) @ v)
    pooled = torch.stack(out)
    return pooled[:, 0] if per_example else pooled


def _inputs(seed=0, batch=9, dim=8):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (batch,), generator=gen)
    lengths[2] = lengths[6] = 0  # sequences without tokens
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    values = (3 * torch.randn(int(offsets[-1]), dim, generator=gen, dtype=torch.float64)).requires_grad_()
    return values, offsets, gen


@pytest.mark.parametrize("pool", ["attention", "target"])
def test_pooling_is_the_per_sequence_softmax_with_its_gradients(pool):
    values, offsets, gen = _inputs()
    rows = offsets.numel() - 1 if pool == "target" else 3
    queries = torch.randn(rows, values.shape[1], generator=gen, dtype=torch.float64).requires_grad_()
    fn = target_pool if pool == "target" else attention_pool
    got, want = fn(values, offsets, queries), _per_sequence(values, offsets, queries, pool == "target")
    torch.testing.assert_close(got, want)
    assert got.abs().amax(-1)[[2, 6]].max() == 0  # the empty sequences
    grad = torch.randn_like(want)
    for g, w in zip(torch.autograd.grad(got, (values, queries), grad),
                    torch.autograd.grad(want, (values, queries), grad)):
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradcheck(lambda v, q: fn(v, offsets, q), (values, queries))


def test_large_scores_stay_finite_and_bf16_keeps_its_dtype():
    values, offsets, gen = _inputs(seed=1)
    queries = 1e3 * torch.randn(2, values.shape[1], generator=gen, dtype=torch.float64)  # exp() would overflow
    pooled = attention_pool(values.detach(), offsets, queries)
    assert torch.isfinite(pooled).all()
    torch.testing.assert_close(pooled, _per_sequence(values.detach(), offsets, queries, False))
    low = attention_pool(values.detach().bfloat16(), offsets, queries.bfloat16())
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
