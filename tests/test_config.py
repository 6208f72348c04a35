"""Typed config: defaults < preset < YAML file < overrides; clear errors."""

from __future__ import annotations

import pytest

from gem.config import ConfigError, flatten, load_config
from gem.data.simulate import SimulatorConfig


def test_layers_in_priority_order(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("users: 111\ndays: 2\n")
    cfg = load_config(SimulatorConfig, section="simulator", preset="tiny", path=path,
                      overrides=["days=9", "ad_rate_by_surface=[0.1, 0.1, 0.1, 0.1]"])
    assert (cfg.users, cfg.days, cfg.items) == (111, 9, 600)  # file > preset, override > file
    assert cfg.ad_rate_by_surface == (0.1, 0.1, 0.1, 0.1)
    assert flatten(cfg)["users"] == 111


def test_unknown_key_and_bad_type_are_named():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['userz'\]"):
        load_config(SimulatorConfig, overrides=["userz=3"])
    with pytest.raises(ConfigError, match=r"users: expected int, got 'many'"):
        load_config(SimulatorConfig, overrides=["users=many"])
    with pytest.raises(ConfigError, match="unknown simulator preset 'huge'"):
        load_config(SimulatorConfig, section="simulator", preset="huge")


def test_numbers_in_exponent_form_parse_as_floats_from_set_and_yaml(tmp_path):
    """Issue 28 item 8: `--set optim.dense_lr=1e-4` was refused ("expected float,
    got '1e-4'"): YAML 1.1 reads an exponent without a dot as a string."""
    from gem.training.config import load_train_config

    cfg, _ = load_train_config("tiny", ["optim.dense_lr=1e-4", "optim.embedding_eps=2E-10"])
    assert cfg.optim.dense_lr == 1e-4 and cfg.optim.embedding_eps == 2e-10
    path = tmp_path / "train.yaml"
    path.write_text("optim:\n  dense_lr: 3e-5\n")
    assert load_train_config("tiny", path=str(path))[0].optim.dense_lr == 3e-5
    with pytest.raises(ConfigError, match="optim.dense_lr: expected float, got '1e-4x'"):
        load_train_config("tiny", ["optim.dense_lr=1e-4x"])


@pytest.mark.parametrize("override, message", [
    ("optim.dense_lr=.nan", "optim.dense_lr: expected a finite number"),
    ("optim.dense_lr=nan", "expected float, got 'nan'"),
    ("optim.dense_lr=.inf", "expected a finite number"),
    ("optim.dense_lr=-1e-3", r"optim.dense_lr=-0.001: must be >= 0"),
    ("max_steps=-5", "max_steps=-5: must be >= 0"),
    ("epochs=0", "epochs=0: must be > 0"),
    ("batch_size=-1", "batch_size=-1: must be > 0"),
    ("task_weights=[0, 0]", r"every task weighs 0"),
    ("task_weights=[-1, 1]", r"task_weights=\[-1.0, 1.0\]: must be >= 0"),
    ("optim.min_lr_ratio=2", "optim.min_lr_ratio=2.0: must be >= 0 and <= 1"),
    ("optim.betas=[0.9, 1.5]", "optim.betas"),
    ("optim.lr_decay=step", "optim.lr_decay='step' must be one of"),
], ids=["nan-yaml", "nan-word", "inf", "negative-lr", "negative-steps", "zero-epochs", "negative-batch",
        "zero-task-weights", "negative-task-weight", "lr-ratio-above-1", "beta-above-1", "unknown-decay"])
def test_training_numbers_are_range_checked_before_any_work(override, message):
    """Issue 28 item 6: max_steps=-5 wrote an untrained model, task_weights=[0,0]
    trained on a zero loss, both with rc 0."""
    from gem.training.config import TrainConfig, load_train_config

    with pytest.raises(ConfigError, match=message):
        load_train_config("tiny", [override])
    if override.startswith("max_steps"):  # a config built in code is checked by validate() too
        with pytest.raises(ConfigError, match="max_steps=-5"):
            TrainConfig(max_steps=-5).validate()


def test_simulator_and_student_settings_are_range_checked():
    from gem.data.simulate import simulate
    from students.config import DistillConfig

    with pytest.raises(ConfigError, match=r"ad_fraction_of_items=1.5: must be >= 0 and <= 1"):
        load_config(SimulatorConfig, overrides=["ad_fraction_of_items=1.5"])
    with pytest.raises(ConfigError, match="users=0: must be >= 1"):
        simulate(SimulatorConfig(users=0), "unused-folder")
    with pytest.raises(ConfigError, match=r"optim.lr=-0.1: must be > 0"):
        load_config(DistillConfig, overrides=["optim.lr=-0.1"])


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("users: 10\ndays: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+, column \d+: not valid YAML"):
        load_config(SimulatorConfig, path=path)


def test_dates_in_yaml_are_strings_of_the_config_and_a_bad_one_is_named(tmp_path):
    """YAML reads 2026-01-05 as a date (the str field took it as a type error) and
    2026-13-05 as a ValueError traceback (issue 28 item 9: a bad date)."""
    from gem.data.simulate import simulate

    assert load_config(SimulatorConfig, overrides=["start_date=2026-01-05"]).start_date == "2026-01-05"
    with pytest.raises(ConfigError, match=r"override 'start_date=2026-13-05': not a valid value \(month"):
        load_config(SimulatorConfig, overrides=["start_date=2026-13-05"])
    path = tmp_path / "sim.yaml"
    path.write_text("start_date: 2026-13-05\n")
    with pytest.raises(ConfigError, match=r"sim.yaml: not valid YAML \(month must be in 1..12\)"):
        load_config(SimulatorConfig, path=path)
    with pytest.raises(ConfigError, match="start_date='2026-1-5x' is not an ISO-8601 day"):
        simulate(SimulatorConfig(start_date="2026-1-5x"), tmp_path / "never")
    assert not (tmp_path / "never").exists()
