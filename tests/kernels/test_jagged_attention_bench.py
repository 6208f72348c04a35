"""The CPU benchmark on a tiny configuration (the real run is `python -m
kernels.benchmarks.jagged_attention_bench`)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from kernels.benchmarks.jagged_attention_bench import (
    METHODS,
    dense_flash_bins,
    length_bins,
    run_batch,
    useful_flops,
)
from kernels.benchmarks.results import cpu_description


def test_every_method_agrees_with_its_baseline():
    lengths = torch.tensor([12, 3, 5, 1, 2, 6, 4, 7, 9, 2, 3, 1, 8, 5, 4, 6])
    figures = run_batch(lengths, list(METHODS), reps=1, warmup=0)
    for key in ("rel_err_ours_vs_padded_sdpa", "rel_err_ours_vs_fbgemm_sll",
                "rel_err_ours_vs_nested", "rel_err_ours_vs_ours_flash",
                "rel_err_ours_gdpa_causal_vs_padded_gdpa_causal"):
        assert figures[key] < 1e-4, key
    for name in METHODS:
        assert figures[f"{name}_fwd_bwd_ms"] > 0 and figures[f"{name}_useful_gflops"] > 0
    assert 0.5 < figures["padding_fraction"] < 0.7


def test_command_line_writes_results_with_machine(tmp_path):
    """`python -m`-style run on a 16-sequence batch standing in for "default"."""
    code = ("import kernels.benchmarks.jagged_attention_bench as b; "
            "b.BATCHES['default'] = b.QUICK_BATCH; "
            "b.BATCHES['long'] = b.QUICK_BATCH; b.PEAK_MATMUL_SIZE = 256; "
            "b.main(['--threads', '1,2', '--warmup', '0', '--name', 'tiny', '--wait-load', '1000'])")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                   env={**os.environ, "GEM_BENCH_RESULTS": str(tmp_path)})
    payload = json.loads((tmp_path / "tiny.json").read_text())
    # default: the default and long batches (both standing in here), each per thread count
    assert {"default_threads_1", "default_threads_2", "long_threads_1", "long_threads_2"} <= set(payload)
    for key in ("default_threads_1", "long_threads_2"):
        figures = payload[key]
        assert figures["ours_fwd_bwd_ms"] > 0 and figures["ours_fwd_bwd_cpu_ms"] > 0
        assert figures["matmul_peak_gflops"] == max(figures["matmul_peak_gflops_before"],
                                                    figures["matmul_peak_gflops_after"],
                                                    figures["matmul_peak_gflops_rounds"])
        assert figures["ours_fraction_of_peak"] > 0 and figures["ours_fraction_of_peak_cpu"] > 0
        assert figures["speedup_ours_vs_padded_sdpa_fwd_bwd"] > 0
        assert figures["speedup_ours_vs_fbgemm_sll_fwd_bwd"] > 0
        assert figures["speedup_ours_vs_ours_flash_fwd_bwd"] > 0
        assert figures["load_average_1min_before"] >= 0 and figures["load_average_1min_after"] >= 0
        assert figures["reps"] == 1
        assert figures["dense_flash_fwd_bwd_ms"] > 0
        assert figures["dense_flash_fraction_of_peak"] > 0
        assert figures["ours_time_vs_dense_flash"] == (
            figures["ours_fwd_bwd_ms"] / figures["dense_flash_fwd_bwd_ms"])
    assert payload["machine"]["isa"] == cpu_description()["isa"]
    assert payload["sizes"]["threads"] == [1, 2]


def test_benchmark_module_imports_nothing_from_gem():
    code = ("import sys, kernels.benchmarks.jagged_attention_bench, kernels.benchmarks.jagged_attention_gpu; "
            "sys.exit(any(m == 'gem' or m.startswith('gem.') for m in sys.modules))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_keep_freed_cpu_memory_lets_freed_pages_be_reused():
    """Opt-in glibc tuning (in a subprocess: it is process-wide): once the heap has grown
    to a step's peak, allocating and freeing 4 x 20 MiB again faults no pages in."""
    code = ("import resource; from kernels.common import keep_freed_cpu_memory\n"
            "assert keep_freed_cpu_memory()\n"
            "import torch\n"
            "faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "def step():\n"
            "    before = faults(); x = [torch.ones(5 << 20) for _ in range(4)]; del x\n"
            "    return faults() - before\n"
            "first = step(); assert first > 15_000, first\n"
            "steady = [step() for _ in range(8)][-3:]; assert max(steady) < 1_000, steady")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_length_bins_keep_each_power_of_two_bins_score_work():
    lengths = torch.tensor([1, 2, 3, 5, 7, 100, 120, 0, 1024])
    bins = length_bins(lengths)
    assert [count for count, _ in bins] == [1, 2, 2, 2, 1]  # [1], [2, 3], [4, 8), [64, 128), [1024]
    assert bins[-1] == (1, 1024) and bins[3] == (2, 110)  # sqrt((100^2 + 120^2) / 2) = 110.5
    exact = float((lengths.double() ** 2).sum())
    assert abs(sum(c * n * n for c, n in bins) - exact) / exact < 1e-3


