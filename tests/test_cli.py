"""The single entry point lists every stage, and each has --help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gem_app.cli import COMMANDS

EXPECTED = ["data", "features", "train", "knowledge", "distill", "score", "pipeline", "refresh"]


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
