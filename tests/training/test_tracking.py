"""MLflow records params, step and epoch metrics, efficiency figures, the input data,
plots and a loadable model."""

import math

import mlflow
import torch

from gem.training.data import SyntheticLoader, default_synthetic_spec


def test_mlflow_run_contents(single_run):
    out, result, _, _ = single_run
    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    run = client.get_run(result.run_id)
    params = run.data.params
    assert params["train.batch_size"] == "64" and params["model.embedding_dim"] == "16"
    assert int(params["size.total_params"]) > 0 and "data.training.digest" in params
    metrics = run.data.metrics
    for key in ("train/loss", "perf/mfu", "perf/examples_per_s", "perf/startup_seconds",
                "perf/effective_training_time", "eval/auc/all/click", "eval/ne/all/conversion",
                "eval/calibration/feed/click", "train_epoch/auc/all/click"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert 0 < metrics["perf/mfu"] < 1 and 0 < metrics["perf/effective_training_time"] <= 1
    history = client.get_metric_history(result.run_id, "train/loss")
    assert [m.step for m in history] == [5]  # log_every=5 with 8 steps
    # the final evaluation, logged again for the logged model, stays at the run's last step
    # (issue 41: a second point at step 0 drew a flat line across the chart)
    assert {m.step for m in client.get_metric_history(result.run_id, "eval/auc/all/click")} == {result.steps}
    assert "train.tracking_uri" not in params and "train.experiment" not in params  # where, not what
    # the tiny preset's cosine decay over the run's 8 steps: 0.31 of dense_lr after 5
    decayed = 0.5 * (1 + math.cos(math.pi * 5 / 8)) * float(params["train.optim.dense_lr"])
    assert math.isclose(metrics["train/lr"], decayed, rel_tol=1e-5)
    assert run.inputs.dataset_inputs and run.inputs.dataset_inputs[0].dataset.digest == params["data.training.digest"]
    artifacts = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert {"plots/calibration.png", "plots/auc_per_surface.png"} <= artifacts


def test_logged_model_loads_and_matches_export(single_run):
    from gem.training.trainer import load_trained_model

    out, result, _, _ = single_run
    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
    from gem.model.store import load_model

    logged = load_model(f"runs:/{result.run_id}/model").model  # files + digests: nothing unpickled
    version = mlflow.register_model(f"runs:/{result.run_id}/model", "gem-test-registered").version
    registered = load_model(f"models:/gem-test-registered/{version}")
    assert registered.version == f"models:/gem-test-registered/{version}" and registered.run_id == result.run_id
    exported = load_trained_model(out)
    batch = next(iter(SyntheticLoader(default_synthetic_spec(), 64, batch_size=32, seed=5)))
    with torch.no_grad():
        torch.testing.assert_close(logged(batch).logits, exported(batch).logits)
        torch.testing.assert_close(registered.model(batch).logits, exported(batch).logits)
    enc = exported.encode(batch)
    assert enc.user.shape == (32, 16) and enc.item.shape == (32, 16)


def test_training_learns_the_planted_signal(single_run):
    _, result, _, _ = single_run
    # The synthetic click rate depends on item id and surface; 8 steps already beat chance.
    assert result.eval_metrics["eval/auc/all/click"] > 0.55


def test_init_from_a_run_starts_from_its_weights(single_run, tmp_path):
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    out, _, _, _ = single_run
    cfg, model_cfg = load_train_config("tiny", ["system_metrics=false", "measure_peak=false", "log_model=false",
                                                "max_steps=1", "optim.dense_lr=0", "optim.embedding_lr=0"])
    train("synthetic://128", tmp_path / "continued", cfg, model_cfg, init_from=str(out))
    before = torch.load(out / "model" / "weights.pt", weights_only=True)
    after = torch.load(tmp_path / "continued" / "model" / "weights.pt", weights_only=True)
    for key in before:
        torch.testing.assert_close(after[key], before[key], msg=key)


def test_init_from_a_model_with_other_dense_features_names_them(single_run, tmp_path):
    """The champion of a window without counters cannot seed a model of a window with
    them: the refusal says which dense features differ, not a tensor name."""
    import dataclasses

    import pytest

    from gem.features.counters import COUNTER_FEATURES
    from gem.model import build_model, load_model_config
    from gem.model.store import load_state
    from gem.training.trainer import init_weights

    out, _, _, _ = single_run
    _, _, spec, _ = load_state(out / "model")
    counted = dataclasses.replace(spec, dense=list(spec.dense) + list(COUNTER_FEATURES))
    model = build_model(load_model_config("tiny"), counted)
    with pytest.raises(ValueError, match="adds 62: .*counters turned on"):
        init_weights(model, str(out), counted, "the counters window")


def test_window_mfu_is_exact_flops_over_time_and_peak(single_run):
    """Every logged window has a real MFU: its FLOPs per example are the counted FLOPs of
    the batches it trained (steps 2-5: the first step is the warm-up), and MFU = FLOP/s /
    the peak the window was read against (the run's own may rise after its last step)."""
    from gem.model import build_model
    from gem.model.flops import batch_forward_flops
    from gem.training.trainer import make_loader

    out, result, cfg, model_cfg = single_run
    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    history = {key: client.get_metric_history(result.run_id, f"perf/window_{key}")
               for key in ("mfu", "examples_per_s", "model_flops_per_s")}
    assert [m.step for m in history["mfu"]] == [5]
    mfu, rate, flops_rate = (history[k][0].value for k in ("mfu", "examples_per_s", "model_flops_per_s"))
    peak = client.get_metric_history(result.run_id, "perf/window_peak_flops")[0].value
    assert mfu > 0 and math.isclose(mfu, flops_rate / peak, rel_tol=1e-9)
    assert client.get_run(result.run_id).data.metrics["perf/peak_flops"] >= peak  # kept when higher
    loader = make_loader("synthetic://512", cfg, train=True)
    loader.set_epoch(0)
    batches = [b for _, b in zip(range(5), loader)]
    model = build_model(model_cfg, loader.spec)
    counted = sum(3.0 * batch_forward_flops(model, b) for b in batches[1:])
    assert math.isclose(flops_rate / rate, counted / sum(b.batch_size for b in batches[1:]), rel_tol=1e-9)
