"""Where the pipeline's training time goes, on a features window the pipeline trained on.

    python -m benchmarks.pipeline_training_bench --features W/features/teacher --preset pipeline \
        [--holdout W/features/holdout] [--every 4] [--name pipeline_training]

In one process, on the window's batches in the trainer's order (every ``--every``-th,
``--parts`` parts of the run):
- the loader alone (reading shards, building jagged batches), seconds per batch;
- each step's forward, backward and optimizer time, its exact FLOPs (gem/model/batch_flops.py)
  and so, per part of the run, the mean history, FLOPs per example, examples/s and MFU;
- the forward's split over the model's blocks (embeddings, sequence FFN and attention,
  summary pooling, Wukong, heads) on two late batches;
- torch intra-op threads: 1 against torch's default, alternating step by step;
- the personalized FFN's FiLM + SiLU in token blocks (kernels/film_silu.py) against the
  reference's whole-tensor ops, its C kernel against the blocks, and the whole FFN in C
  token blocks (kernels/film_ffn.py) against torch's products around that kernel,
  alternating train steps;
- bf16 autocast against fp32 (train steps over the same subsample, alternating; the
  forward alone on ``--holdout``, as knowledge generation runs it);
- torch.compile of the dense blocks (gem/training/parallelize.py) against eager,
  alternating step by step, with the compile's time cold (empty cache) and warm;
- the evaluation on ``--holdout`` (the trainer's last act before exporting).
Other jobs on the machine change every figure: the JSON records the load averages; the
A/B ratios come from alternating steps in one process.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

LOAD_BEFORE = os.getloadavg()

from benchmarks.results import print_table, write_result  # noqa: E402 (after the load reading)

BLOCKS = ("inputs", "sequence.ffn", "sequence.attn", "summary", "interaction", "cross", "context", "heads",
          "two_tower")


def block_split(model, batches) -> dict[str, float]:
    """Share of the forward's wall time in each block (forward hooks; blocks of every layer summed)."""
    spent: dict[str, float] = {}
    starts: dict[int, float] = {}

    def watch(module, name: str) -> None:
        module.register_forward_pre_hook(lambda m, a: starts.__setitem__(id(m), time.perf_counter()))
        module.register_forward_hook(lambda m, a, o: spent.__setitem__(
            name, spent.get(name, 0.0) + time.perf_counter() - starts[id(m)]))

    for name in BLOCKS:
        if "." not in name and hasattr(model, name):
            watch(getattr(model, name), name)
    for layer in getattr(model, "layers", []):
        for name in BLOCKS:
            head, _, tail = name.partition(".")
            module = getattr(layer, head, None)
            module = getattr(module, tail, None) if tail else module
            if module is not None and head in ("sequence", "summary", "interaction", "cross", "context"):
                watch(module, name)
    start = time.perf_counter()
    for batch in batches:
        model(batch)
    wall = time.perf_counter() - start
    return {f"forward_share_{k.replace('.', '_')}": round(v / wall, 3) for k, v in spent.items()}


