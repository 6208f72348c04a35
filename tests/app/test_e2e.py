"""The whole pipeline through kfp.local on a tiny dataset of unusual shapes (the
simulator's events on one surface, "search", named by the data; no conversion at all;
users without any attribute; ids written as strings; surfaces and tasks come from the
data):

1. `python -m gem pipeline run` is SIGKILLed (whole process group) during pretraining;
2. rerun, it reuses the finished stages (no rebuilt features) and resumes pretraining
   in the same MLflow run, then registers students with walkable lineage;
3. the refresh step on that workspace: GEM continues from the champion teacher.
(The refresh pipeline's graph is the same as gem_pipeline's plus resolve_champion;
test_compile.py checks it.)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from gem import tracking
from gem.config import load_config
from gem.data.simulate import SimulatorConfig, simulate
from gem.registry import EXPERIMENT, TEACHER_MODEL
from gem_app.refresh.cycle import dataset_until
from tests.datasets.shapes import make_shapes


def _pipeline_cmd(workspace: Path, data: Path) -> list[str]:
    return [sys.executable, "-m", "gem", "pipeline", "run", "--workspace", str(workspace), "--data", str(data),
            "--preset", "tiny"]


def _kill_during_pretraining(cmd: list[str], workspace: Path, timeout: float = 600) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    marker = workspace / ".stages" / "teacher.train-run.json"
    deadline = time.monotonic() + timeout
    try:
        while not marker.exists():
            assert proc.poll() is None, "pipeline ended before pretraining started"
            assert time.monotonic() < deadline, "pretraining never started"
            time.sleep(0.5)
        time.sleep(2.0)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow(minutes=4)
def test_pipeline_kill_resume_lineage_and_refresh(tmp_path):
    cfg = load_config(SimulatorConfig, section="simulator", preset="tiny", overrides=["days=5"])
    simulate(cfg, tmp_path / "simulated", progress=False)
    data = make_shapes(tmp_path / "simulated", tmp_path / "incoming",
                       ["one_surface", "users_without_attributes", "string_ids"])
    first_days = dt.date.fromisoformat(cfg.start_date) + dt.timedelta(days=3)
    view = dataset_until(data, first_days, tmp_path / "view")
    workspace = tmp_path / "ws"

    _kill_during_pretraining(_pipeline_cmd(workspace, view), workspace)
    assert not (workspace / "summary.json").exists()
    run_before = json.loads((workspace / ".stages" / "teacher.train-run.json").read_text())["result"]["run_id"]
    teacher_manifest = workspace / "features" / "teacher" / "manifest.json"
    built_at = teacher_manifest.stat().st_mtime_ns

    done = subprocess.run(_pipeline_cmd(workspace, view), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| search |" in done.stdout and "mlflow ui --backend-store-uri sqlite:///" in done.stdout
    assert teacher_manifest.stat().st_mtime_ns == built_at  # finished stages are reused, not rebuilt
    pretrain = json.loads((workspace / ".stages" / "teacher.train.json").read_text())["result"]
    assert pretrain["run_id"] == run_before  # the killed run was resumed, not restarted
    summary = json.loads((workspace / "summary.json").read_text())
    assert [r["surface"] for r in summary["surfaces"]] == ["search"]
    ingest = json.loads((workspace / "ingest.json").read_text())["result"]
    assert ingest["quarantined_fraction"] == 0.0  # string ids are coerced, not quarantined
    assert json.loads(teacher_manifest.read_text())["dataset"]["data_tasks"] == ["click"]
    warnings = json.loads((workspace / "features" / "teacher" / "report.json").read_text())["warnings"]
    assert any("user_age_bucket" in w and "every" in w for w in warnings), warnings
    assert "warning: features report: " in done.stderr  # the report's warnings reach the terminal

    # lineage: registered student -> teacher version -> teacher run -> data window and digest
    tracking.configure(workspace, experiment=EXPERIMENT)
    client = MlflowClient()
    student = client.get_model_version("student_search", "1")
    teacher_uri = student.tags["teacher_version"]
    assert teacher_uri == f"models:/{TEACHER_MODEL}/1"
    teacher = client.get_model_version(TEACHER_MODEL, "1")
    teacher_run = client.get_run(teacher.run_id)
    assert teacher_run.data.tags[tracking.TAG_DATA_DIGEST] == teacher.tags[tracking.TAG_DATA_DIGEST]
    assert teacher_run.data.tags["mlflow.parentRunId"]
    assert tracking.TAG_DATA_WINDOW in student.tags

    # refresh: GEM continues from the champion teacher on the newest window
    from gem_app.stages.context import RunContext
    from gem_app.stages.gate import champion_teacher
    from gem_app.stages.train import train

    champion = champion_teacher()
    assert champion["uri"] == f"models:/{TEACHER_MODEL}/1" and champion["features_dir"].endswith("features/teacher")
    ctx = RunContext(pipeline_run_id="refresh-test", tracking_root=str(workspace))
    refreshed = train(str(workspace / "features" / "student"), str(workspace / "features" / "holdout"),
                    str(tmp_path / "continued"), "tiny", ctx, init_from=champion["uri"]).as_dict()
    continued = client.get_model_version(TEACHER_MODEL, refreshed["model_version"])
    assert refreshed["model_version"] == "2"
    assert client.get_run(continued.run_id).data.tags["gem.init_from"] == champion["uri"]
    assert not Path("mlflow.db").exists(), "a stage wrote MLflow records into the working directory"
    mlflow.set_tracking_uri("")
