"""The holdout predictions a training run keeps (gem.training.eval_predictions) and the
teacher gate that reads them instead of scoring the same weights again: read only when
the weights' and the window's digests match, and the decision equals the one taken on
the teacher scored anew."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest


@pytest.fixture(scope="module")
def features_dir(tiny_dataset, tmp_path_factory):
    from gem.config import load_config
    from gem.features.build import build_features
    from gem.features.config import FeaturesConfig

    out = tmp_path_factory.mktemp("kept-features") / "feat"
    build_features(tiny_dataset, out, load_config(FeaturesConfig, section="features", preset="tiny"))
    return out


def _train(features_dir, out, *overrides):
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    cfg, model_cfg = load_train_config("tiny", ["system_metrics=false", "measure_peak=false", "batch_size=32",
                                                "max_steps=6", "log_model=false", "threads=1",
                                                f"tracking_uri=sqlite:///{out / 'm.db'}", *overrides])
    train(str(features_dir), out, cfg, model_cfg, eval_features=str(features_dir))
    return out


@pytest.fixture(scope="module")
def trained(features_dir, tmp_path_factory):
    return _train(features_dir, tmp_path_factory.mktemp("kept-run"))


def test_training_keeps_every_holdout_prediction_of_its_exported_weights(trained, features_dir):
    from gem.model.store import load_model, verify
    from gem.training.eval_predictions import EVAL_PREDICTIONS, read_kept
    from gem.training.pyfunc import predict_window

    digest = verify(trained / "model")
    labels, probs = read_kept(trained / EVAL_PREDICTIONS, model_digest=digest, features_dir=features_dir,
                              task="click")
    stored = load_model(trained)
    scored = predict_window(stored.model, stored.spec, features_dir)
    order = np.argsort(scored["example_id"])
    assert len(probs) == len(order) == json.loads((features_dir / "manifest.json").read_text())["counts"]["examples"]
    import pyarrow.parquet as pq

    ids = pq.read_table(trained / EVAL_PREDICTIONS).column("example_id").to_numpy()
    kept_order = np.argsort(ids)
    np.testing.assert_array_equal(ids[kept_order], scored["example_id"][order])
    np.testing.assert_array_equal(labels[kept_order], scored["labels"][order, 0])
    np.testing.assert_allclose(probs[kept_order], scored["probs"][order, 0], rtol=0, atol=1e-6)


def test_kept_predictions_are_read_only_for_the_same_weights_and_window(trained, features_dir, tmp_path):
    from gem.model.store import verify
    from gem.training.eval_predictions import EVAL_PREDICTIONS, read_kept

    path, digest = trained / EVAL_PREDICTIONS, verify(trained / "model")
    assert read_kept(path, model_digest=digest, features_dir=features_dir, task="click") is not None
    assert read_kept(path, model_digest="0" * 64, features_dir=features_dir, task="click") is None
    other = tmp_path / "other-window"  # the same files under another content digest
    shutil.copytree(features_dir, other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "digest": "f" * 64}))
    assert read_kept(path, model_digest=digest, features_dir=other, task="click") is None
    assert read_kept(tmp_path / "missing.parquet", model_digest=digest, features_dir=features_dir,
                     task="click") is None


def test_no_predictions_kept_when_evaluation_stops_early(features_dir, tmp_path):
    from gem.training.eval_predictions import EVAL_PREDICTIONS

    out = _train(features_dir, tmp_path, "eval_batches=1")
    assert (out / "model" / "weights.pt").is_file() and not (out / EVAL_PREDICTIONS).exists()


def test_the_teacher_gate_reads_them_only_when_the_digests_match(trained, features_dir, tmp_path, monkeypatch):
    import mlflow
    import torch

    from gem import registry, tracking
    from gem.model.store import load_model, log_model
    from gem.training import pyfunc
    from gem.training.eval_predictions import EVAL_PREDICTIONS
    from gem.training.trainer import export_model
    from gem_app.stages import gate
    from gem_app.stages.context import RunContext

    ctx = RunContext(pipeline_run_id="", tracking_root=str(tmp_path / "store"))
    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    other = tmp_path / "other"  # the same model with other weights: version 2
    state = {k: v + 0.01 if v.is_floating_point() else v
             for k, v in torch.load(trained / "model" / "weights.pt", weights_only=True).items()}
    stored = load_model(trained)
    export_model(state, stored.config, stored.spec, other)
    with mlflow.start_run():
        log_model(trained, registered_name=registry.TEACHER_MODEL)
        log_model(other, registered_name=registry.TEACHER_MODEL)
    kept = str(trained / EVAL_PREDICTIONS)

    scoring = pyfunc.predict_window
    calls = []
    monkeypatch.setattr(pyfunc, "predict_window", lambda *a, **k: calls.append(a[2]) or scoring(*a, **k))
    read = gate.gate_teacher("1", str(features_dir), ctx, kept=kept)
    assert calls == []  # version 1's own predictions: read, not scored
    scored = gate.gate_teacher("1", str(features_dir), ctx)
    assert len(calls) == 1
    assert read["outcome"] == scored["outcome"] and read["reason"] == scored["reason"]
    for key, value in scored["surfaces"][0]["challenger"].items():
        assert read["surfaces"][0]["challenger"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    # version 2's weights are not the ones the file names: scored, exactly as without it
    labels, probs = gate.teacher_predictions(registry.model_uri(registry.TEACHER_MODEL, "2"), str(features_dir), kept)
    assert len(calls) == 2
    again = gate.teacher_predictions(registry.model_uri(registry.TEACHER_MODEL, "2"), str(features_dir))
    np.testing.assert_array_equal(probs, again[1])
    np.testing.assert_array_equal(labels, again[0])