def alternate(steps, first: str, second: str) -> dict[str, float]:
    """Run ``steps`` (callables taking a variant name) alternating which variant goes first."""
    seconds = {first: 0.0, second: 0.0}
    for i, step in enumerate(steps):
        for name in ((first, second) if i % 2 == 0 else (second, first)):
            start = time.perf_counter()
            step(name)
            seconds[name] += time.perf_counter() - start
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", required=True)
    parser.add_argument("--holdout", default="")
    parser.add_argument("--preset", default="pipeline")
    parser.add_argument("--every", type=int, default=4, help="train on every n-th batch of the run (order kept)")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--ab-steps", type=int, default=6, help="steps of each A/B (threads, compile)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--name", default="pipeline_training")
    args = parser.parse_args(argv)
    from gem.utils.memory import keep_freed_memory

    keep_freed_memory()  # as every process of the pipeline (gem_app/__init__.py)
    import torch

    from gem.model import build_model
    from gem.model.batch_flops import flops_pricer
    from gem.training.compile_cache import compile_cache_counts, use_compile_cache
    from gem.training.config import load_train_config
    from gem.training.data import slice_batch
    from gem.training.distributed import attach_embedding_optimizer, init_distributed, shard_model, unwrap
    from gem.training.efficiency import cached_peak_flops, measure_peak_flops
    from gem.training.parallelize import apply_compile
    from gem.training.precision import bf16_matmul_gain
    from gem.training.step import build_dense_optimizer, eval_step, forward_loss, train_step
    from gem.training.trainer import evaluate, make_loader
    from gem.utils.cache import cache_dir

    default_threads = torch.get_num_threads()
    cfg, model_cfg = load_train_config(args.preset)
    loader = make_loader(args.features, cfg, train=True)
    loader.set_epoch(0)
    batches, load_s, it = [], [], iter(loader)
    while True:
        start = time.perf_counter()
        batch = next(it, None)
        load_s.append(time.perf_counter() - start)
        if batch is None:
            break
        batches.append(batch)
    env = init_distributed()

    def trainable(model):
        attach_embedding_optimizer(model, cfg.optim.embedding_lr, cfg.optim.embedding_eps)
        dmp = shard_model(model, env)
        return dmp, build_dense_optimizer(dmp, cfg.optim.dense_lr, 0.0, list(cfg.optim.betas))[0]

    base = build_model(model_cfg, loader.spec)
    pristine = copy.deepcopy(base)
    flops = flops_pricer(base, slice_batch(batches[0], 0, min(16, batches[0].batch_size)),
                         cache_dir() / "batch_flops.json")
    peak = cached_peak_flops("cpu", torch.float32) or measure_peak_flops("cpu", torch.float32)
    dmp, opt = trainable(base)
    used = batches[::args.every]
    rows = []
    for batch in used:
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, _, _ = forward_loss(dmp, batch)
        mid = time.perf_counter()
        loss.backward()
        back = time.perf_counter()
        opt.step()
        end = time.perf_counter()
        lengths = batch.sequence.lengths()[: batch.batch_size].double()
        rows.append({"examples": batch.batch_size, "mean_len": float(lengths.mean()), "flops": 3 * flops.forward(batch),
                     "forward": mid - start, "backward": back - mid, "optimizer": end - back})
    figures: dict = {"load_average_before": LOAD_BEFORE[0], "torch_threads": default_threads,
                     "loader_s_per_batch": sum(load_s) / len(batches), "batches": len(batches),
                     "peak_flops": peak, "first_step_s": sum(rows[0][k] for k in ("forward", "backward", "optimizer"))}
    timed = rows[1:]
    total = sum(r["forward"] + r["backward"] + r["optimizer"] for r in timed)
    figures.update({f"step_share_{k}": sum(r[k] for r in timed) / total for k in ("forward", "backward", "optimizer")})
    figures["examples_per_s"] = sum(r["examples"] for r in timed) / total
    figures["mfu"] = sum(r["flops"] for r in timed) / total / peak
    for p in range(args.parts):
        part = timed[p * len(timed) // args.parts:(p + 1) * len(timed) // args.parts]
        seconds = sum(r["forward"] + r["backward"] + r["optimizer"] for r in part)
        examples = sum(r["examples"] for r in part)
        figures[f"part{p}_history_mean"] = sum(r["mean_len"] for r in part) / len(part)
        figures[f"part{p}_mflop_per_example"] = sum(r["flops"] for r in part) / examples / 1e6
        figures[f"part{p}_examples_per_s"] = examples / seconds
        figures[f"part{p}_mfu"] = sum(r["flops"] for r in part) / seconds / peak
    with torch.no_grad():
        figures.update(block_split(unwrap(dmp), batches[-2:]))
    figures["load_average_after_steps"] = os.getloadavg()[0]

    ab = used[1:args.ab_steps + 1]
    if default_threads > 1:
        def threads_step(batch):
            def run(name):
                torch.set_num_threads(1 if name == "one" else default_threads)
                train_step(dmp, batch, opt)
            return run
        seconds = alternate([threads_step(b) for b in ab], "one", "default")
        torch.set_num_threads(default_threads)
        figures["threads_step_time_default_over_one"] = seconds["default"] / seconds["one"]
    # the personalized FFN's FiLM + SiLU (kernels/film_silu.py): token blocks against the
    # reference's whole-tensor ops, then the C kernel against the blocks; two copies of
    # the untrained model each, alternating steps
    def film_ab(settings: dict[str, dict], key: str) -> None:
        films = {name: trainable(copy.deepcopy(pristine)) for name in settings}
        for name, attrs in settings.items():
            for module in unwrap(films[name][0]).modules():
                if hasattr(module, "film_rows"):
                    for attr, value in attrs.items():
                        setattr(module, attr, value)

        def film_step(batch):
            return lambda name: train_step(films[name][0], batch, films[name][1])
        for name in films:
            film_step(used[0])(name)
        first, second = settings
        seconds = alternate([film_step(b) for b in used[1:]], first, second)
        film_flops = sum(3 * flops.forward(b) for b in used[1:])
        figures[f"{key}_step_time_{second}_over_{first}"] = seconds[second] / seconds[first]
        for name in films:
            figures[f"{key}_{name}_examples_per_s"] = sum(b.batch_size for b in used[1:]) / seconds[name]
            figures[f"{key}_{name}_mfu"] = film_flops / seconds[name] / peak
    film_ab({"reference": {"film_rows": 0}, "blocks": {"film_native": False}}, "film")
    film_ab({"blocks": {"film_native": False}, "native": {"fused": False}}, "film_c")
    film_ab({"ops": {"fused": False}, "fused": {}}, "ffn_fused")  # the whole FFN in C blocks (kernels/film_ffn.py)
    # precision: two copies of the untrained model, one step each per batch, alternating
    # (the same subsample of the run as above), and the forward alone on the holdout
    figures["bf16_matmul_gain"] = bf16_matmul_gain()
    precisions = {name: trainable(copy.deepcopy(pristine)) for name in ("fp32", "bf16")}

    def precision_step(batch):
        return lambda name: train_step(precisions[name][0], batch, precisions[name][1], precision=name)
    for name in precisions:  # warm-up: lazy init and the allocator, outside the timing
        precision_step(used[0])(name)
    seconds = alternate([precision_step(b) for b in used[1:]], "fp32", "bf16")
    figures["precision_step_time_bf16_over_fp32"] = seconds["bf16"] / seconds["fp32"]
    figures["precision_examples_per_s_fp32"] = sum(b.batch_size for b in used[1:]) / seconds["fp32"]
    figures["precision_examples_per_s_bf16"] = sum(b.batch_size for b in used[1:]) / seconds["bf16"]
    if args.holdout:
        forward_model = unwrap(precisions["fp32"][0]).eval()
        held = list(make_loader(args.holdout, cfg, train=False))

        def forward(batch):
            return lambda name: eval_step(forward_model, batch, precision=name)
        seconds = alternate([forward(b) for b in held], "fp32", "bf16")
        figures["precision_forward_time_bf16_over_fp32"] = seconds["bf16"] / seconds["fp32"]
        figures["precision_forward_max_prob_diff"] = max(
            float((eval_step(forward_model, b) - eval_step(forward_model, b, precision="bf16")).abs().max())
            for b in held[:2])
    if args.holdout:
        start = time.perf_counter()
        evaluate(dmp, make_loader(args.holdout, cfg, train=False), env, loader.spec)
        figures["evaluate_holdout_s"] = time.perf_counter() - start
    if not args.no_compile:
        with tempfile.TemporaryDirectory() as cache:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            use_compile_cache(cache)
            models = {"eager": trainable(copy.deepcopy(pristine)), "compiled": trainable(copy.deepcopy(pristine))}
            apply_compile(unwrap(models["compiled"][0]))
            firsts = {}
            for name in ("eager", "compiled"):
                start = time.perf_counter()
                train_step(models[name][0], ab[0], models[name][1])
                firsts[name] = time.perf_counter() - start
            torch._dynamo.reset()  # as a new process, the cache on disk warm
            warm = trainable(copy.deepcopy(pristine))
            apply_compile(unwrap(warm[0]))
            start = time.perf_counter()
            train_step(warm[0], ab[0], warm[1])
            figures["compile_first_step_cold_s"] = firsts["compiled"]
            figures["compile_first_step_warm_s"] = time.perf_counter() - start
            figures["eager_first_step_s"] = firsts["eager"]
            figures.update({f"compile_cache_{k}": v for k, v in compile_cache_counts().items()})

            def compile_step(batch):
                return lambda name: train_step(models[name][0], batch, models[name][1])
            seconds = alternate([compile_step(b) for b in ab[1:]], "eager", "compiled")
            figures["compile_step_time_compiled_over_eager"] = seconds["compiled"] / seconds["eager"]
    figures["load_average_after"] = os.getloadavg()[0]
    sizes = {"features": args.features, "preset": args.preset, "batch_size": cfg.batch_size, "every": args.every,
             "steps_timed": len(used), "ab_steps": len(ab), "model": model_cfg.__dict__.get("arch", "gem")}
    path = write_result(args.name, figures, sizes)
    print_table(f"pipeline training ({args.preset}, {args.features})", list(figures.items()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
