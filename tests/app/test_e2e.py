"""The whole pipeline through kfp.local on a tiny dataset of unusual shapes (the
simulator's events on one surface, "search", named by the data; no conversion at all;
users without any attribute; ids written as strings; surfaces and tasks come from the
data) whose ad clicks are shuffled: there is nothing to learn.

1. `python -m gem pipeline run` is SIGKILLed (whole process group) during pretraining;
2. rerun on a pseudo-terminal, as a person types it (the screen holds one line per step
   and no executor chatter), it reuses the finished stages (no rebuilt features) and
   resumes pretraining in the same MLflow run, registers students with walkable lineage, and promotes
   nothing: every gate says keep or not enough evidence, and why;
3. what a person sees: `mlflow server` on the store, read through its REST API (the
   runs, the gate's decision and reason, the registered models' signatures and
   descriptions, lineage both ways), and the registered models loaded through
   `mlflow.pyfunc` scoring a features window;
4. GEM continues from that teacher's weights on a newer window (the refresh step).
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
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from gem import tracking
from gem.config import load_config
from gem.data.simulate import SimulatorConfig, simulate
from gem.registry import CHAMPION, EXPERIMENT, TEACHER_MODEL
from gem_app.refresh.cycle import dataset_until
from tests.app import mlflow_ui
from tests.datasets.shapes import _events, _rewrite, make_shapes
from tests.terminal import Screen, run_in_terminal


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


def shuffle_ad_clicks(data: Path, seed: int = 0) -> int:
    """Every ad impression's click label shuffled among the ad impressions (and the
    conversions, which follow clicks, dropped): labels independent of everything a
    model sees. Returns the ad clicks kept (their number is unchanged)."""
    from gem.data.contract import Manifest

    ev = _events(data)
    ads = ev["is_ad"].to_numpy()
    ev.loc[ads, "click"] = np.random.default_rng(seed).permutation(ev.loc[ads, "click"].to_numpy())
    ev.loc[ads, "click_time"] = pd.NaT
    ev["conversion"], ev["conversion_time"] = 0, pd.NaT
    _rewrite(data, ev, Manifest.read(data))
    return int(ev.loc[ads, "click"].sum())


def what_the_terminal_shows(screen: Screen, workspace: Path) -> None:
    """Issue 41: at most 60 lines, one per step (each step's log named on the screen as a
    step line), and none of kfp's chatter, which stays in the step logs."""
    assert len(screen.lines) <= 60, screen.text
    steps = {log.stem.split("-", 1)[1] for log in (workspace / "logs").glob("[0-9][0-9][0-9]-*.log")}
    shown = {line.split()[1] for line in screen.lines if line.startswith("✓ ")}
    assert steps and steps <= shown, (steps - shown, screen.text)
    for chatter in ("Executing task", "finished with status", "executor_input", "INFO", "Traceback"):
        assert chatter not in screen.text, (chatter, screen.text)


