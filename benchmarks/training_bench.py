"""Training throughput, MFU and the share of a step in attention, on this machine.

    python -m benchmarks.training_bench [--preset small] [--steps 40] [--precision bf16]
    python -m benchmarks.training_bench --preset long --name training_long

Runs the real training loop (DMP world of one, fused embedding optimizer, AdamW, MLflow
tracking to a local sqlite store) for ``--steps`` steps in a fresh process, and writes
benchmarks/results/<name>.json. The data: synthetic batches (histories of ~8 tokens) for
the small preset; for a preset in DATA_PRESETS (``long``: histories up to 2,048 events,
mean ~500) a features build of simulated data, made once and reused (benchmarks/results.py
``built``). Definitions are in gem/training/efficiency.py; in short:

- mfu: model FLOP/s over the wall time from the end of the first step to the end of
  the last one, divided by peak_flops. On real features the FLOPs are counted on every
  trained batch (``mfu_exact``, the headline: attention is quadratic in each history's
  length, so the trainer's 16-example probe can miss the mean); ``mfu_trainer`` is the
  trainer's own figure;
- peak_flops: the best of square matmuls of 1024 and 2048 in the training dtype, measured
  right after training, or the best measured before on this machine if higher (the
  cache keeps the best: a peak taken while other jobs load the machine would inflate
  MFU);
- attention_share_of_step: the jagged attention's forward and backward ops over the wall
  time of ``--profile-steps`` more training steps of the same model and batches, under
  torch.profiler (which slows the many small ops more than the long attention calls, so
  the share is a lower bound);
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
import time

LOAD_BEFORE = os.getloadavg()[0]

from benchmarks.results import built, print_table, work_dir, write_result  # noqa: E402 (after the load reading)

# presets trained on a features build of simulated data instead of synthetic batches: the
# window is the log's last ``window_days`` (long: 28 days of history, histories of the last 7)
DATA_PRESETS = {"long": {"simulator": "long_history", "features": "long", "window_days": 7}}
ATTENTION_OPS = ("gem_kernels::jagged_attention_fwd", "gem_kernels::jagged_attention_bwd")


def preset_features(preset: str) -> str:
    """The features build a DATA_PRESETS preset trains on, built once and reused."""
    import datetime as dt
    from dataclasses import asdict

    from gem.config import load_config
    from gem.data.simulate import SimulatorConfig, simulate
    from gem.features.build import build_features
    from gem.features.config import FeaturesConfig

    names = DATA_PRESETS[preset]
    sim = load_config(SimulatorConfig, section="simulator", preset=names["simulator"])
    feats = load_config(FeaturesConfig, section="features", preset=names["features"])
    root = work_dir("bench-data")
    data = root / f"sim-{names['simulator']}"
    built(data, {"simulator": asdict(sim)}, lambda o: simulate(sim, o, progress=False))
    end = dt.date.fromisoformat(sim.start_date) + dt.timedelta(days=sim.days)
    start = f"{end - dt.timedelta(days=names['window_days'])}T00:00:00+00:00"
    out = root / f"features-{names['features']}-{names['simulator']}"
    built(out, {"features": asdict(feats), "data": str(data), "window_start": start},
          lambda o: build_features(data, o, feats, window_start=start))
    return str(out)


def trained_batches(features: str, cfg, steps: int):
    """The batches the trainer took, in its order (the loader is deterministic)."""
    from gem.training.trainer import make_loader

    loader = make_loader(features, cfg, train=True)
    loader.set_epoch(0)
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == steps:
            break
    return out


def exact_flops(model_cfg, spec, batches) -> list[float]:
    """3 x the forward FLOPs of each batch (real tokens only; gem/model/flops.py)."""
    from gem.model import build_model
    from gem.model.flops import batch_forward_flops

    model = build_model(model_cfg, spec)
    return [3.0 * batch_forward_flops(model, b) for b in batches]


def attention_share(model_cfg, cfg, spec, batches, steps: int) -> dict:
    """Wall time of ``steps`` training steps (unsharded model, AdamW) under torch.profiler
    and the time of the attention ops inside them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from gem.model import build_model
    from gem.training.step import build_dense_optimizer, train_step

    model = build_model(model_cfg, spec)
    opt, _ = build_dense_optimizer(model, cfg.optim.dense_lr, 0.0, [0.9, 0.999])
    batches = [batches[i % len(batches)] for i in range(steps + 1)]
    train_step(model, batches[0], opt)  # warm-up: allocator, the AVX2 kernel's build
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for batch in batches[1:]:
            train_step(model, batch, opt)
        wall = time.perf_counter() - start
    attention = {name: 0.0 for name in ATTENTION_OPS}
    for event in prof.key_averages():
        if event.key in attention:
            attention[event.key] += event.cpu_time_total / 1e6
    seconds = sum(attention.values())
    return {"profiled_steps": steps, "profiled_step_s": round(wall / steps, 3),
            "attention_s_per_step": round(seconds / steps, 3),
            "attention_forward_s_per_step": round(attention[ATTENTION_OPS[0]] / steps, 3),
            "attention_backward_s_per_step": round(attention[ATTENTION_OPS[1]] / steps, 3),
            "attention_share_of_step": round(seconds / wall, 3), "torch_threads": torch.get_num_threads()}


