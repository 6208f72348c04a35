"""The step cost model (gem/training/stepcost.py) against a real sharded step.

    torchrun --standalone --nproc_per_node=4 -m benchmarks.step_cost_bench [--preset tiny] [--dense shard]

Every rank builds the model as the trainer does (DMP, the planner's tables, DDP or FSDP2,
fused row-wise Adagrad, AdamW), takes one warm-up step, then ``--steps`` steps under
torch.profiler, and measures per step what it sent in each collective (the input of
every gloo call the profiler records), and its memory: its shards of the tables and
their optimizer state (from the plan), its dense parameters, AdamW state and gradients
(the tensors), the activations autograd kept (saved-tensor hooks on one forward). Rank 0
writes the means over ranks beside the model's prediction for the same workload to
benchmarks/results/step_cost.json (``--out`` elsewhere) and prints them.

    python -m benchmarks.step_cost_bench --paper     # benchmarks/results/step_cost_paper.json

applies the model to the paper-scale run of docs/scale.md (PAPER: its assumptions): the
FLOPs and activations per example are those of the ``large`` model preset at the
assumed history length (counted on CPU with small tables: neither depends on the rows),
the tables those assumed; it finds the smallest TrainJob whose ranks hold everything.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

LOAD_BEFORE = os.getloadavg()[0]
RESULTS = Path(__file__).resolve().parent / "results" / "step_cost.json"


def measure(preset: str, overrides: list[str], features: str, steps: int) -> dict:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from gem.model import build_model
    from gem.training.config import load_train_config
    from gem.training.data import rank_slice
    from gem.training.distributed import attach_embedding_optimizer, dense_memory, init_distributed, shard_model
    from gem.training.planning import MIB, rank_totals
    from gem.training.step import build_dense_optimizer, train_step
    from gem.training.stepcost import collective_bytes, predict, saved_activation_bytes, workload_of
    from gem.training.trainer import make_loader, seed_everything

    cfg, model_cfg = load_train_config(preset, overrides)
    env = init_distributed()
    seed_everything(cfg.seed)
    loader = make_loader(features, cfg, train=True)
    model = build_model(model_cfg, loader.spec)
    batches = iter(loader)
    probe = next(iter(make_loader(features, cfg, train=False)))
    workload = workload_of(model, loader.spec, probe, batch_size=cfg.batch_size, world_size=env.world_size,
                           dense=cfg.sharding.dense)
    attach_embedding_optimizer(model, cfg.optim.embedding_lr, cfg.optim.embedding_eps)
    dmp = shard_model(model, env, ebc_sharding=cfg.sharding.ebc, ec_sharding=cfg.sharding.ec,
                      rank_memory_bytes=int(cfg.sharding.rank_memory_mib * MIB),
                      batch_size=cfg.batch_size // env.world_size, dense=cfg.sharding.dense)
    opt, _ = build_dense_optimizer(dmp, cfg.optim.dense_lr, cfg.optim.weight_decay, cfg.optim.betas)

    def step():
        local = rank_slice(next(batches), env.rank, env.world_size)
        train_step(dmp, local, opt)
        return local

    step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            step()
    sent = {k: v / steps for k, v in collective_bytes(prof.events()).items()}
    params = [p for group in opt.param_groups for p in group["params"]]
    grads = sum((p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).numel() * 4
                for p in params if p.grad is not None)
    local = rank_slice(next(batches), env.rank, env.world_size)
    memory = dense_memory(opt)
    mine = {
        "all_to_all_bytes": sent.get("all_to_all", 0.0),
        "dense_comm_bytes": sum(v for k, v in sent.items() if k != "all_to_all"),
        "collectives": sent,
        "table_bytes": float(_local_table_bytes(dmp)),
        "planned_table_bytes": float(rank_totals(dmp.plan_rows).get(str(env.rank), 0)),
        "dense_bytes": float(memory["memory/dense_param_bytes"] + memory["memory/dense_optimizer_bytes"]),
        "gradient_bytes": float(grads),
        "activation_bytes": float(saved_activation_bytes(dmp, local)),
    }
    gathered = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    dist.barrier()
    if not env.is_main:
        return {}
    keys = [k for k in mine if k != "collectives"]
    measured = {k: sum(r[k] for r in gathered) / env.world_size for k in keys}
    # the model splits the tables evenly; a plan holds them unevenly: the fullest rank binds
    measured["table_bytes"] = max(r["table_bytes"] for r in gathered)
    measured["memory_bytes"] = sum(measured[k] for k in ("table_bytes", "dense_bytes", "gradient_bytes",
                                                         "activation_bytes"))
    predicted = predict(workload).to_dict()
    return {"preset": preset, "overrides": overrides, "features": features, "world_size": env.world_size,
            "steps": steps, "measured": measured, "per_rank": gathered, "predicted": predicted,
            "ratio": {k: (predicted[k] / measured[k] if measured[k] else None) for k in measured if k in predicted},
            "workload": {k: v for k, v in workload.__dict__.items() if k != "features"},
            "features_of_workload": [f.__dict__ for f in workload.features]}


# The paper-scale run's assumptions (docs/scale.md states and discusses them).
PAPER = {
    "model_preset": "large",  # embedding_dim 256, 8 InterFormer layers, 8 heads x 64, Wukong 3 layers
    "examples_per_day": 20e9,  # labelled ad impressions a day
    "batch_size": 16384,  # global (gem/configs/train/large.yaml)
    "mean_history": 1000, "max_history": 4096,
    "rows": {"user_id": 2e9, "item_id": 1e9, "advertiser_id": 1e7, "country": 250,
             "hist_item_id": 1e9, "hist_event_type": 8},
    "gpu": "H100 SXM 80 GB", "gpu_memory_bytes": 80e9, "usable_memory": 0.85,
    "peak_flops": 989e12,  # bf16 dense
    "mfu": 0.30, "network_bytes_per_s": 50e9,  # 400 Gb/s InfiniBand per GPU
    "comm_overlap": 0.5, "gpus_per_node": 8, "dense": "shard",
}


def paper_scale(probe_examples: int = 2) -> dict:
    import torch

    from gem.model import build_model
    from gem.training.config import load_train_config
    from gem.training.data import SyntheticLoader, default_synthetic_spec
    from gem.training.stepcost import FLOAT_BYTES, Workload, predict, step_seconds, workload_of

    a = PAPER
    torch.manual_seed(0)
    _, model_cfg = load_train_config(a["model_preset"])
    spec = default_synthetic_spec(a["max_history"], rows=1000)
    model = build_model(model_cfg, spec)
    probe = next(iter(SyntheticLoader(spec, probe_examples, batch_size=probe_examples, shuffle=False, seed=0,
                                      mean_len=a["mean_history"])))
    small = workload_of(model, spec, probe, batch_size=a["batch_size"], world_size=1, dense=a["dense"])
    dim = small.features[0].dim
    table_bytes = sum(rows * (dim * FLOAT_BYTES + 4) for rows in a["rows"].values())  # + row-wise Adagrad
    jobs = []
    for gpus in range(a["gpus_per_node"], 100_000, a["gpus_per_node"]):
        w = Workload(batch_size=a["batch_size"], world_size=gpus, features=small.features, table_bytes=table_bytes,
                     dense_params=small.dense_params, forward_flops_per_example=small.forward_flops_per_example,
                     activation_bytes_per_example=small.activation_bytes_per_example, dense=a["dense"])
        cost = predict(w)
        if cost.memory_bytes <= a["gpu_memory_bytes"] * a["usable_memory"]:
            break
    times = step_seconds(cost, w, peak_flops=a["peak_flops"], mfu=a["mfu"],
                         network_bytes_per_s=a["network_bytes_per_s"], overlap=a["comm_overlap"])
    steps_per_day = a["examples_per_day"] / a["batch_size"]
    jobs = {"gpus": gpus, "nodes": gpus // a["gpus_per_node"], "steps_per_day_of_data": steps_per_day,
            **times, "wall_hours_per_day_of_data": steps_per_day * times["step_s"] / 3600,
            "gpu_hours_per_day_of_data": steps_per_day * times["step_s"] * gpus / 3600}
    return {"assumptions": a, "probe": {"examples": probe_examples, "mean_history": float(
                probe.sequence.lengths().float().view(len(probe.sequence.keys()), -1).mean())},
            "per_example": {"forward_flops": small.forward_flops_per_example,
                            "activation_bytes": small.activation_bytes_per_example},
            "dense_params": small.dense_params, "table_bytes": table_bytes,
            "step": cost.to_dict(), "trainjob": jobs}


def _local_table_bytes(dmp) -> int:
    """This rank's shards of the tables and of their fused optimizer state (the tensors)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    tensors = [*dmp.state_dict().values(),
               *(v for state in dmp.fused_optimizer.state_dict()["state"].values() for v in state.values())]
    return sum(s.tensor.numel() * s.tensor.element_size() for t in tensors if isinstance(t, ShardedTensor)
               for s in t.local_shards())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--features", default="synthetic://512?rows=5000")
    parser.add_argument("--dense", default="replicate", choices=("replicate", "shard"))
    # the 4-rank runs of tests/training/test_reshard.py: the large tables row-wise under a cap
    parser.add_argument("--set", dest="overrides", action="append",
                        default=["sharding.ec=row_wise", "sharding.rank_memory_mib=0.3"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--paper", action="store_true", help="the paper-scale projection (one process)")
    args = parser.parse_args()
    started = time.time()
    if args.paper:
        result = {**paper_scale(), "seconds": round(time.time() - started, 1)}
        out = args.out or RESULTS.with_name("step_cost_paper.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: result[k] for k in ("per_example", "dense_params", "step", "trainjob")}, indent=1))
        return
    result = measure(args.preset, [*args.overrides, f"sharding.dense={args.dense}"], args.features, args.steps)
    if result:
        result.update(seconds=round(time.time() - started, 1), load_average_before=LOAD_BEFORE,
                      load_average_after=os.getloadavg()[0])
        out = args.out or RESULTS
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: result[k] for k in ("measured", "predicted", "ratio")}, indent=1))


if __name__ == "__main__":
    main()
