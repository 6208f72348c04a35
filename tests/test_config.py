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
