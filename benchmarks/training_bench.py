"""Training throughput and MFU of the small preset on this machine.

    python -m benchmarks.training_bench [--preset small] [--steps 40] [--precision bf16]

Runs the real training loop (DMP world of one, fused embedding optimizer, AdamW, MLflow
tracking to a local sqlite store) on synthetic batches for ``--steps`` steps in a fresh
process, and writes benchmarks/results/training.json. Definitions are in
gem/training/efficiency.py; in short:

- mfu: model FLOP/s over the wall time from the end of the first step to the end of
  the last one, divided by peak_flops;
- peak_flops: the best of square matmuls of 1024 and 2048 in the training dtype, measured
  right after training, or the best measured before on this machine if higher (the
  cache keeps the best: a peak taken while other jobs load the machine would inflate
  MFU);
- startup_seconds: process launch to the end of the first step, with its phases;
- effective_training_time: time inside steps / wall time from launch to the end;
- load_average_*: the 1-minute load average before and after (other jobs on the
  machine lower every figure).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile

LOAD_BEFORE = os.getloadavg()[0]

from benchmarks.results import print_table, write_result  # noqa: E402 (after the load reading)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=0, help="0: the preset's")
    parser.add_argument("--precision", default="", help="fp32 or bf16; empty: the preset's")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--name", default="training")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from gem.training.tracking import prestart_worker

    prestart_worker()  # as `gem train` does
    from gem.model import build_model, count_parameters, forward_flops_per_example
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    overrides = ["checkpoint_every=0", "log_model=false", "system_metrics=false", "log_every=10",
                 f"max_steps={args.steps}", *args.overrides]
    if args.batch_size:
        overrides.append(f"batch_size={args.batch_size}")
    if args.precision:
        overrides.append(f"precision={args.precision}")
    if args.compile:
        overrides.append("compile=true")
    cfg, model_cfg = load_train_config(args.preset, overrides)
    with tempfile.TemporaryDirectory() as out:
        result = train(f"synthetic://{cfg.batch_size * (args.steps + 1)}", out, cfg, model_cfg)
    perf = result.perf
    load_after = os.getloadavg()[0]
    import torch

    from gem.training.data import default_synthetic_spec
    from gem.training.efficiency import measure_peak_flops

    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    peak = max(measure_peak_flops("cpu", dtype, size=n, refresh=True) for n in (1024, 2048))
    sizes = count_parameters(build_model(model_cfg, default_synthetic_spec()))
    phases = {k.split("/")[1]: v for k, v in perf.items() if k.startswith("perf/startup_") and k.endswith("_s")}
    figures = {
        "preset": args.preset,
        "precision": cfg.precision,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mfu": perf["perf/model_flops_per_s"] / peak,
        "peak_flops": peak,
        "examples_per_s": perf["perf/examples_per_s"],
        "model_flops_per_s": perf["perf/model_flops_per_s"],
        "train_flops_per_example": perf["perf/train_flops_per_example"],
        "step_time_share": perf["perf/step_time_share"],
        "startup_seconds": perf["perf/startup_seconds"],
        **phases,
        "startup_first_step_s": perf["perf/startup_seconds"] - sum(phases.values()),
        "effective_training_time": perf["perf/effective_training_time"],
        "steps": result.steps,
        "load_average_before": LOAD_BEFORE,
        "load_average_after": load_after,
    }
    bench_sizes = {"batch_size": cfg.batch_size, "steps": args.steps, "compile": cfg.compile,
                   "params_total": sizes["total"], "params_dense": sizes["dense"],
                   "forward_flops_per_example_mean_len_8": forward_flops_per_example(
                       build_model(model_cfg, default_synthetic_spec()), batch_size=32, mean_len=8.0)}
    path = write_result(args.name, figures, bench_sizes)
    print_table(f"training ({args.preset}, {cfg.precision})", [(k, v) for k, v in figures.items()])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
