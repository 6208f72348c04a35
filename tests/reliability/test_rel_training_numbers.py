"""Issue 28, item 6: training that diverges or never trains. A non-finite loss stops the
run at that step, naming it and the settings to check, before anything is exported; a
run that would take no step, or learn from a zero loss, is refused before training."""

from __future__ import annotations

import pytest

from gem.config import ConfigError
from gem.training.config import load_train_config
from gem.training.step import TrainingDiverged

QUIET = ["measure_peak=false", "system_metrics=false", "log_model=false"]


@pytest.mark.parametrize("engine", ["native", "lightning"])
def test_a_diverging_run_stops_at_its_first_non_finite_loss_and_exports_nothing(engine, tmp_path):
    """Before: `--set optim.dense_lr=1e9` logged `loss nan` and went on until an
    IndexError in metrics.py."""
    from gem.training.cli import register  # noqa: F401  (the CLI module imports cleanly)
    from gem.training.lightning_module import train_lightning
    from gem.training.trainer import train

    cfg, model_cfg = load_train_config("tiny", ["optim.dense_lr=1e9", f"engine={engine}", *QUIET])
    run = train if engine == "native" else train_lightning
    with pytest.raises(TrainingDiverged, match=r"training stopped at step \d+: the loss is nan") as err:
        run("synthetic://512", tmp_path / "run", cfg, model_cfg)
    assert "optim.dense_lr (now 1e+09)" in str(err.value)
    step = int(str(err.value).split("step ")[1].split(":")[0])
    assert 1 <= step <= 3  # the first bad step, not the end of the epoch (8 steps)
    assert not (tmp_path / "run" / "model").exists()


def test_a_window_without_one_full_batch_is_refused_before_training(tiny_features, tmp_path):
    """No step would run (training drops the last partial batch): an untrained model
    would have been exported with rc 0."""
    from gem.features.loader import FeatureLoader
    from gem.training.trainer import train

    examples = FeatureLoader(tiny_features, batch_size=64).num_examples
    cfg, model_cfg = load_train_config("tiny", [f"batch_size={examples + 1}", *QUIET])
    with pytest.raises(ConfigError, match=f"{examples:,} training example.*not one full batch of batch_size"):
        train(str(tiny_features), tmp_path / "run", cfg, model_cfg)
    assert not (tmp_path / "run" / "model").exists()


def test_weights_that_zero_every_task_the_data_has_are_refused(tmp_path):
    """task_weights=[0, 1] on data without a conversion learns nothing a label says, as
    [0, 0] does."""
    from gem.data.simulate import SimulatorConfig, simulate
    from gem.features.build import build_features
    from gem.features.loader import FeatureLoader
    from gem.training.trainer import check_trainable
    from tests.features.conftest import tiny_cfg

    data = tmp_path / "clicks-only"
    simulate(SimulatorConfig(users=120, items=240, days=2, topics=4, advertisers=10, conversion_bias=-60.0,
                             workers=1), data, progress=False)
    features = tmp_path / "features"
    build_features(data, features, tiny_cfg(max_seq_len=8, num_buckets=1, workers=1))
    loader = FeatureLoader(features, batch_size=16)
    assert loader.manifest["dataset"]["data_tasks"] == ["click"]
    cfg, _ = load_train_config("tiny", ["task_weights=[0, 1]", "batch_size=16"])
    with pytest.raises(ConfigError, match=r"task_weights=\[0.0, 1.0\]: the tasks of .* \(click\) all weigh 0"):
        check_trainable(cfg, loader, str(features))
    check_trainable(load_train_config("tiny", ["task_weights=[1, 0]", "batch_size=16"])[0], loader, str(features))


def test_the_deferred_guard_of_an_accelerator_names_the_first_bad_step():
    """On a GPU (or several ranks) the guard keeps the first bad step as a tensor and
    reads it at check points; its logic, run here on CPU tensors."""
    import torch

    from gem.training.step import LossGuard

    cfg, _ = load_train_config("tiny")
    guard = LossGuard(cfg, torch.device("cpu"))
    guard.at_once = False  # the accelerator's path (no device here)
    guard.observe(torch.tensor(0.7), 1)
    guard.check()
    for step, loss in ((2, 0.6), (3, float("nan")), (4, 0.5), (5, float("inf"))):
        guard.observe(torch.tensor(loss), step)
    with pytest.raises(TrainingDiverged, match="training stopped at step 3: the loss is NaN or infinite"):
        guard.check()