@pytest.mark.slow(minutes=5)
def test_pipeline_kill_resume_no_promotion_on_shuffled_labels_ui_and_refresh(tmp_path):
    cfg = load_config(SimulatorConfig, section="simulator", preset="tiny", overrides=["days=5"])
    simulate(cfg, tmp_path / "simulated", progress=False)
    assert shuffle_ad_clicks(tmp_path / "simulated") > 0
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

    done = run_in_terminal(_pipeline_cmd(workspace, view), timeout=900)
    assert done.returncode == 0, done.text[-3000:]
    assert "| search |" in done.text and "mlflow ui --backend-store-uri sqlite:///" in done.text
    what_the_terminal_shows(done, workspace)
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
    # the report's warnings reach the terminal, each once: the data's (said at ingest) not again
    assert "features-finalize: warning: feature 'user_age_bucket' is unknown (id 0)" in done.text
    said = [line for line in done.lines if "attribute 'age_bucket' is null for every row" in line]
    assert len(said) == 1 and "ingest: warning:" in said[0], said

    # shuffled labels: nothing is promoted, and the terminal says why
    row, teacher_gate = summary["surfaces"][0], summary["teacher"]["gate"]
    assert not row["promoted"] and row["decision"] in ("keep", "not enough evidence") and row["why"]
    assert teacher_gate["outcome"] in ("keep", "not enough evidence") and teacher_gate["reason"]
    assert "| decision | why |" in done.text and row["why"][:40] in done.text

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
    for name in (TEACHER_MODEL, "student_search"):
        assert CHAMPION not in client.get_registered_model(name).aliases, name

    what_the_ui_shows(workspace, tmp_path, row, teacher_gate)

    # refresh: GEM continues from that teacher's weights on the newest window
    from gem_app.stages.context import RunContext
    from gem_app.stages.train import train

    ctx = RunContext(pipeline_run_id="refresh-test", tracking_root=str(workspace))
    refreshed = train(str(workspace / "features" / "student"), str(workspace / "features" / "holdout"),
                      str(tmp_path / "continued"), "tiny", ctx, init_from=teacher_uri).as_dict()
    continued = client.get_model_version(TEACHER_MODEL, refreshed["model_version"])
    assert refreshed["model_version"] == "2"
    assert client.get_run(continued.run_id).data.tags["gem.init_from"] == teacher_uri
    assert not Path("mlflow.db").exists(), "a stage wrote MLflow records into the working directory"
    mlflow.set_tracking_uri("")


def provenance(rest, by_name: dict, distill: dict, train: dict) -> None:
    """Issue 41 item 4: the features, feast and knowledge runs carry params and their
    inputs (with counts); no run has a param saying where it logs."""
    def contexts(run: dict) -> dict[str, dict]:
        inputs = rest.run(run["info"]["run_id"])["inputs"]
        return {tags["mlflow.data.context"]: tags for tags in (
            {t["key"]: t["value"] for t in d["tags"]} for d in inputs.get("dataset_inputs", []))}

    for name in ("features-teacher", "features-student", "features-holdout"):
        params = mlflow_ui.params(by_name[name])
        assert params["window"] == mlflow_ui.tags(by_name[name])[tracking.TAG_DATA_WINDOW] and params["max_seq_len"]
        assert int(contexts(by_name[name])["source"]["num_events"]) > 0
    feast = by_name["feast"]
    assert mlflow_ui.tags(feast)[tracking.TAG_FEATURE_VIEWS] == mlflow_ui.params(feast)["feature_views"]
    assert int(contexts(feast)["source"]["num_events"]) > 0
    knowledge = by_name["knowledge"]
    assert mlflow_ui.params(knowledge)["teacher_version"] == f"models:/{TEACHER_MODEL}/1"
    assert int(contexts(knowledge)["scoring"]["num_examples"]) > 0
    assert rest.run(knowledge["info"]["run_id"])["inputs"]["model_inputs"]  # the teacher it ran
    for run in (distill, train):
        assert not [k for k in mlflow_ui.params(run) if k.rsplit(".", 1)[-1] in ("experiment", "tracking_uri")]


