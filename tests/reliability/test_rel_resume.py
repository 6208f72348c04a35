"""Defect 2: resume is exact at any point, including after the last step: a finished run
resumed does no step and keeps its weights; a run killed after any checkpoint (an
epoch's last batch, the final one, before export) resumed ends with the weights of the
uninterrupted run. Runs on a features build (the FeatureLoader rewinds at an epoch's
end, which made a finished run train one more epoch) over two epochs."""

from __future__ import annotations

import shutil

import pytest
import torch

from gem.training.checkpoint import LATEST

# 2 epochs of 4 steps; checkpoint_every=3 leaves the last step to the save after the loop
# (where the FeatureLoader has rewound), =2 puts a save on each epoch's last batch
OVERRIDES = ["system_metrics=false", "measure_peak=false", "log_model=false", "epochs=2", "batch_size=256",
             "keep_checkpoints=100", "log_every=0", "model.attention_backend=padded"]


def _weights(out):
    return torch.load(out / "model" / "weights.pt", weights_only=True)


def _same(a, b, what):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=f"{key} ({what})")


@pytest.fixture(scope="module", params=[3, 2], ids=["save-after-loop", "save-at-epoch-end"])
def finished_run(request, tiny_features, tmp_path_factory):
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    cfg, model_cfg = load_train_config("tiny", OVERRIDES + [f"checkpoint_every={request.param}"])
    out = tmp_path_factory.mktemp("resume") / "straight"
    result = train(str(tiny_features), out, cfg, model_cfg)
    return out, result, cfg, model_cfg


def _steps(out):
    return sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*") if p.is_dir())


def test_resuming_a_finished_run_does_no_step_and_keeps_its_weights(finished_run, tiny_features, tmp_path):
    from gem.training.trainer import train

    out, result, cfg, model_cfg = finished_run
    copy = tmp_path / "again"
    shutil.copytree(out, copy)
    again = train(str(tiny_features), copy, cfg, model_cfg, resume=True)
    assert again.steps == result.steps
    _same(_weights(out), _weights(copy), "resumed after the end")
    assert _steps(copy) == _steps(out)  # no checkpoint beyond the last step


def test_killed_after_any_checkpoint_then_resumed_matches_uninterrupted(finished_run, tiny_features, tmp_path):
    from gem.training.trainer import train

    out, result, cfg, model_cfg = finished_run
    steps = _steps(out)
    assert result.steps == 8 and result.steps in steps
    for killed_at in steps:  # 3, 6, 8 (the save after the loop) or 2, 4 (an epoch's end), 6, 8
        run = tmp_path / f"killed-{killed_at}"
        shutil.copytree(out, run)
        shutil.rmtree(run / "model")  # killed before the export: what kill -9 leaves
        for later in steps:
            if later > killed_at:
                shutil.rmtree(run / "checkpoints" / f"step_{later:08d}")
        (run / "checkpoints" / LATEST).write_text(f"step_{killed_at:08d}\n")
        resumed = train(str(tiny_features), run, cfg, model_cfg, resume=True)
        assert resumed.steps == result.steps, f"killed at {killed_at}"
        _same(_weights(out), _weights(run), f"killed at step {killed_at}")


def test_a_checkpoint_of_another_mlflow_run_is_not_resumed():
    """The train stage starts a new MLflow run when its inputs, settings or code change
    (MLFLOW_RUN_ID); resuming the old run's finished checkpoint did no step, logged the
    model to the old run and failed with "finished without logging its model"."""
    from gem.training.trainer import resumable

    saved = {"progress": {"run_id": "old", "finished": True}}
    assert resumable(saved, "old") and resumable(saved, "")  # the same run, or no run asked for
    assert not resumable(saved, "new")
    assert resumable({"progress": {"run_id": ""}}, "new")  # a checkpoint written without tracking


def test_a_new_mlflow_run_trains_anew_over_a_finished_run_of_another(finished_run, tiny_features, tmp_path,
                                                                      monkeypatch):
    """The trainer itself: a finished run's folder, and the train stage's new run in
    MLFLOW_RUN_ID. Before, it resumed the old run (no step) under the old run's id."""
    from mlflow import MlflowClient

    from gem.training.trainer import train

    out, result, cfg, model_cfg = finished_run
    copy = tmp_path / "new-run"
    shutil.copytree(out, copy)
    client = MlflowClient(tracking_uri=f"sqlite:///{(copy / 'mlflow.db').resolve()}")
    experiment = client.get_experiment_by_name(cfg.experiment).experiment_id
    new_run = client.create_run(experiment, run_name="train").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", new_run)
    again = train(str(tiny_features), copy, cfg, model_cfg, resume=True)
    assert again.run_id == new_run != result.run_id
    assert again.steps == result.steps and client.get_run(new_run).data.metrics  # trained and logged anew
