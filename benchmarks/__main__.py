"""`python -m benchmarks [NAME ...]`: run every benchmark (or those whose name contains
one of the NAMEs). Each runs in its own process (clean peak-memory figures) and writes
`<results>/<name>.json` (see benchmarks/results.py)."""

from __future__ import annotations

import subprocess
import sys
import time

BENCHMARKS = (
    "benchmarks.simulator_bench",
    "benchmarks.features_bench",
    "benchmarks.features_duckdb",
    "benchmarks.training_bench",
    "benchmarks.training_bench --preset long --name training_long",
    "benchmarks.knowledge_bench",
    "benchmarks.serving_http_bench",
    "benchmarks.serving_counters_bench",
    "benchmarks.quality.bench",
    "benchmarks.transfer.bench",
    "benchmarks.pipeline_bench",
    "benchmarks.reliability_bench",
    "kernels.benchmarks.jagged_attention_bench",
    # the step cost model against a 4-rank step (DDP, FSDP2), and at paper scale
    "torch.distributed.run --standalone --nproc_per_node=4 -m benchmarks.step_cost_bench",
    "torch.distributed.run --standalone --nproc_per_node=4 -m benchmarks.step_cost_bench --dense shard "
    "--out benchmarks/results/step_cost_fsdp2.json",
    "benchmarks.step_cost_bench --paper",
    "benchmarks.scale_bench",  # hours on 2 cores: the whole pipeline at 16x and the features build at 100M events
)


def main(argv: list[str]) -> int:
    modules = [m for m in BENCHMARKS if not argv or any(a in m for a in argv)]
    failed = []
    for module in modules:
        print(f"\n>>> {module}", flush=True)
        start = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", *module.split()])  # a module and its arguments
        print(f"<<< {module}: rc={rc} in {time.perf_counter() - start:.1f}s", flush=True)
        if rc != 0:
            failed.append(module)
    if failed:
        print("failed benchmarks:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
