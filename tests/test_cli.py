"""The single entry point lists every stage, and each has --help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gem_app.cli import COMMANDS

EXPECTED = ["data", "features", "train", "knowledge", "distill", "score", "serve", "pipeline", "refresh"]


def test_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "gem", "--help"], capture_output=True, text=True, check=True).stdout
    assert list(COMMANDS) == EXPECTED
    for name in EXPECTED:
        assert f"    {name}" in out


@pytest.mark.parametrize("command", EXPECTED)
def test_each_command_has_help(command):
    result = subprocess.run([sys.executable, "-m", "gem", command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"python -m gem {command}" in result.stdout


def _run(*args, env=None):
    import os

    return subprocess.run([sys.executable, "-m", "gem", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, names", [
    (["train", "--features", "synthetic://64", "--out", "{tmp}/t", "--preset", "nope"], "unknown train preset 'nope'"),
    (["train", "--features", "synthetic://64", "--out", "{tmp}/t", "--config", "{tmp}/bad.yaml"],
     "bad.yaml: line 3, column 1: not valid YAML"),
    (["train", "--features", "synthetic://64", "--out", "{tmp}/t", "--set", "max_steps=-5"], "max_steps=-5"),
    (["refresh", "--data", "{tmp}/nowhere", "--workspace", "{tmp}/w"], "nowhere/manifest.json: missing"),
], ids=["unknown-preset", "malformed-yaml", "negative-steps", "missing-dataset"])
def test_a_user_error_is_one_or_two_lines_and_exit_2(tmp_path, args, names):
    """Issue 28 item 9: every refused configuration printed a 15-58 line traceback."""
    (tmp_path / "bad.yaml").write_text("epochs: 1\noptim: [1, 2\n")
    args = [a.format(tmp=tmp_path) for a in args]
    result = _run(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert 1 <= len(lines) <= 2 and lines[0].startswith("error: ") and names in result.stderr
    assert "Traceback" not in result.stderr
    if "nope" in args:  # GEM_DEBUG=1 shows the traceback (once: each run starts a process)
        debug = _run(*args, env={"GEM_DEBUG": "1"})
        assert debug.returncode != 0 and "Traceback" in debug.stderr and names in debug.stderr


def test_debug_flag_anywhere_shows_the_traceback():
    from gem_app.cli import main

    with pytest.raises(Exception, match="unknown train preset"):
        main(["train", "--features", "synthetic://64", "--out", "unused", "--preset", "nope", "--debug"])


@pytest.mark.parametrize("args, names", [
    (["features", "build", "d", "o", "--start", "2026-13-01"], "argument --start: '2026-13-01' is not an ISO-8601"),
    (["refresh", "--data", "d", "--first-day", "yesterday"], "argument --first-day: 'yesterday' is not a day"),
    (["score", "--model", "m", "--features", "f", "--out", "o", "--cut", "soon", "--part", "test"], "--cut"),
    (["data", "validate", "d", "--max-quarantine-fraction=nan"], "'nan' is not a fraction"),
    (["data", "validate", "d", "--max-quarantine-fraction=2"], "'2' is not a fraction"),
    (["data", "validate", "d", "--max-quarantine-fraction=-1"], "'-1' is not a fraction"),
    (["pipeline", "run", "--student-days", "-1"], "'-1' is not an integer >= 0"),
    (["pipeline", "run", "--student-overlap-days", "-2"],
     "--student-overlap-days: '-2' is not 'all' or an integer >= 0"),
], ids=["bad-time", "bad-day", "bad-cut", "nan-fraction", "fraction-above-1", "negative-fraction", "negative-days",
        "negative-overlap"])
def test_bad_option_values_are_usage_errors_naming_the_option(args, names, capsys):
    """Issue 28 items 5 and 9: `--max-quarantine-fraction=nan` passed a dataset with 43% of
    its rows quarantined; `-1` printed "allowed -100.0000%"; a bad date was a traceback."""
    from gem_app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2 and names in capsys.readouterr().err


def test_window_evidence_settings_are_checked_before_any_work(tmp_path, capsys):
    from gem_app.cli import main

    workspace = tmp_path / "ws"
    assert main(["pipeline", "run", "--workspace", str(workspace), "--evidence", "positives=0"]) == 2
    assert "examples (200) and positives (0) must be >= 1" in capsys.readouterr().err
    assert main(["pipeline", "run", "--workspace", str(workspace), "--evidence", "clicks=5"]) == 2
    assert "unknown setting(s) ['clicks']" in capsys.readouterr().err
    assert not workspace.exists()
