"""Helpers shared by the jagged attention tests: random cases, reference runs, errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels import jagged_attention
from kernels.jagged_inputs import offsets_from_lengths, random_qkv
from kernels.pytorch.pt_jagged_attention import pytorch_jagged_attention

Tensor = torch.Tensor


@dataclass
class Case:
    q: Tensor
    k: Tensor
    v: Tensor
    offsets: Tensor
    attn_bias: Tensor | None
    num_targets: Tensor | None
    options: dict = field(default_factory=dict)  # max_seq_len, form, causal, activation

    def leaves(self, dtype: torch.dtype) -> list[Tensor]:
        tensors = [self.q, self.k, self.v] + ([self.attn_bias] if self.attn_bias is not None else [])
        return [x.detach().to(dtype).requires_grad_() for x in tensors]


def make_case(generator: torch.Generator, lengths: list[int], *, heads: int = 2, dim: int = 16,
              value_dim: int | None = None, dtype: torch.dtype = torch.float32,
              bias_radius: int | None = None, with_targets: bool = False, **options) -> Case:
    """A random case; inputs are rounded to `dtype` so every backend sees the same values."""
    lengths_t = torch.tensor(lengths, dtype=torch.int64)
    offsets = offsets_from_lengths(lengths_t)
    q, k, v = random_qkv(int(offsets[-1]), heads, dim, dtype, generator, value_dim)
    bias = None
    if bias_radius is not None:
        bias = torch.randn(heads, 2 * bias_radius + 1, generator=generator).to(dtype)
    targets = None
    if with_targets:
        # Up to half of each sequence, sometimes more than the sequence (gets clamped).
        targets = torch.randint(0, 4, (len(lengths),), generator=generator)
        targets = torch.where(lengths_t > 3, torch.minimum(targets, lengths_t // 2), targets)
    options.setdefault("max_seq_len", max(lengths + [1]))
    return Case(q, k, v, offsets, bias, targets, options)


def _forward(fn, case: Case, leaves: list[Tensor], **extra) -> Tensor:
    bias = leaves[3] if case.attn_bias is not None else None
    return fn(leaves[0], leaves[1], leaves[2], case.offsets, attn_bias=bias,
              num_targets=case.num_targets, **case.options, **extra)


def reference(case: Case, grad_out: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
    """Reference output and gradients (of <out, grad_out>) in float64."""
    leaves = case.leaves(torch.float64)
    out = _forward(pytorch_jagged_attention, case, leaves)
    if grad_out is None:
        return out.detach(), []
    grads = torch.autograd.grad(out, leaves, grad_out.to(torch.float64))
    return out.detach(), list(grads)


def run_backend(case: Case, backend: str, grad_out: Tensor | None = None,
                dtype: torch.dtype | None = None) -> tuple[Tensor, list[Tensor]]:
    """The public op on one backend: output and gradients, in the case's dtype."""
    leaves = case.leaves(dtype or case.q.dtype)
    out = _forward(jagged_attention, case, leaves, backend=backend)
    if grad_out is None:
        return out.detach(), []
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
    return out.detach(), list(grads)


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """||actual - expected|| / ||expected|| (0 when both are zero)."""
    actual, expected = actual.double(), expected.double()
    denom = expected.norm().item()
    diff = (actual - expected).norm().item()
    return diff if denom == 0.0 else diff / denom


def assert_close_to_reference(case: Case, backend: str, tolerance: float,
                              generator: torch.Generator, check_grads: bool = True,
                              tolerances: dict[str, float] | None = None) -> None:
    """Output and every gradient of `backend` within `tolerance` relative error
    (`tolerances` overrides it per name: out, dq, dk, dv, dbias)."""
    num_tokens, heads = case.q.shape[:2]
    grad_out = None
    if check_grads:
        grad_out = torch.randn(num_tokens, heads, case.v.shape[2], generator=generator)
        grad_out = grad_out.to(device=case.q.device, dtype=case.q.dtype)
    expected, expected_grads = reference(case, grad_out)
    actual, actual_grads = run_backend(case, backend, grad_out)
    assert actual.shape == expected.shape and actual.dtype == case.q.dtype
    names = ["out", "dq", "dk", "dv", "dbias"]
    for name, got, want in zip(names, [actual] + actual_grads, [expected] + expected_grads):
        assert torch.isfinite(got).all(), f"{backend}: {name} has non-finite values"
        err = relative_error(got, want)
        limit = (tolerances or {}).get(name, tolerance)
        assert err < limit, f"{backend}: {name} relative error {err:.3e} >= {limit:.0e}"
