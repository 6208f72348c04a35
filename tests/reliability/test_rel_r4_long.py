"""Issue 42 case 4: one user's 205,618 events under max_seq_len 65536 stalled `gem train`
for minutes inside the attention's backward, printing nothing. A window whose histories
may be longer than the kernels' tested range (gem/limits.py) is now refused before any
work unless asked for, the features build warns about it, and training says what it does
before its first step and when that step is done. Each test fails when its fix is removed.

The tiny simulator's histories are short, so the window tests lower the limit
(gem.limits.MAX_TESTED_SEQ_LEN) below them; the synthetic test uses the real one."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gem_app.cli import main
from tests.reliability.test_rel_r4_cli import _refused

LIMIT = 4  # below the tiny window's longest history


@pytest.fixture(scope="module")
def long_window(tiny_dataset, tmp_path_factory) -> Path:
    """The tiny dataset built with max_seq_len 65536 (the case's setting), under a limit
    of LIMIT events."""
    from gem.features.build import build_features
    from tests.features.conftest import tiny_cfg

    out = tmp_path_factory.mktemp("r4long") / "features"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gem.limits.MAX_TESTED_SEQ_LEN", LIMIT)
        build_features(tiny_dataset, out, tiny_cfg(max_seq_len=65536, num_buckets=1, workers=1))
    return out


def test_the_features_build_warns_of_histories_past_the_kernels_range(long_window, tiny_features):
    from gem.limits import longest_stored

    report = json.loads((long_window / "report.json").read_text())
    longest = longest_stored(report["sequence_length"])
    assert longest > LIMIT
    lines = [w for w in report["warnings"] if "tested range" in w]
    assert len(lines) == 1, report["warnings"]
    assert f"longer than {LIMIT:,} events" in lines[0] and "max_seq_len 65536" in lines[0]
    assert "`gem train` refuses this window unless --set allow_long_sequences=true" in lines[0]
    assert f"rebuild with --set max_seq_len={LIMIT}" in lines[0]
    # under the real limit the tiny windows warn of nothing
    plain = json.loads((tiny_features / "report.json").read_text())
    assert not [w for w in plain["warnings"] if "tested range" in w]


def test_train_refuses_a_window_past_the_kernels_range_before_any_work(long_window, tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.setattr("gem.limits.MAX_TESTED_SEQ_LEN", LIMIT)
    out = tmp_path / "run"
    rc = main(["train", "--features", str(long_window), "--out", str(out), "--preset", "tiny"])
    assert rc == 2
    err = _refused(capsys, str(long_window), "max_seq_len 65,536", f"tested range of {LIMIT:,} events",
                   f"--set max_seq_len={LIMIT}", "--set allow_long_sequences=true")
    assert len([line for line in err.splitlines() if line.startswith("error: ")]) == 1
    assert not out.exists()  # refused before the run folder, the model, the MLflow run


def test_the_real_limit_refuses_max_seq_len_8192(tmp_path, capsys):
    rc = main(["train", "--features", "synthetic://128?max_seq_len=8192", "--out", str(tmp_path / "run"),
               "--preset", "tiny"])
    assert rc == 2
    _refused(capsys, "8,192 events", "tested range of 4,096 events", "allow_long_sequences=true")
    assert not (tmp_path / "run").exists()


def test_the_override_trains_and_progress_is_shown_before_and_after_the_first_step(long_window, tmp_path,
                                                                                     monkeypatch, caplog):
    monkeypatch.setattr("gem.limits.MAX_TESTED_SEQ_LEN", LIMIT)
    caplog.set_level(logging.INFO, logger="gem.training.trainer")
    rc = main(["train", "--features", str(long_window), "--out", str(tmp_path / "run"), "--preset", "tiny",
               "--set", "allow_long_sequences=true", "--set", "max_steps=1", "--set", "log_model=false",
               "--set", "measure_peak=false", "--set", "system_metrics=false"])
    assert rc == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "gem.training.trainer"]
    before = [i for i, line in enumerate(lines) if line.startswith("training: batches of 64, histories of up to")]
    after = [i for i, line in enumerate(lines) if line.startswith("first step done in")]
    assert before and after and before[0] < after[0], lines
    assert f"the kernels' tested range: {LIMIT}" in lines[before[0]]


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C during any command: one line naming it and the shell's code for SIGINT (130),
    no KeyboardInterrupt traceback (the case 4 run printed one)."""
    from gem_app import cli

    parser = cli.build_parser()

    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for action in parser._subparsers._group_actions[0].choices.values():
        action.set_defaults(func=interrupted)
    assert cli.main(["train", "--features", "x", "--out", "y"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted: gem train stopped (Ctrl-C)" and "Traceback" not in err


def test_the_synthetic_scheme_spelt_in_gem_limits_is_the_loaders():
    from gem.limits import SYNTHETIC
    from gem.training.data import SYNTHETIC_PREFIX

    assert SYNTHETIC == SYNTHETIC_PREFIX
