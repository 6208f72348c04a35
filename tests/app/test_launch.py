"""Pretraining launchers: torchrun on this machine for real; the TrainJob manifest's shape."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
import yaml

from gem.config import load_config
from gem.data.simulate import SimulatorConfig, simulate
from gem.features.build import build_features
from gem.features.config import FeaturesConfig
from gem.registry import TEACHER_MODEL
from gem.utils.evidence import enough_for_auc
from gem_app.launch import Launcher, train_args, trainjob_manifest, validate_trainjob
from gem_app.stages.context import RunContext, start_pipeline
from gem_app.stages.train import train

ROOT = Path(__file__).resolve().parents[2]

def test_launcher_strings():
    assert Launcher.parse("local").kind == "local"
    assert Launcher.parse("torchrun:2").nproc == 2
    job = Launcher.parse("trainjob:4:8")
    assert (job.kind, job.nodes, job.gpus) == ("trainjob", 4, 8)
    with pytest.raises(ValueError, match="must be local, torchrun:N or trainjob:NODES:GPUS_PER_NODE"):
        Launcher.parse("slurm:3")


def test_trainjob_manifest_runs_torchrun_on_the_shipped_torch_runtime():
    """The TrainJob names the runtime deploy/trainer/runtime.yaml ships (Trainer's torch
    runtime plus the JobSet restart policy an elastic restart needs), runs torchrun (the
    torch plugin's PET_* variables are torchrun's options) and validates against the
    Trainer v2.1 API models."""
    runtime = yaml.safe_load((ROOT / "deploy" / "trainer" / "runtime.yaml").read_text())
    args = train_args("/workspace/f", "/workspace/h", "/workspace/t", "base", ["epochs=2"], "models:/gem_teacher/3")
    job = trainjob_manifest("gem-pretrain-x", "registry/gem:1", args, nodes=2, gpus_per_node=8, namespace="team-a",
                            env={"MLFLOW_RUN_ID": "abc"})
    assert validate_trainjob(job) == job
    ref = job["spec"]["runtimeRef"]
    assert (ref["kind"], ref["name"]) == (runtime["kind"], runtime["metadata"]["name"]) == (
        "TrainingRuntime", "gem-torch-distributed")
    assert runtime["spec"]["mlPolicy"]["torch"] is not None  # the torch plugin injects PET_*
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] >= 1
    trainer = job["spec"]["trainer"]
    assert trainer["command"][:4] == ["torchrun", "-m", "gem", "train"] and "--resume" in trainer["command"]
    assert trainer["command"][trainer["command"].index("--init-from") + 1] == "models:/gem_teacher/3"
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "MLFLOW_RUN_ID", "value": "abc"} in trainer["env"]
    assert job["metadata"]["namespace"] == "team-a"


@pytest.mark.slow(minutes=0.8)
def test_train_stage_under_torchrun_registers_the_teacher(tmp_path):
    data = tmp_path / "data"
    simulate(load_config(SimulatorConfig, section="simulator", preset="tiny", overrides=["days=3"]), data,
             progress=False)
    cfg = load_config(FeaturesConfig, section="features", preset="tiny")
    build_features(data, tmp_path / "train", cfg, window_end="2026-01-03T00:00:00+00:00")
    cfg_eval = load_config(FeaturesConfig, section="features", preset="tiny",
                           overrides=[f"vocab_from={tmp_path / 'train'}"])
    build_features(data, tmp_path / "eval", cfg_eval, window_start="2026-01-03T00:00:00+00:00")
    ctx = start_pipeline(RunContext(pipeline_run_id="launch-test", tracking_root=str(tmp_path)))
    result = train(str(tmp_path / "train"), str(tmp_path / "eval"), str(tmp_path / "teacher"), "tiny", ctx,
                   overrides=["batch_size=64", "max_steps=6", "log_model=true"], launcher="torchrun:2").as_dict()
    assert result["model_version"] == "1" and result["steps"] > 0
    metrics = result["metrics"]
    if enough_for_auc(metrics["eval/positives/all/click"], metrics["eval/negatives/all/click"]):
        assert 0.0 <= metrics["eval/auc/all/click"] <= 1.0
    else:  # too few positives for an AUC: it is not reported at all
        assert "eval/auc/all/click" not in metrics and metrics["eval/count/all/click"] > 0
    run = mlflow.MlflowClient().get_run(result["run_id"])
    assert run.data.tags["mlflow.parentRunId"] == ctx.parent_run_id
    assert mlflow.MlflowClient().get_model_version(TEACHER_MODEL, "1").run_id == result["run_id"]
