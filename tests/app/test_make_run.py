"""`make run` passes DATA and PRESET through to `gem pipeline run` (dry run: nothing executes)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_line(*assignments: str) -> str:
    # -o install: the dry run prints the run recipe alone, whatever the venv's state
    out = subprocess.run(["make", "-n", "-o", "install", "run", *assignments],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "gem pipeline run" in line][-1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_passes_data_and_preset():
    assert run_line("DATA=/data/ciao", "PRESET=tiny").split()[-4:] == ["--data", "/data/ciao", "--preset", "tiny"]
    plain = run_line()
    assert "--preset" not in plain and "--data" not in plain
