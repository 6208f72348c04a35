"""The reference itself, against an element-by-element reading of the spec and two peers
(fbgemm's sll_jagged_flash_attention_basic and torch's SDPA)."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from jagged_attention_cases import make_case, reference, relative_error, run_backend

from kernels.jagged_inputs import offsets_from_lengths
from kernels.pytorch.pt_jagged_attention import pytorch_jagged_attention

ACTIVATION_FNS = {"silu": F.silu, "relu": F.relu, "sigmoid": torch.sigmoid}


def spec_by_elements(case) -> torch.Tensor:
    """Loops over (sequence, query, key) straight from the docstring of attention_spec."""
    q, k, v = (x.double() for x in (case.q, case.k, case.v))
    opts = case.options
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    scale = 1.0 / math.sqrt(q.shape[2])
    bounds = case.offsets.tolist()
    for b in range(len(bounds) - 1):
        length = min(bounds[b + 1] - bounds[b], opts["max_seq_len"])
        start = bounds[b + 1] - length
        targets = 0 if case.num_targets is None else min(max(int(case.num_targets[b]), 0), length)
        history = length - targets
        for i in range(length):
            keys, scores = [], []
            for j in range(length):
                if not (j < history or j == i) or (opts.get("causal") and j > i):
                    continue
                score = (q[start + i] * k[start + j]).sum(-1) * scale  # (H,)
                if case.attn_bias is not None:
                    radius = (case.attn_bias.shape[1] - 1) // 2
                    rel = min(j, history) - min(i, history)
                    score = score + case.attn_bias[:, max(-radius, min(radius, rel)) + radius].double()
                keys.append(j)
                scores.append(score)
            scores = torch.stack(scores, dim=1)  # (H, keys)
            if opts.get("form", "softmax") == "softmax":
                weights = torch.softmax(scores, dim=1)
            else:
                weights = ACTIVATION_FNS[opts.get("activation", "silu")](scores) / length
            values = v[[start + j for j in keys]]  # (keys, H, Dv)
            out[start + i] = torch.einsum("hk,khd->hd", weights, values)
    return out


@pytest.mark.parametrize("form,activation", [("softmax", "silu"), ("gdpa", "silu"),
                                             ("gdpa", "relu"), ("gdpa", "sigmoid")])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_elementwise_spec(generator, form, activation, causal):
    case = make_case(generator, [4, 0, 1, 7, 9], heads=2, dim=8, bias_radius=3,
                     with_targets=True, max_seq_len=6, form=form, causal=causal,
                     activation=activation)
    expected = spec_by_elements(case)
    actual, _ = reference(case)
    assert relative_error(actual, expected) < 1e-12


def test_reference_without_targets_or_bias_matches_elementwise_spec(generator):
    case = make_case(generator, [3, 5, 2], heads=3, dim=4, max_seq_len=5, causal=True)
    assert relative_error(reference(case)[0], spec_by_elements(case)) < 1e-12


@pytest.mark.parametrize("backend", ["pytorch", "bucketed"])
def test_softmax_matches_fbgemm_sll_flash_attention_basic(generator, backend):
    """fbgemm's basic op (one head): out = (softmax(Q K^T) / N) V with N = its max_seq_len
    and no 1/sqrt(D). Ours with q * sqrt(D), divided by N, must equal it, gradients too."""
    fbgemm_sll = pytest.importorskip("fbgemm_gpu.sll")
    assert fbgemm_sll is not None
    lengths = torch.randint(1, 24, (6,), generator=generator).tolist()
    max_len = max(lengths)
    case = make_case(generator, lengths, heads=1, dim=16, max_seq_len=max_len)
    grad_out = torch.randn(case.q.shape[0], 1, 16, generator=generator)

    q_fb, k_fb, v_fb = (x[:, 0].detach().clone().requires_grad_() for x in (case.q, case.k, case.v))
    theirs = torch.ops.fbgemm.sll_jagged_flash_attention_basic(q_fb, k_fb, v_fb, case.offsets, max_len)
    their_grads = torch.autograd.grad(theirs, [q_fb, k_fb, v_fb], grad_out[:, 0])

    scaled = dataclasses.replace(case, q=case.q * math.sqrt(16))
    ours, our_grads = run_backend(scaled, backend, grad_out * (1.0 / max_len))
    assert relative_error(ours[:, 0] / max_len, theirs) < 1e-5
    # d/dq of ours(q * sqrt(D)) is sqrt(D) times the gradient we get w.r.t. the scaled q.
    our_dq = our_grads[0][:, 0] * math.sqrt(16)
    for mine, their in zip([our_dq, our_grads[1][:, 0], our_grads[2][:, 0]], their_grads):
        assert relative_error(mine, their) < 1e-5


def test_causal_softmax_matches_torch_sdpa_per_sequence(generator):
    case = make_case(generator, [5, 17, 1, 9], heads=4, dim=16, causal=True)
    ours, _ = reference(case)
    bounds = case.offsets.tolist()
    for b in range(len(bounds) - 1):
        rows = slice(bounds[b], bounds[b + 1])
        q, k, v = (x[rows].double().transpose(0, 1) for x in (case.q, case.k, case.v))
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1)
        assert relative_error(ours[rows], expected) < 1e-12


def test_truncation_keeps_the_most_recent_tokens(generator):
    """A 10-token sequence cut to 4 equals its last 4 tokens alone; the first 6 get 0."""
    case = make_case(generator, [10], heads=2, dim=8, max_seq_len=4, causal=True)
    out, _ = reference(case)
    tail = pytorch_jagged_attention(case.q[6:].double(), case.k[6:].double(), case.v[6:].double(),
                                    offsets_from_lengths(torch.tensor([4])), max_seq_len=4,
                                    causal=True)
    assert torch.equal(out[:6], torch.zeros_like(out[:6]))
    assert relative_error(out[6:], tail) < 1e-12


def test_targets_do_not_see_each_other_and_history_ignores_targets(generator):
    """Changing one target's key/value leaves the history and the other targets unchanged."""
    case = make_case(generator, [8], heads=1, dim=8, form="gdpa")
    case.num_targets = torch.tensor([3])
    before, _ = reference(case)
    case.k, case.v = case.k.clone(), case.v.clone()
    case.k[6] += 1.0
    case.v[6] += 1.0
    after, _ = reference(case)
    unchanged = [0, 1, 2, 3, 4, 5, 7]
    assert torch.equal(before[unchanged], after[unchanged])
    assert not torch.allclose(before[6], after[6])
