"""The CPU benchmark's measurement code on a tiny batch (the real run is `python -m
kernels.benchmarks.jagged_attention_bench`)."""

import torch

from kernels.benchmarks.jagged_attention_bench import run_distribution


def test_benchmark_runs_and_every_method_agrees():
    lengths = torch.tensor([12, 3, 5, 1, 2, 6, 4, 7, 9, 2, 3, 1, 8, 5, 4, 6])
    figures = run_distribution(lengths, slow_reps=1, seed=0, smoke=True)
    assert figures["max_rel_err_vs_baselines"] < 1e-4
    for key in ("speedup_vs_padded_sdpa_fwd_bwd", "speedup_vs_fbgemm_sll_fwd_bwd",
                "speedup_vs_nested_fwd_bwd", "speedup_vs_padded_sdpa_fwd"):
        assert figures[key] > 0
    assert figures["nested_timed_on_sequences"] == 2
    assert 0.5 < figures["padding_fraction"] < 0.7
