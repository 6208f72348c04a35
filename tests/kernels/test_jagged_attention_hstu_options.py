"""HSTU's options: attention scale (alpha), max attention length, contextual tokens, dropout;
and the Triton launch grid for large batches."""

import pytest
import torch
from jagged_attention_cases import assert_close_to_reference, make_case, run_backend

from kernels import jagged_attention
from kernels.attention_spec import allowed_mask, dropout_keep

FP32_TOLERANCE = 2e-5


def hstu_valid_mask(length: int, causal: bool, num_targets: int, max_attn_len: int,
                    contextual_len: int) -> torch.Tensor:
    """generative-recommenders' _get_valid_attn_mask for one sequence, transcribed."""
    ids = torch.arange(length).view(1, length)
    max_ids = torch.tensor(length).view(1, 1)
    if contextual_len > 0:
        ids = torch.clamp(ids - contextual_len + 1, min=0)
        max_ids = max_ids - contextual_len + 1
    max_ids = max_ids - num_targets
    ids = torch.minimum(ids, max_ids)
    row_ids, col_ids = ids.view(length, 1).expand(length, length), ids.view(1, length).expand(length, length)
    dist = row_ids - col_ids
    if not causal:
        dist = dist.abs()
    valid = torch.eye(length, dtype=torch.bool) | (dist > 0)
    if max_attn_len > 0:
        valid &= dist <= max_attn_len
    if contextual_len > 0:
        valid |= (row_ids == 0) & (col_ids < max_ids)
    return valid


@pytest.mark.parametrize("targets", [0, 2])
@pytest.mark.parametrize("window", [0, 1, 3])
@pytest.mark.parametrize("context", [0, 1, 3])
def test_causal_mask_equals_hstu_reference(targets, window, context):
    length = 11
    ours = allowed_mask(torch.tensor([length]), torch.tensor([length - targets]), length,
                        True, window, context)[0]
    assert torch.equal(ours, hstu_valid_mask(length, True, targets, window, context))


def test_non_causal_differs_from_hstu_only_where_history_would_see_targets():
    length, targets = 9, 3
    ours = allowed_mask(torch.tensor([length]), torch.tensor([length - targets]), length,
                        False, 2, 2)[0]
    theirs = hstu_valid_mask(length, False, targets, 2, 2)
    history_to_target = torch.zeros(length, length, dtype=torch.bool)
    history_to_target[:length - targets, length - targets:] = True
    assert torch.equal(ours, theirs & ~history_to_target)


OPTIONS = [
    dict(scale=0.37), dict(max_attn_len=3), dict(contextual_len=2),
    dict(max_attn_len=2, contextual_len=3, with_targets=True, bias_radius=2),
    dict(dropout_p=0.3, dropout_seed=1234), dict(dropout_p=0.5, dropout_seed=7, bias_radius=3),
]


@pytest.mark.parametrize("form", ["softmax", "gdpa"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_bucketed_matches_reference_with_hstu_options(generator, form, causal, options):
    case = make_case(generator, [5, 0, 1, 19, 8, 2], heads=2, dim=16, max_seq_len=16, form=form,
                     causal=causal, **options)
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)


def test_scale_changes_only_the_score_scale(generator):
    case = make_case(generator, [6, 4], heads=2, dim=16)
    default, _ = run_backend(case, "bucketed")
    explicit = jagged_attention(case.q, case.k, case.v, case.offsets, max_seq_len=6,
                                scale=0.25)
    assert torch.allclose(default, explicit, atol=1e-6)


def test_dropout_keeps_about_one_minus_p_and_is_seeded(generator):
    tokens = torch.arange(4000).view(4, 1000)
    keep = dropout_keep(99, 0.25, torch.arange(2), tokens, tokens)
    assert abs(keep.float().mean().item() - 0.75) < 0.005
    case = make_case(generator, [12, 7], heads=2, dim=16)
    run = lambda seed: jagged_attention(case.q, case.k, case.v, case.offsets, max_seq_len=12,  # noqa: E731
                                        dropout_p=0.4, dropout_seed=seed)
    assert torch.equal(run(5), run(5)) and not torch.equal(run(5), run(6))
    torch.manual_seed(0)
    first = jagged_attention(case.q, case.k, case.v, case.offsets, max_seq_len=12, dropout_p=0.4)
    torch.manual_seed(0)
    again = jagged_attention(case.q, case.k, case.v, case.offsets, max_seq_len=12, dropout_p=0.4)
    assert torch.equal(first, again)


@pytest.mark.parametrize("options", [dict(max_attn_len=2), dict(contextual_len=1),
                                     dict(dropout_p=0.1)])
def test_triton_refuses_options_it_lacks(generator, options):
    pytest.importorskip("triton")
    case = make_case(generator, [4, 3], heads=2, dim=16)
    with pytest.raises(NotImplementedError, match="triton backend does not implement"):
        jagged_attention(case.q, case.k, case.v, case.offsets, max_seq_len=4, backend="triton",
                         **options)


def test_triton_takes_a_custom_scale(generator):
    pytest.importorskip("triton")
    case = make_case(generator, [5, 3], heads=2, dim=16, scale=0.5, causal=True)
    assert_close_to_reference(case, "triton", FP32_TOLERANCE, generator)


def test_triton_grid_puts_batch_times_heads_on_axis_0():
    pytest.importorskip("triton")
    from kernels.triton.triton_jagged_attention import launch_grid

    assert launch_grid(70_000, 4, 1000, 64) == (280_000, 16)  # B*H > 65,535 launches
    assert launch_grid(3, 2, 17, 16) == (6, 2)
    with pytest.raises(ValueError, match="exceeds CUDA's limits"):
        launch_grid(1, 1, 65_536 * 16 + 1, 16)
