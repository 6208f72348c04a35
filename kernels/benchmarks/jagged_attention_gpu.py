"""GPU benchmark (one NVIDIA GPU, bf16): Triton jagged attention vs padded flash SDPA.

    python -m kernels.benchmarks.jagged_attention_gpu            # exits 0 without CUDA

Not named *_bench.py on purpose: `python -m benchmarks` runs CPU benchmarks only.
For max lengths 1k-8k, lengths are log-normal with ~10% of the batch max on average
(~90% sparsity). Both methods run forward+backward on the same inputs; the padded
baseline is torch SDPA forced to the flash kernel on tensors padded to the batch max,
without a mask (flash takes none): the cheapest padded computation, an upper bound on
what padding can do. FLOPs count useful work only, as in the FlashAttention papers:
forward 4 * L^2 * D per sequence and head, backward 2.5x forward. The bf16 peak is a
measured 8192^3 torch.matmul. Results: benchmarks/results/kernels_gpu.json.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from kernels import jagged_attention
from kernels.benchmarks.results import print_table, write_result
from kernels.jagged_inputs import long_tailed_lengths, offsets_from_lengths, padding_fraction

BATCH, HEADS, HEAD_DIM = 32, 4, 128
MAX_LENGTHS = (1024, 2048, 4096, 8192)


def _bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100))


def matmul_peak_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192**3 / (_bench_ms(lambda: a @ b) * 1e-3) / 1e12


def run_length(max_len: int, generator: torch.Generator, peak: float) -> dict[str, float]:
    lengths = long_tailed_lengths(BATCH, 0.1 * max_len, max_len, 1.0, generator)
    offsets = offsets_from_lengths(lengths).cuda()
    num_tokens = int(lengths.sum())
    q, k, v = (torch.randn(num_tokens, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    grad_out = torch.randn_like(q)
    padded = [torch.randn(BATCH, HEADS, max_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                          requires_grad=True) for _ in range(3)]
    padded_grad = torch.randn_like(padded[0])

    def ours() -> None:
        jagged_attention(q, k, v, offsets, max_seq_len=max_len, backend="triton").backward(grad_out)

    def padded_flash() -> None:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(*padded).backward(padded_grad)

    useful_flops = 3.5 * 4 * float((lengths.double() ** 2).sum()) * HEADS * HEAD_DIM
    figures = {"padding_fraction": padding_fraction(lengths), "tokens": num_tokens}
    for name, fn in (("triton", ours), ("padded_flash", padded_flash)):
        torch.cuda.reset_peak_memory_stats()
        ms = _bench_ms(fn)
        figures[f"{name}_fwd_bwd_ms"] = ms
        figures[f"{name}_useful_tflops"] = useful_flops / (ms * 1e-3) / 1e12
        figures[f"{name}_fraction_of_matmul_peak"] = figures[f"{name}_useful_tflops"] / peak
        figures[f"{name}_peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
    figures["speedup_vs_padded_flash_fwd_bwd"] = (
        figures["padded_flash_fwd_bwd_ms"] / figures["triton_fwd_bwd_ms"])
    return figures


def check_against_bucketed(generator: torch.Generator) -> float:
    """Relative error of the Triton output vs the bucketed path (bf16, max length 1024)."""
    lengths = long_tailed_lengths(8, 100, 1024, 1.0, generator)
    offsets = offsets_from_lengths(lengths).cuda()
    q, k, v = (torch.randn(int(lengths.sum()), HEADS, HEAD_DIM, device="cuda",
                           dtype=torch.bfloat16) for _ in range(3))
    out = jagged_attention(q, k, v, offsets, max_seq_len=1024, backend="triton").float()
    ref = jagged_attention(q, k, v, offsets, max_seq_len=1024, backend="bucketed").float()
    return float((out - ref).norm() / ref.norm())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-lengths", type=int, nargs="*", default=list(MAX_LENGTHS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("jagged_attention_gpu: no CUDA device; skipped")
        return 0
    generator = torch.Generator().manual_seed(0)
    peak = matmul_peak_tflops()
    figures: dict = {"bf16_matmul_peak_tflops": peak,
                     "max_rel_err_triton_vs_bucketed": check_against_bucketed(generator)}
    for max_len in args.max_lengths:
        figures[f"max_len_{max_len}"] = run_length(max_len, generator, peak)
        print_table(f"max length {max_len}", ["figure", "value"],
                    [list(kv) for kv in sorted(figures[f"max_len_{max_len}"].items())])
    sizes = {"batch": BATCH, "heads": HEADS, "head_dim": HEAD_DIM, "dtype": "bfloat16",
             "lengths": "log-normal, mean ~10% of max (sigma 1), one sequence at max"}
    print("wrote", write_result("kernels_gpu", figures, sizes=sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
