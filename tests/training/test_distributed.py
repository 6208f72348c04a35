"""torchrun --nproc_per_node=2 on CPU (gloo, sharded tables) matches one process with the
same global batch."""

import sys

import torch

from tests.training.conftest import TINY, run_ok


def test_torchrun_two_ranks_matches_single_process(single_run, tmp_path):
    single_out, result, _, _ = single_run
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "gem", "train", "--features", "synthetic://512", "--out", str(out), *TINY,
           "--set", "sharding.ec=row_wise", "--set", "log_model=false"]
    run_ok(cmd, tmp_path, timeout=300)
    single = torch.load(single_out / "model" / "weights.pt", weights_only=True)
    sharded = torch.load(out / "model" / "weights.pt", weights_only=True)
    assert single.keys() == sharded.keys()
    for key in single:
        torch.testing.assert_close(sharded[key], single[key], rtol=1e-4, atol=5e-5, msg=key)
    assert result.steps == 8
