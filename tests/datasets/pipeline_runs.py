"""The real `python -m gem pipeline run --preset tiny` on a generated dataset, as a user
runs it: its own process, the console output, the workspace it leaves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gem.config import load_config
from gem.data.simulate import SimulatorConfig, simulate
from gem.utils.evidence import enough_for_auc


def simulated(out: Path) -> Path:
    """The e2e test's base dataset: the tiny simulator preset over 5 days."""
    simulate(load_config(SimulatorConfig, section="simulator", preset="tiny", overrides=["days=5"]), out,
             progress=False)
    return out


def run_pipeline_cli(workspace: Path, data: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gem", "pipeline", "run", "--workspace", str(workspace), "--data", str(data),
           "--preset", "tiny", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def completed(proc: subprocess.CompletedProcess, workspace: Path) -> dict:
    """The run's summary.json, after checking it ended well and printed its table."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mlflow ui --backend-store-uri sqlite:///" in proc.stdout
    summary = json.loads((workspace / "summary.json").read_text())
    for row in summary["surfaces"]:
        assert f"| {row['surface']} |" in proc.stdout
        if row["student"] == "none trained":  # the distill plan skipped it: the gate must refuse it anyway
            assert row["decision"] == "not enough evidence" and row["why"].startswith("no student trained: ")
            assert row["student_auc"] is None
            continue
        assert row["student"].startswith(f"student_{row['surface']} v")
        if enough_for_auc(row["holdout_positives"], row["holdout_negatives"]):
            assert 0.0 <= row["student_auc"] <= 1.0
        else:  # short of evidence: no AUC in summary.json, "n/a" in the table
            assert row["student_auc"] is None
    return summary


def ingested(workspace: Path) -> dict:
    return json.loads((workspace / "ingest.json").read_text())["result"]