def attention_flops(model_cfg, batches) -> float:
    """Training FLOPs of the attention alone over ``batches``: 3 x (QK^T + PV) per head over
    each sequence's kept tokens (history + CLS tokens; no causal mask in GEM)."""
    total = 0.0
    width = model_cfg.num_heads * model_cfg.head_dim
    for batch in batches:
        lengths = batch.sequence.lengths()[: batch.batch_size].double() + model_cfg.num_cls_tokens
        total += 3.0 * 4.0 * width * float((lengths ** 2).sum()) * model_cfg.num_layers
    return total


def length_stats(batches, num_cls: int) -> dict:
    import torch

    from kernels.bucketed.bucketed_jagged_attention import NATIVE_MAX_LEN

    lengths = torch.cat([b.sequence.lengths()[: b.batch_size] for b in batches]).double()
    tokens = lengths + num_cls
    return {"history_mean": round(float(lengths.mean()), 1), "history_max": int(lengths.max()),
            "history_p50": float(lengths.median()),
            "share_of_sequences_on_avx2_kernel": round(float((tokens <= (NATIVE_MAX_LEN or 1e9)).double().mean()), 4),
            "share_of_attention_flops_on_avx2_kernel": round(float((tokens ** 2 * (tokens <= (NATIVE_MAX_LEN or 1e9))
                                                                    ).sum() / (tokens ** 2).sum()), 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=0, help="0: the preset's")
    parser.add_argument("--precision", default="", help="fp32 or bf16; empty: the preset's")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--features", default="", help="a features directory or synthetic://N; empty: the "
                                                        f"preset's data ({sorted(DATA_PRESETS)}) or synthetic")
    parser.add_argument("--profile-steps", type=int, default=6, help="steps profiled for the attention share (0: none)")
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
    features = args.features or (preset_features(args.preset) if args.preset in DATA_PRESETS
                                 else f"synthetic://{cfg.batch_size * (args.steps + 1)}")
    load_train = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as out:
        result = train(features, out, cfg, model_cfg)
    perf = result.perf
    load_after = os.getloadavg()[0]
    import torch

    from gem.training.data import default_synthetic_spec
    from gem.training.efficiency import measure_peak_flops
    from gem.training.trainer import make_loader

    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    peak = max(measure_peak_flops("cpu", dtype, size=n, refresh=True) for n in (1024, 2048))
    spec = make_loader(features, cfg, train=True).spec
    batches = trained_batches(features, cfg, result.steps)
    flops = exact_flops(model_cfg, spec, batches)
    window_examples = sum(b.batch_size for b in batches[1:])
    window_s = window_examples / perf["perf/examples_per_s"]  # the meter's window: after the first step
    mfu_exact = sum(flops[1:]) / window_s / peak
    sizes = count_parameters(build_model(model_cfg, spec))
    phases = {k.split("/")[1]: v for k, v in perf.items() if k.startswith("perf/startup_") and k.endswith("_s")}
    figures = {
        "preset": args.preset,
        "precision": cfg.precision,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mfu": mfu_exact,
        "mfu_trainer": perf["perf/model_flops_per_s"] / peak,
        "peak_flops": peak,
        "examples_per_s": perf["perf/examples_per_s"],
        "model_flops_per_s": sum(flops[1:]) / window_s,
        "train_flops_per_example": sum(flops) / sum(b.batch_size for b in batches),
        "train_flops_per_example_trainer_probe": perf["perf/train_flops_per_example"],
        "attention_share_of_flops": attention_flops(model_cfg, batches) / sum(flops),
        "step_time_share": perf["perf/step_time_share"],
        "startup_seconds": perf["perf/startup_seconds"],
        **phases,
        "startup_first_step_s": perf["perf/startup_seconds"] - sum(phases.values()),
        "effective_training_time": perf["perf/effective_training_time"],
        "steps": result.steps,
        "load_average_before": LOAD_BEFORE,
        "load_average_at_training": load_train,
        "load_average_after": load_after,
    }
    if args.profile_steps:
        figures.update(attention_share(model_cfg, cfg, spec, batches, args.profile_steps))
        figures["load_average_after_profile"] = os.getloadavg()[0]
    bench_sizes = {"batch_size": cfg.batch_size, "steps": args.steps, "compile": cfg.compile,
                   "data": features if features.startswith("synthetic://") else
                   f"features {DATA_PRESETS.get(args.preset, {}).get('features', features)} of simulator preset "
                   f"{DATA_PRESETS.get(args.preset, {}).get('simulator', '?')}",
                   "params_total": sizes["total"], "params_dense": sizes["dense"],
                   "max_seq_len": spec.max_seq_len, **length_stats(batches, model_cfg.num_cls_tokens)}
    if features.startswith("synthetic://"):
        bench_sizes["forward_flops_per_example_mean_len_8"] = forward_flops_per_example(
            build_model(model_cfg, default_synthetic_spec()), batch_size=32, mean_len=8.0)
    path = write_result(args.name, figures, bench_sizes)
    print_table(f"training ({args.preset}, {cfg.precision})", [(k, v) for k, v in figures.items()])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
