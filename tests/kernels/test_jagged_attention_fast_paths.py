"""The bucketed backend's fused CPU paths against the float64 reference.

Softmax without bias or dropout (Dv == D) runs torch's fused flash kernels (here for every
sequence: the AVX2 kernel that takes non-causal ones by default is switched off): sequences of
at least planning.FUSED_SOLO_MIN tokens run "solo" (read in place as views, no padding),
shorter ones in padded chunks. The benchmark's lengths are too long for unit tests, so
the threshold is lowered here; every case mixes solo and chunked sequences (lengths 0
and 1 included) unless it says otherwise.
"""

import pytest
import torch
from jagged_attention_cases import assert_close_to_reference, make_case, run_backend

import kernels.bucketed.bucketed_jagged_attention as bucketed_module
import kernels.bucketed.planning as planning
from kernels.attention_spec import Spec, history_lengths, kept_spans

FP32_TOLERANCE = 2e-5
BF16_TOLERANCE = 1e-2
MIXED_LENGTHS = [0, 1, 40, 3, 0, 17, 9, 1, 12, 5]  # solo from 9 tokens: 40, 17, 9, 12


@pytest.fixture(autouse=True)
def flash_only(monkeypatch):
    """These tests are about torch's flash kernels: keep the AVX2 kernel (its own tests:
    test_jagged_attention_avx2.py) from taking the non-causal sequences."""
    monkeypatch.setattr(bucketed_module, "NATIVE", False)


@pytest.fixture
def solo_from_9(monkeypatch):
    monkeypatch.setattr(planning, "FUSED_SOLO_MIN", 9)


def _plan(case, solo_min):
    starts, lengths = kept_spans(case.offsets, case.options["max_seq_len"])
    history = history_lengths(lengths, case.num_targets)
    return planning.plan_chunks(starts, lengths, history, case.q.shape[0], case.q.shape[1],
                                solo_min=solo_min, overhead=planning.FUSED_CHUNK_OVERHEAD_SCORES)


def test_plan_covers_every_sequence_once_with_solo_chunks(generator):
    case = make_case(generator, MIXED_LENGTHS, max_seq_len=30)
    chunks = _plan(case, 9)
    solo = sorted((c.sequences[0], c.size, c.start) for c in chunks if c.solo)
    offsets = case.offsets.tolist()
    # sequence 2 keeps its last 30 of 40 tokens
    assert solo == [(2, 30, offsets[2] + 10), (5, 17, offsets[5]), (6, 9, offsets[6]),
                    (8, 12, offsets[8])]
    batched = sorted(b for c in chunks if not c.solo for b in c.sequences)
    assert batched == [1, 3, 7, 9]  # empty sequences 0 and 4 are in no chunk
    for chunk in chunks:
        if not chunk.solo:
            assert chunk.kept == tuple(chunk.lengths.tolist())
            assert all(n <= chunk.size for n in chunk.kept)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("options", [dict(), dict(with_targets=True), dict(max_attn_len=3),
                                     dict(contextual_len=2, with_targets=True),
                                     dict(max_seq_len=11), dict(scale=0.3)],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_solo_and_batched_chunks_match_reference(generator, solo_from_9, causal, options):
    case = make_case(generator, MIXED_LENGTHS, heads=2, dim=16, causal=causal, **options)
    assert bucketed_module.uses_fused_softmax(Spec(8), None, case.q, case.v)
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)


@pytest.mark.parametrize("solo_min", [1, 10_000])
def test_all_solo_and_none_solo(generator, monkeypatch, solo_min):
    monkeypatch.setattr(planning, "FUSED_SOLO_MIN", solo_min)
    case = make_case(generator, MIXED_LENGTHS, heads=3, dim=16)
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)


def test_one_long_sequence_among_short_ones(generator, solo_from_9):
    lengths = [3, 1, 0, 300, 2, 5, 1, 7, 4]
    case = make_case(generator, lengths, heads=2, dim=16)
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)


def test_solo_in_bf16_computes_in_float32(generator, solo_from_9):
    case = make_case(generator, MIXED_LENGTHS, heads=2, dim=16, dtype=torch.bfloat16, causal=True)
    assert_close_to_reference(case, "bucketed", BF16_TOLERANCE, generator)


def test_single_solo_sequence_and_truncated_tokens_get_zero(generator, solo_from_9):
    case = make_case(generator, [25], heads=2, dim=16, max_seq_len=10)
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)
    out, grads = run_backend(case, "bucketed", torch.ones(25, 2, 16))
    assert out[:15].abs().max() == 0 and all(g[:15].abs().max() == 0 for g in grads)


@pytest.mark.parametrize("poisoned", ["q", "k", "v", "grad"])
@pytest.mark.parametrize("token", [0, 4])  # a batched sequence (1 token), a solo one (40)
def test_non_finite_token_stays_in_its_sequence(generator, solo_from_9, poisoned, token):
    case = make_case(generator, [1, 3, 40, 2, 12, 1], heads=2, dim=16)
    grad_out = torch.randn(case.q.shape[0], 2, 16, generator=generator)
    target = grad_out if poisoned == "grad" else getattr(case, poisoned)
    target[token] = float("nan")
    out, grads = run_backend(case, "bucketed", grad_out)
    offsets = case.offsets.tolist()
    seq = max(b for b in range(len(offsets) - 1) if offsets[b] <= token)
    others = torch.ones(case.q.shape[0], dtype=torch.bool)
    others[offsets[seq]:offsets[seq + 1]] = False
    assert torch.isfinite(out[others]).all()
    for grad in grads:
        assert torch.isfinite(grad[others]).all()


def test_chunks_hold_at_most_max_chunk_rows(generator, monkeypatch):
    """Many short sequences of one size are cut into chunks of <= MAX_CHUNK_ROWS rows."""
    monkeypatch.setattr(planning, "MAX_CHUNK_ROWS", 64)
    case = make_case(generator, [7] * 40 + [3] * 5, heads=2, dim=16)
    chunks = _plan(case, None)
    assert all(len(c.kept) * c.size <= 64 for c in chunks)
    assert sorted(b for c in chunks for b in c.sequences) == list(range(45))
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)


# The bmm path (gdpa, bias, dropout, Dv != D) splits causal scores into query blocks that
# read only the keys up to their last row; blocks of 8 rows exercise it on small sizes.
BLOCKED_OPTIONS = [
    dict(form="gdpa"), dict(form="gdpa", bias_radius=3, with_targets=True),
    dict(form="softmax", bias_radius=2), dict(form="gdpa", dropout_p=0.3, dropout_seed=11),
    dict(form="gdpa", max_attn_len=4, with_targets=True), dict(form="gdpa", value_dim=24),
    dict(form="softmax", value_dim=8, with_targets=True),
    dict(form="gdpa", contextual_len=3),  # contextual rows see later keys: one block
]


@pytest.mark.parametrize("options", BLOCKED_OPTIONS,
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_causal_query_blocks_match_reference(generator, monkeypatch, options):
    monkeypatch.setattr(bucketed_module, "CAUSAL_QUERY_BLOCK", 8)
    case = make_case(generator, [0, 1, 40, 3, 17, 26, 9], heads=2, dim=16, causal=True, **options)
    spec = Spec(40, causal=True, contextual_len=options.get("contextual_len", 0))
    pb = bucketed_module._Problem(case.q, case.offsets, None, None, spec)
    blocks = {chunk.size: len(pb.query_blocks(chunk)) for chunk in pb.chunks}
    assert blocks[40] == (1 if "contextual_len" in options else 5)
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)
