"""Elastic restarts: two torchrun agents ("nodes", one rank each) with a node range of
1:2 and c10d rendezvous; node 1 is lost mid-run (its agent and worker killed). Node 0's
worker fails on the broken process group, its agent restarts it, the rendezvous closes
with the one node left, and the run resumes on it from the last checkpoint (saved by 2
ranks, loaded by 1) and finishes, ending where an uninterrupted run ends."""

import socket
import subprocess
import sys
import time

import psutil
import pytest
import torch
import yaml

from tests.training.conftest import ROOT, TINY, gem_env, gem_train_cmd

ARGS = ["--features", "synthetic://1024", *TINY, "--set", "checkpoint_every=2", "--set", "log_model=false"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(out, port: int, log, *, host: bool) -> subprocess.Popen:
    """``host``: this node's agent serves the rendezvous store (on one machine both
    agents could; the lost node must not be the one that does)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc_per_node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic-test",
           "--max-restarts=2", f"--rdzv-conf=join_timeout=120,last_call_timeout=3,is_host={str(host).lower()}",
           *gem_train_cmd(*ARGS, "--out", str(out), "--resume")[1:]]
    return subprocess.Popen(cmd, cwd=ROOT, env=gem_env(out.parent), stdout=log, stderr=subprocess.STDOUT)


def _lose(proc: subprocess.Popen) -> None:
    """The node is gone: its agent and its worker (in a session of its own) die at once."""
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        p.kill()
    proc.wait()
    psutil.wait_procs(tree[1:], timeout=30)


@pytest.mark.slow(minutes=1.2)
def test_a_lost_node_and_the_run_continues_on_the_survivor(tmp_path):
    out, port = tmp_path / "run", _free_port()
    with open(tmp_path / "node0.log", "w") as log0, open(tmp_path / "node1.log", "w") as log1:
        nodes = [_node(out, port, log0, host=True), _node(out, port, log1, host=False)]
        latest = out / "checkpoints" / "latest"
        deadline = time.monotonic() + 240
        while not (latest.is_file() and latest.read_text().strip() >= "step_00000004"):
            assert all(n.poll() is None for n in nodes), (tmp_path / "node0.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.02)
        _lose(nodes[1])
        lost_after = latest.read_text().strip()
        assert nodes[0].wait(timeout=240) == 0, (tmp_path / "node0.log").read_text()[-4000:]
    log = (tmp_path / "node0.log").read_text()
    assert "saved by 2 rank(s), resumed by 1" in log, log[-4000:]
    assert lost_after < "step_00000016" and latest.read_text().strip() == "step_00000016"

    straight = tmp_path / "straight"
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    cfg, model_cfg = load_train_config("tiny", ["system_metrics=false", "measure_peak=false", "checkpoint_every=2",
                                                "log_model=false"])
    train("synthetic://1024", straight, cfg, model_cfg)
    a = torch.load(straight / "model" / "weights.pt", weights_only=True)
    b = torch.load(out / "model" / "weights.pt", weights_only=True)
    for key in a:  # steps at 2 ranks then at 1, against 1 throughout: the same global batches
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=5e-5, msg=key)


def test_the_runtime_restarts_elastically():
    """deploy/trainer/runtime.yaml: torchrun's node range and restarts (the Trainer's
    elastic policy) within the JobSet's own restarts of lost pods; the Trainer's API
    models read it back unchanged."""
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainingRuntime

    runtime = yaml.safe_load((ROOT / "deploy" / "trainer" / "runtime.yaml").read_text())
    parsed = TrainerV1alpha1TrainingRuntime.from_dict(runtime)
    assert parsed.to_dict() == runtime
    elastic = parsed.spec.ml_policy.torch.elastic_policy
    assert elastic.min_nodes == 1 and elastic.max_nodes >= 2 and elastic.max_restarts >= 1