def test_dense_flash_bins_times_every_bin():
    lengths = torch.tensor([12, 3, 5, 1, 2, 6, 40])
    figures = dense_flash_bins(lengths, reps=1, warmup=0)
    assert figures["dense_flash_fwd_bwd_ms"] > 0
    assert figures["dense_flash_useful_gflops"] == pytest.approx(
        useful_flops(lengths, causal=False) / figures["dense_flash_fwd_bwd_ms"] * 1e3 / 1e9)


def test_methods_are_timed_in_interleaved_rounds(monkeypatch):
    """Round r times every method before round r + 1 starts (drift reaches all alike)."""
    import kernels.benchmarks.jagged_attention_bench as bench

    calls = []

    def traced(name, fn):
        def run(*args):
            calls.append(name)
            return fn(*args)
        return run

    methods = {name: bench.Method(name, traced(name, bench.METHODS[name].fn))
               for name in ("ours", "ours_flash")}
    monkeypatch.setattr(bench, "METHODS", methods)
    monkeypatch.setattr(bench, "PEAK_MATMUL_SIZE", 64)
    figures = run_batch(torch.tensor([5, 3, 9]), list(methods), reps=3, warmup=1)
    timed = calls[-12:]  # 3 rounds x 2 methods x (forward, forward+backward)
    assert timed == ["ours", "ours", "ours_flash", "ours_flash"] * 3
    assert figures["matmul_peak_gflops_rounds"] > 0


def test_median_interval_takes_the_order_statistics_that_cover_95_percent():
    from kernels.benchmarks.measure import median_interval

    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, None, None)  # 5: at most 94%
    assert median_interval([6.0, 1.0, 3.0, 2.0, 5.0, 4.0]) == (3.5, 1.0, 6.0)  # 96.9%
    assert median_interval(list(range(1, 10))) == (5, 2, 8)  # 1 - 2 * 10/512 = 96.1%
    assert median_interval(list(range(1, 13))) == (6.5, 3, 10)  # 1 - 2 * 79/4096 = 96.1%


def test_paired_figures_compare_calls_of_the_same_round(monkeypatch):
    """The machine's speed alternates between rounds (x1, x4): a baseline twice as slow
    as ours in every round gets a paired speedup of 2 with an interval around it."""
    import itertools
    import time

    import kernels.benchmarks.jagged_attention_bench as bench

    slowdown = itertools.cycle([1, 4])

    def method(seconds, opens_round=False):
        def fn(q, k, v, offsets, max_len):
            if opens_round and not torch.is_grad_enabled():  # ours' forward opens a round
                method.factor = next(slowdown)
            time.sleep(seconds * method.factor)
            return q * 1.0 + k * 0.0 + v * 0.0
        return fn

    method.factor = 1
    monkeypatch.setattr(bench, "METHODS", {"ours": bench.Method("ours", method(0.01, opens_round=True)),
                                           "base": bench.Method("base", method(0.02))})
    monkeypatch.setattr(bench, "PAIRS", (("ours", "base"),))
    monkeypatch.setattr(bench, "PEAK_MATMUL_SIZE", 64)
    figures = run_batch(torch.tensor([5, 3, 9]), ["ours", "base"], reps=9, warmup=1)
    speedup = figures["paired_speedup_ours_vs_base_fwd_bwd"]
    # (a pytest-xdist neighbour on the other core can stretch a call: bounds with margin)
    assert 1.7 < speedup < 2.3
    assert 1.0 < figures["paired_speedup_ours_vs_base_fwd_bwd_lo"] <= speedup
    assert speedup <= figures["paired_speedup_ours_vs_base_fwd_bwd_hi"] < 4.0
    assert figures["paired_ours_fraction_of_peak"] > 0
    assert figures["paired_ours_fraction_of_peak_lo"] <= figures["paired_ours_fraction_of_peak"]
    few = run_batch(torch.tensor([5, 3, 9]), ["ours", "base"], reps=3, warmup=0)
    assert "paired_speedup_ours_vs_base_fwd_bwd" in few
    assert "paired_speedup_ours_vs_base_fwd_bwd_lo" not in few


def test_uniform_batches_hold_sequences_of_one_length():
    from kernels.benchmarks.jagged_attention_bench import batch_shape, main
    from kernels.jagged_inputs import long_tailed_lengths

    shape = batch_shape("uniform48")
    lengths = long_tailed_lengths(shape.batch, shape.mean, shape.max_len, shape.sigma,
                                  torch.Generator().manual_seed(0))
    assert lengths.unique().tolist() == [48] and shape.batch == 2_000_000 // 48**2
    assert batch_shape("uniform4096").batch == 1
    assert batch_shape("uniform") is None and batch_shape("uniform0") is None
    with pytest.raises(SystemExit):
        main(["--batch", "uniformx"])
