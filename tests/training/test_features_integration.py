"""Training on a real features build (simulator -> gem.features -> FeatureLoader)."""

import pytest


@pytest.fixture(scope="module")
def features_dir(tiny_dataset, tmp_path_factory):
    from gem.config import load_config
    from gem.features.build import build_features
    from gem.features.config import FeaturesConfig

    out = tmp_path_factory.mktemp("train-features") / "feat"
    build_features(tiny_dataset, out, load_config(FeaturesConfig, section="features", preset="tiny"))
    return out


def test_train_and_evaluate_on_features(features_dir, tmp_path):
    import json

    import mlflow

    from gem.training.config import load_train_config
    from gem.training.trainer import train_and_evaluate
    from gem.utils.digest import lineage_digest

    cfg, model_cfg = load_train_config("tiny", ["system_metrics=false", "measure_peak=false", "batch_size=32",
                                                "max_steps=6", "log_model=false", "eval_batches=4",
                                                f"tracking_uri=sqlite:///{tmp_path / 'm.db'}"])
    metrics = train_and_evaluate(str(features_dir), str(features_dir), model_cfg, cfg)
    assert metrics["steps"] == 6
    assert metrics["count/all/click"] > 0 and "logloss/all/click" in metrics
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    run = client.search_runs([client.get_experiment_by_name("gem-pretrain").experiment_id])[0]
    # Same directory for both: MLflow keeps one dataset input; both digests are params.
    assert run.inputs.dataset_inputs[0].dataset.digest == run.data.params["data.training.digest"]
    assert run.data.params["data.evaluation.digest"] == run.data.params["data.training.digest"]
    manifest = json.loads((features_dir / "manifest.json").read_text())
    assert run.data.params["data.training.digest"] == lineage_digest(manifest["digest"])
