"""Train steps with freed memory kept for reuse (gem/utils/memory.py) against glibc's
defaults, on a features window the pipeline trained on.

    python -m benchmarks.training_heap_bench --features W/features/teacher [--holdout W/features/holdout] \
        [--every 4] [--rounds 3] [--name training_heap]

The setting is process-wide, so the two arms are separate processes, alternating (ABBA
order over ``--rounds`` rounds): each builds the `pipeline` model, takes one warm-up step,
then trains on every ``--every``-th batch of the window in the trainer's order, and runs
the forward alone over ``--holdout`` as knowledge generation does. Figures per arm: the
median over rounds of seconds, examples/s, MFU (exact FLOPs, gem/model/batch_flops.py),
page faults, kernel (sys) seconds and peak RSS; ratios keep / default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LOAD_BEFORE = os.getloadavg()

from benchmarks.results import print_table, write_result  # noqa: E402 (after the load reading)

ARMS = {"keep": "1", "default": "0"}  # GEM_KEEP_FREED_MEMORY of each arm's process


def child(features: str, holdout: str, preset: str, every: int) -> dict:
    from gem.utils.memory import keep_freed_memory

    kept = keep_freed_memory()  # honours GEM_KEEP_FREED_MEMORY, as the application's import does
    import resource

    import torch

    from gem.model import build_model
    from gem.model.batch_flops import flops_pricer
    from gem.training.config import load_train_config
    from gem.training.data import slice_batch
    from gem.training.distributed import attach_embedding_optimizer, init_distributed, shard_model, unwrap
    from gem.training.efficiency import cached_peak_flops, measure_peak_flops
    from gem.training.step import build_dense_optimizer, eval_step, train_step
    from gem.training.trainer import make_loader
    from gem.utils.cache import cache_dir

    cfg, model_cfg = load_train_config(preset)
    loader = make_loader(features, cfg, train=True)
    loader.set_epoch(0)
    batches = list(loader)
    model = build_model(model_cfg, loader.spec)
    flops = flops_pricer(model, slice_batch(batches[0], 0, min(16, batches[0].batch_size)),
                         cache_dir() / "batch_flops.json")
    attach_embedding_optimizer(model, cfg.optim.embedding_lr, cfg.optim.embedding_eps)
    dmp = shard_model(model, init_distributed())
    opt = build_dense_optimizer(dmp, cfg.optim.dense_lr, 0.0, list(cfg.optim.betas))[0]
    used = batches[::every]
    train_step(dmp, used[0], opt)  # warm-up: lazy init, the first allocations

    def usage():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), r.ru_minflt, r.ru_stime

    t0, f0, s0 = usage()
    for batch in used[1:]:
        train_step(dmp, batch, opt)
    t1, f1, s1 = usage()
    out = {"kept": kept, "threads": torch.get_num_threads(), "train_s": t1 - t0, "train_faults": f1 - f0,
           "train_sys_s": s1 - s0, "train_examples": sum(b.batch_size for b in used[1:]),
           "train_flops": sum(3 * flops.forward(b) for b in used[1:]),
           "peak_flops": cached_peak_flops("cpu", torch.float32) or measure_peak_flops("cpu", torch.float32)}
    if holdout:
        model = unwrap(dmp).eval()
        held = list(make_loader(holdout, cfg, train=False))
        eval_step(model, held[0])
        t0, f0, s0 = usage()
        for batch in held:
            eval_step(model, batch)
        t1, f1, s1 = usage()
        out.update({"forward_s": t1 - t0, "forward_faults": f1 - f0, "forward_sys_s": s1 - s0,
                    "forward_examples": sum(b.batch_size for b in held)})
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", required=True)
    parser.add_argument("--holdout", default="")
    parser.add_argument("--preset", default="pipeline")
    parser.add_argument("--every", type=int, default=4, help="train on every n-th batch of the run (order kept)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="training_heap")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.features, args.holdout, args.preset, args.every)))
        return 0
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        for arm in (ARMS if r % 2 == 0 else reversed(ARMS)):  # ABBA: neither arm always runs first
            cmd = [sys.executable, "-m", "benchmarks.training_heap_bench", "--child", "--features", args.features,
                   "--holdout", args.holdout, "--preset", args.preset, "--every", str(args.every)]
            done = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, "GEM_KEEP_FREED_MEMORY": ARMS[arm]})
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-3000:])
                return 1
            runs[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {arm}: train {runs[arm][-1]['train_s']:.1f}s "
                  f"faults {runs[arm][-1]['train_faults']}", flush=True)
    figures: dict = {"load_average_before": LOAD_BEFORE[0]}
    for arm, results in runs.items():
        assert all(r["kept"] == (arm == "keep") for r in results), f"{arm}: the setting did not take"
        med = {k: statistics.median(r[k] for r in results) for k in results[0] if k != "kept"}
        figures.update({
            f"{arm}_train_s": med["train_s"],
            f"{arm}_examples_per_s": med["train_examples"] / med["train_s"],
            f"{arm}_mfu": med["train_flops"] / med["train_s"] / med["peak_flops"],
            f"{arm}_train_page_faults": med["train_faults"],
            f"{arm}_train_sys_s": med["train_sys_s"],
            f"{arm}_maxrss_mb": med["maxrss_mb"],
            f"{arm}_threads": med["threads"],
        })
        if "forward_s" in med:
            figures[f"{arm}_forward_examples_per_s"] = med["forward_examples"] / med["forward_s"]
            figures[f"{arm}_forward_page_faults"] = med["forward_faults"]
    figures["train_step_time_keep_over_default"] = figures["keep_train_s"] / figures["default_train_s"]
    if args.holdout:
        figures["forward_time_keep_over_default"] = (figures["default_forward_examples_per_s"]
                                                     / figures["keep_forward_examples_per_s"])
    figures["peak_flops"] = runs["keep"][0]["peak_flops"]
    figures["load_average_after"] = os.getloadavg()[0]
    sizes = {"features": args.features, "holdout": args.holdout, "preset": args.preset, "every": args.every,
             "rounds": args.rounds, "train_examples": runs["keep"][0]["train_examples"]}
    path = write_result(args.name, figures, sizes)
    print_table(f"freed memory kept against glibc's defaults ({args.preset}, {args.features})", list(figures.items()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
