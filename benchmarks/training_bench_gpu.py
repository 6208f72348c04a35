"""GPU training benchmark (H200-class, bf16): throughput and MFU of the base and large
presets. Not auto-run (the name doesn't end in _bench.py); run it on a GPU host:

    python -m benchmarks.training_bench_gpu [--presets base large] [--steps 60]

Each preset trains in its own process (clean startup time and memory) on synthetic
batches with 1M-row user/item tables and histories of up to 512 events, through the
same loop as production runs (DMP world of one, fused row-wise Adagrad, fused AdamW,
bf16 autocast, torch.compile of the dense blocks, kernels' Triton attention).
Writes benchmarks/results/training_gpu.json with one entry per preset.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from benchmarks.results import print_table, write_result

SYNTHETIC = "synthetic://{n}?rows=1000000&max_seq_len=512&mean_len=192"


def run_one(preset: str, steps: int, batch_size: int, extra: tuple[str, ...] = ()) -> dict:
    import tempfile

    import torch

    from gem.training.config import load_train_config
    from gem.training.trainer import train

    overrides = ["checkpoint_every=0", "log_model=false", "system_metrics=false", "log_every=20",
                 f"max_steps={steps}", "precision=bf16", "compile=true"]
    if batch_size:
        overrides.append(f"batch_size={batch_size}")
    overrides.extend(extra)  # after the defaults above: a CPU smoke test turns compile off
    cfg, model_cfg = load_train_config(preset, overrides)
    with tempfile.TemporaryDirectory() as out:
        result = train(SYNTHETIC.format(n=cfg.batch_size * (steps + 1)), out, cfg, model_cfg)
    perf = result.perf
    return {
        "mfu": perf["perf/mfu"], "peak_flops": perf["perf/peak_flops"],
        "examples_per_s": perf["perf/examples_per_s"], "model_flops_per_s": perf["perf/model_flops_per_s"],
        "train_flops_per_example": perf["perf/train_flops_per_example"],
        "startup_seconds": perf["perf/startup_seconds"],
        "effective_training_time": perf["perf/effective_training_time"],
        "batch_size": cfg.batch_size, "steps": result.steps,
        "max_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["base", "large"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=0, help="0: the preset's")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)  # child mode: run one preset
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args.steps, args.batch_size)), flush=True)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("training_bench_gpu: no CUDA device; nothing to measure", file=sys.stderr)
        return 2
    figures: dict[str, dict] = {}
    for preset in args.presets:
        cmd = [sys.executable, "-m", "benchmarks.training_bench_gpu", "--one", preset,
               "--steps", str(args.steps), "--batch-size", str(args.batch_size)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            figures[preset] = {"error": proc.stderr[-2000:]}
            continue
        figures[preset] = json.loads(lines[-1][len("RESULT "):])
        print_table(f"training {preset} (bf16, GPU)", list(figures[preset].items()))
    write_result("training_gpu", figures, {"steps": args.steps, "data": SYNTHETIC.format(n="N")})
    return 0 if all("error" not in f for f in figures.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
