"""CPU benchmark: our jagged attention vs padded SDPA, nested-tensor SDPA and fbgemm.

    python -m kernels.benchmarks.jagged_attention_bench            # full run, ~2-3 min
    python -m kernels.benchmarks.jagged_attention_bench --quick    # smoke run, seconds

Workload: softmax attention, fp32, batch 256, 4 heads x 64, two length distributions:
"long-tailed" (log-normal, mean ~80, one sequence of 1024, >90% padding against the batch
max) and "mild" (mean ~80, max 160, ~50% padding). Each method runs forward (no_grad) and
forward+backward (grads of q, k, v). Speedups are baseline time / our time, from the best
of several runs (how: measure.py). peak_mem_ratio_vs_padded = our peak RSS growth in
forward+backward / padded SDPA's. Nested SDPA is timed on 1/8 of the batch and scaled
(see NESTED_BATCH_DIVISOR). The 1-minute load average before and after each
distribution is recorded: other processes on the cores inflate every time; *_cpu
figures (process CPU time of forward+backward) are less sensitive to them.
Results: benchmarks/results/kernels.json.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Callable

import torch

from gem.utils.bench import print_table, write_result
from kernels import jagged_attention
from kernels.benchmarks.attention_baselines import fbgemm_sll_per_head, nested_sdpa, padded_sdpa
from kernels.benchmarks.measure import peak_rss_growth_mb, time_best
from kernels.jagged_inputs import (
    long_tailed_lengths,
    offsets_from_lengths,
    padding_fraction,
    random_qkv,
)

Tensor = torch.Tensor
HEADS, HEAD_DIM = 4, 64


def ours(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int) -> Tensor:
    return jagged_attention(q, k, v, offsets, max_seq_len=max_len)


def ours_gdpa_causal(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int) -> Tensor:
    """The HSTU-style form the model uses; no baseline computes it (timing only)."""
    return jagged_attention(q, k, v, offsets, max_seq_len=max_len, form="gdpa", causal=True)


@dataclass(frozen=True)
class Method:
    name: str
    fn: Callable[..., Tensor]
    reps: int
    warmup: int
    measure_memory: bool = True
    batch_divisor: int = 1  # run on the first B / divisor sequences, time scaled back up


# Nested-tensor SDPA takes minutes for the whole long-tailed batch on 2 cores (its CPU
# path loops over sequences in unfused math). It runs on the first 1/8 of the batch
# (which includes the longest sequence), and its time is multiplied by 8: an estimate,
# linear in the number of sequences, marked as such in the results.
NESTED_BATCH_DIVISOR = 8


def methods(slow_reps: int, smoke: bool = False) -> list[Method]:
    """The compared methods; smoke=True times each once without warm-up (for tests)."""
    if smoke:
        return [Method(m.name, m.fn, 1, 0, m.measure_memory, m.batch_divisor)
                for m in methods(slow_reps)]
    return [
        Method("ours", ours, reps=5, warmup=1),
        Method("ours_gdpa_causal", ours_gdpa_causal, reps=3, warmup=1, measure_memory=False),
        Method("fbgemm_sll", fbgemm_sll_per_head, reps=2, warmup=0),
        Method("padded_sdpa", padded_sdpa, reps=slow_reps, warmup=0),
        Method("nested", nested_sdpa, reps=1, warmup=0, measure_memory=False,
               batch_divisor=NESTED_BATCH_DIVISOR),
    ]


def run_distribution(lengths: Tensor, slow_reps: int, seed: int,
                     smoke: bool = False) -> dict[str, float]:
    """Times (ms), peak memory (MiB), speedups and a correctness check for one batch."""
    generator = torch.Generator().manual_seed(seed)
    offsets = offsets_from_lengths(lengths)
    max_len = int(lengths.max())
    q, k, v = random_qkv(int(offsets[-1]), HEADS, HEAD_DIM, torch.float32, generator)
    grad_out = torch.randn(q.shape, generator=generator)
    leaves = [x.clone() for x in (q, k, v)]
    figures: dict[str, float] = {
        "padding_fraction": padding_fraction(lengths),
        "mean_length": float(lengths.float().mean()),
        "max_length": max_len,
        "tokens": int(offsets[-1]),
        "load_average_1min_before": os.getloadavg()[0],
    }
    outputs = {}
    for method in methods(slow_reps, smoke):
        batch = (offsets.shape[0] - 1) // method.batch_divisor
        sub_offsets = offsets[:batch + 1]
        num_tokens = int(sub_offsets[-1])
        sub_q, sub_k, sub_v = q[:num_tokens], k[:num_tokens], v[:num_tokens]
        sub_leaves = [leaf[:num_tokens].detach().requires_grad_() for leaf in leaves]

        def forward(m=method):
            with torch.no_grad():
                outputs[m.name] = m.fn(sub_q, sub_k, sub_v, sub_offsets, max_len)

        def forward_backward(m=method):
            for leaf in sub_leaves:
                leaf.grad = None
            m.fn(*sub_leaves, sub_offsets, max_len).backward(grad_out[:num_tokens])

        fwd = time_best(forward, method.reps, method.warmup)
        fwd_bwd = time_best(forward_backward, method.reps, method.warmup, method.measure_memory)
        scale = 1e3 * method.batch_divisor
        figures[f"{method.name}_fwd_ms"] = scale * fwd["best_s"]
        figures[f"{method.name}_fwd_bwd_ms"] = scale * fwd_bwd["best_s"]
        figures[f"{method.name}_fwd_bwd_median_ms"] = scale * fwd_bwd["median_s"]
        figures[f"{method.name}_fwd_bwd_cpu_ms"] = scale * fwd_bwd["best_cpu_s"]
        if method.measure_memory:
            figures[f"{method.name}_peak_mem_mb"] = fwd_bwd["peak_mb"]
        if method.batch_divisor > 1:
            figures[f"{method.name}_timed_on_sequences"] = batch
        print(f"  {method.name:<12} fwd {figures[f'{method.name}_fwd_ms']:9.1f} ms   "
              f"fwd+bwd {figures[f'{method.name}_fwd_bwd_ms']:9.1f} ms", flush=True)
    for base in ("padded_sdpa", "fbgemm_sll", "nested"):
        for phase in ("fwd", "fwd_bwd", "fwd_bwd_cpu"):
            figures[f"speedup_vs_{base}_{phase}"] = figures[f"{base}_{phase}_ms"] / figures[f"ours_{phase}_ms"]
    figures["load_average_1min_after"] = os.getloadavg()[0]
    ours_mem, padded_mem = figures.get("ours_peak_mem_mb"), figures.get("padded_sdpa_peak_mem_mb")
    if ours_mem is not None and padded_mem:
        figures["peak_mem_ratio_vs_padded"] = ours_mem / padded_mem
    ours_out = outputs["ours"]
    figures["max_rel_err_vs_baselines"] = max(
        float((ours_out[:len(outputs[name])] - outputs[name]).norm() / outputs[name].norm())
        for name in ("padded_sdpa", "fbgemm_sll", "nested"))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes; does not write results")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch, long_max, mild_max, slow_reps = (16, 128, 64, 1) if args.quick else (256, 1024, 160, 1)
    generator = torch.Generator().manual_seed(0)
    distributions = {
        "long_tailed": long_tailed_lengths(batch, 80.0, long_max, 1.0, generator),
        "mild": long_tailed_lengths(batch, 80.0, mild_max, 0.35, generator),
    }
    results = {}
    for name, lengths in distributions.items():
        print(f"\n{name}: batch {batch}, mean {float(lengths.float().mean()):.1f}, "
              f"max {int(lengths.max())}, padding {padding_fraction(lengths):.1%}", flush=True)
        results[name] = run_distribution(lengths, slow_reps, seed=1)
        print_table(f"jagged attention, {name}", sorted(results[name].items()))
    figures = dict(results["long_tailed"])
    figures["mild"] = results["mild"]
    sizes = {"batch": batch, "heads": HEADS, "head_dim": HEAD_DIM, "dtype": "float32",
             "form": "softmax", "long_tailed": {"mean": 80, "max": long_max, "sigma": 1.0},
             "mild": {"mean": 80, "max": mild_max, "sigma": 0.35},
             "timing": "best of N runs (ours 5, fbgemm 2, padded 1, nested 1 on 1/8 of the "
                       "batch, scaled x8)",
             "memory": "peak RSS growth during one fwd+bwd (VmHWM reset), MiB"}
    if not args.quick:
        print("wrote", write_result("kernels", figures, sizes=sizes))


if __name__ == "__main__":
    main()
