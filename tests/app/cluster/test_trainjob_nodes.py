"""The TrainJob path without a cluster: the train stage builds its TrainJob (the one the
pipeline creates), the manifest validates against the Trainer's API models, and its
node container command runs as two "nodes" on localhost with the variables the
Trainer's torch runtime injects (PET_*: 2 nodes x 1 process, gloo). The nodes form one
process group, train with sharded embedding tables, lose node 1 mid-way, are restarted
together (as the runtime's JobSet does) and resume from the last checkpoint on the
shared workspace; the result agrees with one process on the same data."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import torch

import gem_app.launch as launch
from gem.config import load_config
from gem.data.simulate import SimulatorConfig, simulate
from gem.features.build import build_features
from gem.features.config import FeaturesConfig
from gem.registry import TEACHER_MODEL
from gem_app.stages.context import RunContext, start_pipeline
from gem_app.stages.train import train

ROOT = Path(__file__).resolve().parents[3]
STEPS, CHECKPOINT_EVERY = 40, 5
OVERRIDES = ["batch_size=32", f"max_steps={STEPS}", f"checkpoint_every={CHECKPOINT_EVERY}", "sharding.ec=row_wise",
             "system_metrics=false", "measure_peak=false", "log_model=true"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_env(manifest: dict, rank: int, port: int, tmp: Path) -> dict[str, str]:
    """What a node container sees: the image's environment, the TrainJob's env, and the
    PET_* variables of the Trainer's torch plugin."""
    trainer = manifest["spec"]["trainer"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GEM_CACHE_DIR": str(tmp / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.update({e["name"]: e["value"] for e in trainer["env"]})
    env.update({"PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
                "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)})
    return env


def start_nodes(manifest: dict, tmp: Path, attempt: int) -> list[subprocess.Popen]:
    """Every node of the TrainJob, running the manifest's command exactly."""
    trainer, port = manifest["spec"]["trainer"], free_port()
    procs = []
    for rank in range(trainer["numNodes"]):
        log = open(tmp / f"node{rank}.attempt{attempt}.log", "w")
        procs.append(subprocess.Popen(trainer["command"], cwd=ROOT, env=node_env(manifest, rank, port, tmp),
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class LocalTrainJob:
    """Stands in for the Trainer: validates the TrainJob, runs its nodes; on the first
    attempt node 1 is killed once a checkpoint exists, then every node is restarted."""

    def __init__(self, tmp: Path):
        self.tmp, self.manifest, self.first_attempt_codes = tmp, None, None

    def __call__(self, manifest: dict, **_) -> dict:
        launch.validate_trainjob(manifest)
        self.manifest = manifest
        out = Path(manifest["spec"]["trainer"]["command"][manifest["spec"]["trainer"]["command"].index("--out") + 1])
        procs = start_nodes(manifest, self.tmp, attempt=1)
        deadline = time.monotonic() + 600
        while not (out / "checkpoints" / "latest").is_file():
            assert all(p.poll() is None for p in procs), (self.tmp / "node0.attempt1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 600 s"
            time.sleep(0.05)
        kill(procs[1])  # the node is lost
        try:
            procs[0].wait(timeout=120)  # its peer fails on the broken process group
        except subprocess.TimeoutExpired:
            kill(procs[0])  # the JobSet restart deletes the remaining pods anyway
        self.first_attempt_codes = [p.returncode for p in procs]
        procs = start_nodes(manifest, self.tmp, attempt=2)
        for p in procs:
            p.wait(timeout=900)
        logs = [(self.tmp / f"node{r}.attempt2.log").read_text() for r in range(len(procs))]
        assert all(p.returncode == 0 for p in procs), logs[0][-3000:] + logs[-1][-3000:]
        return {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("volume")
    data = tmp / "data"
    simulate(load_config(SimulatorConfig, section="simulator", preset="tiny", overrides=["days=3"]), data,
             progress=False)
    build_features(data, tmp / "features" / "teacher", load_config(FeaturesConfig, section="features", preset="tiny"),
                   window_end="2026-01-03T00:00:00+00:00")
    cfg = load_config(FeaturesConfig, section="features", preset="tiny",
                      overrides=[f"vocab_from={tmp / 'features' / 'teacher'}"])
    build_features(data, tmp / "features" / "holdout", cfg, window_start="2026-01-03T00:00:00+00:00")
    return tmp


def test_two_nodes_form_one_group_agree_with_one_process_and_resume(windows, tmp_path, monkeypatch):
    volume = windows  # the workspace volume, mounted at the same path on every "node"
    monkeypatch.setenv(launch.OPTIONS_ENV, json.dumps({"mount": str(volume), "cpu": "1", "memory": "2Gi"}))
    monkeypatch.setenv(launch.NAMESPACE_ENV, "gem-test")
    monkeypatch.setenv("GEM_IMAGE", "registry.example/gem:test")
    job = LocalTrainJob(tmp_path)
    monkeypatch.setattr(launch, "submit_trainjob", job)
    ctx = start_pipeline(RunContext(pipeline_run_id="two-nodes", tracking_root=str(tmp_path)))
    result = train(str(volume / "features" / "teacher"), str(volume / "features" / "holdout"),
                   str(volume / "teacher"), "tiny", ctx, overrides=OVERRIDES, launcher="trainjob:2:0")

    manifest = job.manifest  # what the pipeline's train task submitted
    trainer = manifest["spec"]["trainer"]
    assert trainer["command"][:4] == ["torchrun", "-m", "gem", "train"] and "--resume" in trainer["command"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 1)
    assert manifest["metadata"]["namespace"] == "gem-test"
    mounts = manifest["spec"]["podTemplateOverrides"][0]["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [{"name": "workspace", "mountPath": str(volume)}]

    # one process group of two ranks, sharded tables: each rank checkpointed its own shards
    logs = [(tmp_path / f"node{r}.attempt2.log").read_text() for r in (0, 1)]
    steps = sorted((volume / "teacher" / "checkpoints").glob("step_*"))
    assert steps and {p.name for p in steps[-1].glob("rank*.pt")} == {"rank0.pt", "rank1.pt"}
    shards = [torch.load(steps[-1] / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert shards[0].keys() == shards[1].keys()
    # node 1 was lost mid-way; the restarted nodes resumed from a checkpoint, not from zero
    assert job.first_attempt_codes[1] != 0
    assert all("resumed from step" in log for log in logs), logs[0][-2000:]
    assert result.steps == STEPS and result.model_version == "1"
    run = mlflow.MlflowClient().get_run(result.run_id)
    assert run.data.tags["mlflow.parentRunId"] == ctx.parent_run_id
    assert mlflow.MlflowClient().get_model_version(TEACHER_MODEL, "1").run_id == result.run_id

    # the same command in one process (no torchrun, no restart) gives the same model
    args = trainer["command"][4:]
    args[args.index("--out") + 1] = str(tmp_path / "single")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GEM_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "gem", "train", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = torch.load(tmp_path / "single" / "model" / "weights.pt", weights_only=True)
    nodes = torch.load(volume / "teacher" / "model" / "weights.pt", weights_only=True)
    assert single.keys() == nodes.keys()
    worst = max(float((nodes[k].float() - single[k].float()).abs().max()) for k in single)
    (tmp_path / "agreement.json").write_text(json.dumps({"max_abs_weight_diff": worst}))
    for key in single:
        torch.testing.assert_close(nodes[key], single[key], rtol=1e-4, atol=5e-5, msg=key)