def what_the_ui_shows(workspace: Path, tmp_path: Path, row: dict, teacher_gate: dict) -> None:
    """The store through `mlflow server`'s REST API, as the UI's pages read it, and the
    registered models loaded through mlflow.pyfunc from that server."""
    with mlflow_ui.mlflow_server(workspace / "mlflow.db", tmp_path / "mlflow-server.log") as url:
        rest = mlflow_ui.Rest(url)
        runs = rest.runs(EXPERIMENT)
        by_name = {r["info"]["run_name"]: r for r in runs}
        # every run says who ran which code
        assert all(mlflow_ui.tags(r).get("mlflow.source.git.commit") for r in runs), \
            [r["info"]["run_name"] for r in runs if not mlflow_ui.tags(r).get("mlflow.source.git.commit")]
        assert all(mlflow_ui.tags(r).get("mlflow.user") for r in runs)
        # the pipeline run: named by pipeline, data and time; the summary table is its description
        killed, parent = sorted((r for r in runs if mlflow_ui.tags(r).get(tracking.TAG_STAGE) == "pipeline"),
                                key=lambda r: int(r["info"]["start_time"]))
        assert (killed["info"]["status"], parent["info"]["status"]) == ("KILLED", "FINISHED")
        assert parent["info"]["run_name"].startswith("gem-pipeline ")
        assert "| decision | why |" in mlflow_ui.tags(parent)["mlflow.note.content"]
        assert all(mlflow_ui.params(parent)[k] for k in ("data", "data_digest", "code_version"))
        # one gate run per model, its decision and reason on the page; no promote runs
        assert not [n for n in by_name if n.startswith("promote")]
        gate = by_name["gate-student_search"]
        assert mlflow_ui.tags(gate)["mlflow.note.content"] == f"{row['decision']}: {row['why']}"
        assert mlflow_ui.tags(gate)["gate.decision"] == row["decision"]
        assert mlflow_ui.params(gate)["gate.max_ne"] == "1.0" and mlflow_ui.params(gate)["gate.min_positives"]
        gate_metrics = mlflow_ui.metrics(gate)
        assert {"challenger/auc", "challenger/ne", "holdout/positives"} <= set(gate_metrics)
        assert not [k for k in gate_metrics if "search" in k]  # the surface is a tag, not in the names
        # student runs with their intervals and a ROC / calibration plot
        distill = by_name["distill-search"]
        assert {"eval/student/auc_lo", "eval/student/auc_hi", "eval/lift/auc_lo", "eval/lift/ne_hi"} <= set(
            mlflow_ui.metrics(distill))
        plots = rest.get("/api/2.0/mlflow/artifacts/list", run_id=distill["info"]["run_id"], path="plots")
        assert [f["path"] for f in plots["files"]] == ["plots/holdout_roc_calibration.png"]
        teacher_gate_run = by_name[f"gate-{TEACHER_MODEL}"]
        assert mlflow_ui.tags(teacher_gate_run)["mlflow.note.content"].startswith(teacher_gate["outcome"])
        # the gate run links the version it judged
        judged = rest.run(gate["info"]["run_id"])["inputs"]["model_inputs"]
        student_version = rest.version("student_search", "1")
        model_id = student_version["source"].removeprefix("models:/")
        assert model_id in [m["model_id"] for m in judged]
        # datasets with their real counts, one digest per window
        train = rest.run(pretrain_run_id(by_name))
        datasets = train["inputs"]["dataset_inputs"]
        counts = {d["dataset"]["name"]: {t["key"]: t["value"] for t in d["tags"]}.get("num_examples") for d in datasets}
        assert counts["features/holdout"] == str(json.loads((workspace / "features/holdout/manifest.json")
                                                            .read_text())["counts"]["examples"])
        digests = {}
        for r in runs:
            for d in rest.run(r["info"]["run_id"]).get("inputs", {}).get("dataset_inputs", []):
                digests.setdefault(d["dataset"]["name"], set()).add(d["dataset"]["digest"])
        assert digests and all(len(v) == 1 for v in digests.values()), digests
        provenance(rest, by_name, distill, train)
        # the experiment describes itself; each dataset's drawer shows counts and columns; one window spelling
        experiment = rest.get("/api/2.0/mlflow/experiments/get-by-name", experiment_name=EXPERIMENT)["experiment"]
        assert "gem-pipeline <data> <time>" in mlflow_ui.tags(experiment)["mlflow.note.content"]
        drawers = [d["dataset"] for r in runs for d in rest.run(r["info"]["run_id"]).get("inputs", {}).get(
            "dataset_inputs", [])]
        assert drawers and all(json.loads(d["profile"]) and json.loads(d["schema"])["mlflow_colspec"] for d in drawers)
        assert mlflow_ui.params(train)["data.training.window"].count("..") == 1
        assert not [k for k in mlflow_ui.params(train) if k.endswith(("window_start", "window_end"))]
        # no machine paths in what a person reads: params, tags, version tags, dataset sources
        here = str(workspace.resolve())
        shown = [(r["info"]["run_name"], k, v) for r in runs for k, v in {**mlflow_ui.params(r), **{
            t: v for t, v in mlflow_ui.tags(r).items() if t != "mlflow.note.content"}}.items() if here in str(v)]
        shown += [("gem_teacher v1", k, v) for k, v in mlflow_ui.tags(rest.version(TEACHER_MODEL, "1")).items()
                  if here in str(v)]
        shown += [(d["dataset"]["name"], "source", d["dataset"]["source"]) for r in runs
                  for d in rest.run(r["info"]["run_id"]).get("inputs", {}).get("dataset_inputs", [])
                  if here in d["dataset"]["source"] and "file://" not in d["dataset"]["source"]]
        for name in (TEACHER_MODEL, "student_search"):  # the input examples, relative to the workspace
            model_id = rest.version(name, "1")["source"].removeprefix("models:/")
            example = rest.text(f"/ajax-api/2.0/mlflow/logged-models/{model_id}/artifacts/files",
                                artifact_file_path="input_example.json")
            shown += [(f"{name} v1", "input_example.json", example)] if here in example else []
        assert not shown, shown
        # teacher and student compare column by column: the same holdout names, the surface a tag
        shared = {f"holdout/{k}" for k in tracking.HOLDOUT_FIGURES} - {"holdout/auc"}  # no AUC short of evidence
        assert shared <= set(mlflow_ui.metrics(distill)) & set(mlflow_ui.metrics(train)), (
            sorted(mlflow_ui.metrics(distill)), sorted(mlflow_ui.metrics(train)))
        assert [mlflow_ui.tags(r)[k] for r in (train, distill) for k in (tracking.TAG_MODEL_ROLE, tracking.TAG_SURFACE)
                ] == ["teacher", "all", "student", "search"]
        # the registry: the same words as the gate run; what the model is and how to load it
        assert mlflow_ui.tags(student_version)["gate.decision"] == row["decision"]
        assert mlflow_ui.tags(student_version)["gate.reason"] == row["why"]
        assert "mlflow.pyfunc.load_model" in rest.model("student_search")["description"]
        assert "[gem_teacher v1](#/models/gem_teacher/versions/1)" in student_version["description"]
        # lineage both ways: the teacher version lists its students
        teacher_version = rest.version(TEACHER_MODEL, "1")
        assert mlflow_ui.tags(teacher_version)["gem.students.student_search"] == "1"
        assert "[student_search v1](#/models/student_search/versions/1)" in teacher_version["description"]
        assert "(click, every surface): AUC " in teacher_version["description"]  # its holdout figures
        # the model page's signature
        mlmodel = rest.mlmodel(model_id)
        assert "python_function" in mlmodel and '"name": "features"' in mlmodel and '"name": "p_click"' in mlmodel
        assert "input_example.json" in mlmodel

        # mlflow.pyfunc through the server, scoring the holdout window
        mlflow.set_tracking_uri(url)
        holdout, feast = workspace / "features" / "holdout", workspace / "feast"
        scored = mlflow.pyfunc.load_model("models:/student_search/1").predict(
            pd.DataFrame({"features": [str(holdout)], "feast_repo": [str(feast)]}))
        examples = json.loads((holdout / "manifest.json").read_text())["counts"]["examples"]
        assert len(scored) == examples and set(scored["surface"]) == {"search"}
        assert scored["p_click"].between(0, 1).all() and scored["example_id"].is_unique
        teacher = mlflow.pyfunc.load_model(f"models:/{TEACHER_MODEL}/1")
        first = teacher.predict(pd.DataFrame({"features": [str(holdout)]}), params={"max_examples": 32})
        assert len(first) == 32 and first["p_click"].between(0, 1).all()
        mlflow.set_tracking_uri("")


def pretrain_run_id(by_name: dict) -> str:
    return by_name["train"]["info"]["run_id"]
