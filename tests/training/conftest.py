import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Small, fast, deterministic settings shared by the CLI runs of these tests.
TINY = ["--preset", "tiny", "--set", "system_metrics=false", "--set", "measure_peak=false"]


def gem_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["GEM_CACHE_DIR"] = str(tmp_path / "cache")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def gem_train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gem", "train", *args]


def run_ok(cmd: list[str], tmp_path: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=gem_env(tmp_path), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="session")
def single_run(tmp_path_factory):
    """One in-process tiny run with MLflow on, shared by the tracking and parity tests."""
    import mlflow

    from gem.training.config import load_train_config
    from gem.training.trainer import train

    out = tmp_path_factory.mktemp("single")
    os.environ["GEM_CACHE_DIR"] = str(out / "cache")
    # this process used another store first and left its second experiment active (an id
    # the training store's experiment does not have): training must still log its model
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path_factory.mktemp('other') / 'mlflow.db'}")
    mlflow.create_experiment("first")
    mlflow.set_experiment("second")
    cfg, model_cfg = load_train_config("tiny", ["system_metrics=false", "sharding.ec=row_wise"])
    result = train("synthetic://512", out, cfg, model_cfg, eval_features="synthetic://256")
    return out, result, cfg, model_cfg
