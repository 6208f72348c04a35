"""The step cost model: its arithmetic, and its prediction of a real 4-rank CPU step's
bytes and memory (torchrun, gloo, tables row-wise under a cap) within 20%."""

import json
import sys

import pytest

from gem.training.stepcost import Feature, StepCost, Workload, predict, step_seconds
from tests.training.conftest import run_ok


def _workload(dense: str = "replicate", world_size: int = 4) -> Workload:
    return Workload(batch_size=64, world_size=world_size, dense=dense,
                    features=[Feature("user_id", 16, 1.0, True), Feature("hist_item_id", 16, 10.0, False)],
                    table_bytes=4_000_000, dense_params=1_000, forward_flops_per_example=500.0,
                    activation_bytes_per_example=2_000.0)


def test_the_arithmetic_of_one_step():
    cost = predict(_workload())
    # 16 examples per rank: ids 11 x 8 B + lengths 2 x 4 B; embeddings (1 + 10) x 16 floats, there and back
    assert cost.all_to_all_bytes == 16 * (11 * 8 + 2 * 4) + 2 * 16 * 11 * 16 * 4
    assert cost.dense_comm_bytes == 4_000  # one all-reduce of 1,000 fp32 gradients
    assert (cost.table_bytes, cost.dense_bytes, cost.gradient_bytes) == (1_000_000, 12_000, 4_000)
    assert cost.activation_bytes == 32_000 and cost.flops == 3 * 500 * 64
    assert cost.memory_bytes == 1_000_000 + 12_000 + 4_000 + 32_000

    sharded = predict(_workload("shard"))  # FSDP2: a quarter of the state; reduce-scatter + 2 all-gathers
    assert (sharded.dense_bytes, sharded.gradient_bytes, sharded.dense_comm_bytes) == (3_000, 1_000, 6_000)
    alone = predict(_workload(world_size=1))
    assert alone.all_to_all_bytes == alone.dense_comm_bytes == 0

    times = step_seconds(StepCost(flops=8e12, all_to_all_bytes=1e9, dense_comm_bytes=1e9, table_bytes=0,
                                  dense_bytes=0, gradient_bytes=0, activation_bytes=0),
                         _workload(), peak_flops=1e12, mfu=0.5, network_bytes_per_s=1e9, overlap=0.5)
    assert times == {"compute_s": 4.0, "comm_s": 2.0, "step_s": 5.0}


@pytest.mark.slow(minutes=0.7)
def test_predicts_a_four_rank_step_within_20_percent(tmp_path):
    out = tmp_path / "step_cost.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
           "-m", "benchmarks.step_cost_bench", "--out", str(out), "--steps", "2"]
    run_ok(cmd, tmp_path, timeout=300)
    result = json.loads(out.read_text())
    measured, ratio = result["measured"], result["ratio"]
    assert measured["all_to_all_bytes"] > 10_000 and measured["dense_comm_bytes"] > 100_000, measured
    for key in ("all_to_all_bytes", "dense_comm_bytes", "table_bytes", "dense_bytes", "gradient_bytes",
                "activation_bytes", "memory_bytes"):
        assert 0.8 <= ratio[key] <= 1.2, (key, ratio[key], measured[key], result["predicted"][key])
