"""The TrainJob path without a cluster: the train stage builds its TrainJob (the one the
pipeline's train task creates), the manifest validates against the Trainer's API
models, and its node container command runs as two "nodes" on localhost with the
variables the Trainer's torch runtime injects (PET_*: 2 nodes x 1 process, gloo). The
nodes form one process group and train with sharded embedding tables; node 1 is lost
mid-way (its whole process tree killed, as a lost machine takes its pod), every node is
restarted (as the runtime's JobSet failure policy does) and resumes from the last
checkpoint on the shared workspace; the model agrees with the same command run in one
process on the same data.

GEM_TWO_NODE_REPORT=FILE writes the agreement figures there (benchmarks/pipeline_bench.py)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import psutil
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
STEPS, CHECKPOINT_EVERY = 16, 4  # the window has 19 batches of 32: one epoch, cut at STEPS
OVERRIDES = ["batch_size=32", f"max_steps={STEPS}", f"checkpoint_every={CHECKPOINT_EVERY}", "sharding.ec=row_wise",
             "system_metrics=false", "measure_peak=false", "log_model=true"]
REPORT_ENV = "GEM_TWO_NODE_REPORT"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def image_env(tmp: Path) -> dict[str, str]:
    """What the image gives every container: the project importable, torchrun on PATH,
    one thread per process (two "nodes" share this machine's cores)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GEM_CACHE_DIR": str(tmp / "cache"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def node_env(manifest: dict, rank: int, port: int, tmp: Path) -> dict[str, str]:
    """What a node container sees: the image's environment, the TrainJob's env, and the
    PET_* variables of the Trainer's torch plugin (node 0 is the master)."""
    trainer = manifest["spec"]["trainer"]
    env = image_env(tmp)
    env.update({e["name"]: e["value"] for e in trainer["env"]})
    env.update({"PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
                "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)})
    assert set(launch.PET_VARIABLES) <= set(env)
    return env


def start_nodes(manifest: dict, tmp: Path, attempt: int) -> list[subprocess.Popen]:
    """Every node of the TrainJob, each running the manifest's command exactly."""
    trainer, port = manifest["spec"]["trainer"], free_port()
    procs = []
    for rank in range(trainer["numNodes"]):
        with open(tmp / f"node{rank}.attempt{attempt}.log", "w") as log:
            procs.append(subprocess.Popen(trainer["command"], cwd=ROOT, env=node_env(manifest, rank, port, tmp),
                                          stdout=log, stderr=subprocess.STDOUT))
    return procs


def lose_node(proc: subprocess.Popen) -> None:
    """The node's machine is gone: torchrun and its workers (torch elastic starts each
    worker in a session of its own, so a process group would miss them) die at once."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()  # torchrun: reaped here, so its exit status (killed) is kept
    psutil.wait_procs(tree[1:], timeout=30)  # its workers, reaped by init


def arg(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


class LocalTrainJob:
    """Stands in for the Trainer and its JobSet: validates the TrainJob and runs its nodes.
    On the first attempt node 1 is lost once a checkpoint exists; node 0 fails on the
    broken process group, and every node is started again. The same command in one
    process (the reference) runs beside the first attempt."""

    def __init__(self, tmp: Path):
        self.tmp, self.manifest, self.first_attempt_codes, self.node0_failed_alone = tmp, None, None, False
        self.reference: subprocess.Popen | None = None

    def start_reference(self) -> None:
        args = list(self.manifest["spec"]["trainer"]["command"][4:])  # after torchrun -m gem train
        args[args.index("--out") + 1] = str(self.tmp / "single")
        args += ["--set", f"tracking_uri=sqlite:///{self.tmp / 'single.db'}"]  # its own store, its own run
        env = {k: v for k, v in image_env(self.tmp).items() if not k.startswith("MLFLOW_")}
        with open(self.tmp / "single.log", "w") as log:
            self.reference = subprocess.Popen([sys.executable, "-m", "gem", "train", *args], cwd=ROOT, env=env,
                                              stdout=log, stderr=subprocess.STDOUT)

    def __call__(self, manifest: dict, **_) -> dict:
        launch.validate_trainjob(manifest)
        self.manifest = manifest
        latest = Path(arg(manifest["spec"]["trainer"]["command"], "--out")) / "checkpoints" / "latest"
        procs = start_nodes(manifest, self.tmp, attempt=1)
        self.start_reference()
        deadline = time.monotonic() + 300
        while not latest.is_file():
            assert all(p.poll() is None for p in procs), (self.tmp / "node0.attempt1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
        lose_node(procs[1])
        try:  # its peer's collective fails on the closed connection and its torchrun exits
            procs[0].wait(timeout=60)
            self.node0_failed_alone = True
        except subprocess.TimeoutExpired:
            lose_node(procs[0])  # the JobSet's restart deletes the remaining pods anyway
        self.first_attempt_codes = [p.returncode for p in procs]
        procs = start_nodes(manifest, self.tmp, attempt=2)
        for p in procs:
            p.wait(timeout=600)
        logs = [(self.tmp / f"node{r}.attempt2.log").read_text() for r in range(len(procs))]
        assert all(p.returncode == 0 for p in procs), logs[0][-3000:] + logs[-1][-3000:]
        return {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}


@pytest.fixture(scope="module")
def volume(tmp_path_factory):
    """The workspace volume (mounted at the same path on every "node"): data and the
    teacher window (no holdout: the weights are compared, evaluation is the gate's test)."""
    tmp = tmp_path_factory.mktemp("volume")
    data = tmp / "data"
    simulate(load_config(SimulatorConfig, section="simulator", preset="tiny", overrides=["days=3"]), data,
             progress=False)
    build_features(data, tmp / "features" / "teacher", load_config(FeaturesConfig, section="features", preset="tiny"),
                   window_end="2026-01-03T00:00:00+00:00")
    return tmp


def _rows_per_rank(checkpoint: Path, world_size: int) -> dict[str, list[int]]:
    """Rows of each table in each rank's file of a DCP checkpoint (from its metadata)."""
    from gem.training.checkpoint import SafeReader

    meta = SafeReader(checkpoint).read_metadata()
    rows: dict[str, list[int]] = {}
    for index, info in meta.storage_data.items():
        if index.fqn.startswith("model.") and ".weight" in index.fqn and (".ebc." in index.fqn or ".ec." in index.fqn):
            rank = int(info.relative_path.split("_")[2])
            chunks = meta.state_dict_metadata[index.fqn].chunks
            chunk = next(c for c in chunks if tuple(c.offsets) == tuple(index.offset))
            rows.setdefault(index.fqn.removeprefix("model."), [0] * world_size)[rank] += chunk.sizes[0]
    return rows


@pytest.mark.slow(minutes=1.7)
def test_two_nodes_form_one_group_agree_with_one_process_and_resume(volume, tmp_path, monkeypatch):
    started = time.perf_counter()
    monkeypatch.setenv(launch.OPTIONS_ENV, json.dumps({"mount": str(volume), "cpu": "1", "memory": "2Gi"}))
    monkeypatch.setenv(launch.NAMESPACE_ENV, "gem-test")
    monkeypatch.setenv("GEM_IMAGE", "registry.example/gem:test")
    job = LocalTrainJob(tmp_path)
    monkeypatch.setattr(launch, "submit_trainjob", job)  # the cluster's part; the manifest is the stage's own
    ctx = start_pipeline(RunContext(pipeline_run_id="two-nodes", tracking_root=str(tmp_path)))
    result = train(str(volume / "features" / "teacher"), "", str(volume / "teacher"), "tiny", ctx,
                   overrides=OVERRIDES, launcher="trainjob:2:0")

    manifest = job.manifest  # what the pipeline's train task submitted
    trainer = manifest["spec"]["trainer"]
    assert trainer["command"][:4] == ["torchrun", "-m", "gem", "train"] and "--resume" in trainer["command"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 1)
    assert manifest["spec"]["runtimeRef"]["name"] == launch.TrainJobOptions().runtime
    assert manifest["metadata"]["namespace"] == "gem-test"
    mounts = manifest["spec"]["podTemplateOverrides"][0]["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [{"name": "workspace", "mountPath": str(volume)}]

    # one process group of two ranks
    client = mlflow.MlflowClient()
    run = client.get_run(result.run_id)
    assert run.data.params["world_size"] == "2" and run.data.tags["mlflow.parentRunId"] == ctx.parent_run_id
    # sharded tables: each rank checkpointed only its shards (whole tables of the
    # table-wise bags, its rows of the row-wise sequence tables), together the model's
    last = sorted((volume / "teacher" / "checkpoints").glob("step_*"))[-1]
    assert last.name == f"step_{STEPS:08d}" and {p.name for p in last.glob("*.distcp")} == {"__0_0.distcp",
                                                                                            "__1_0.distcp"}
    nodes = torch.load(volume / "teacher" / "model" / "weights.pt", weights_only=True)
    rows = _rows_per_rank(last, 2)
    assert rows and all(sum(n) == nodes[k].shape[0] for k, n in rows.items()), rows
    whole = [n for k, n in rows.items() if ".ebc." in k]  # table-wise: one rank holds each table
    assert whole and all(0 in n for n in whole) and all(any(n[r] for n in whole) for r in (0, 1)), rows
    split = [n for k, n in rows.items() if ".ec." in k]  # row-wise: every rank holds some rows
    assert split and all(n[0] and n[1] for n in split), rows

    # node 1 was lost mid-way; the restarted nodes resumed from its last checkpoint
    assert job.first_attempt_codes[1] != 0 and job.first_attempt_codes[0] != 0
    logs = [(tmp_path / f"node{r}.attempt2.log").read_text() for r in (0, 1)]
    resumed = [int(m.group(1)) for log in logs for m in [re.search(r"resumed from step (\d+)", log)] if m]
    assert len(resumed) == 2 and resumed[0] == resumed[1] and 0 < resumed[0] < STEPS, logs[0][-2000:]
    assert result.steps == STEPS and result.model_version == "1"
    assert client.get_model_version(TEACHER_MODEL, "1").run_id == result.run_id

    # the same command in one process (no torchrun, no restart) gives the same model
    assert job.reference.wait(timeout=600) == 0, (tmp_path / "single.log").read_text()[-3000:]
    single = torch.load(tmp_path / "single" / "model" / "weights.pt", weights_only=True)
    assert single.keys() == nodes.keys()
    worst = max(float((nodes[k].float() - single[k].float()).abs().max()) for k in single)
    scale = max(float(single[k].float().abs().max()) for k in single)
    report = {"nodes": 2, "procs_per_node": 1, "steps": STEPS, "resumed_from_step": resumed[0],
              "max_abs_weight_diff": worst, "max_abs_weight": scale, "tolerance": {"rtol": 1e-4, "atol": 5e-5},
              "node0_failed_alone": job.node0_failed_alone, "test_seconds": time.perf_counter() - started}
    if os.environ.get(REPORT_ENV):
        Path(os.environ[REPORT_ENV]).write_text(json.dumps(report, indent=1))
    for key in single:
        torch.testing.assert_close(nodes[key], single[key], rtol=1e-4, atol=5e-5, msg=key)
