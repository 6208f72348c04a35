"""A run killed with SIGKILL mid-training and resumed ends with the same weights as an
uninterrupted run."""

import signal
import subprocess
import time

import pytest
import torch

from tests.training.conftest import ROOT, TINY, gem_env, gem_train_cmd, run_ok

ARGS = ["--features", "synthetic://1024", *TINY, "--set", "checkpoint_every=4", "--set", "log_model=false"]


def _weights(out):
    return torch.load(out / "model" / "weights.pt", weights_only=True)


@pytest.mark.slow(minutes=0.8)
def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_ok(gem_train_cmd(*ARGS, "--out", str(straight)), tmp_path)

    proc = subprocess.Popen(gem_train_cmd(*ARGS, "--out", str(killed)), cwd=ROOT, env=gem_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if latest.is_file() and latest.read_text().strip() >= "step_00000004":
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "model" / "weights.pt").exists()
    killed_at = latest.read_text().strip()

    run_ok(gem_train_cmd(*ARGS, "--out", str(killed), "--resume"), tmp_path)
    a, b = _weights(straight), _weights(killed)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-6, msg=f"{key} (killed at {killed_at})")
    assert (killed / "checkpoints" / "latest").read_text().strip() == "step_00000016"


def test_checkpoint_loads_weights_only_and_rejects_other_world_size(tmp_path):
    from gem.training.checkpoint import Checkpointer

    ckpt = Checkpointer(tmp_path / "ck")
    state = {"a": torch.ones(2), "nested": {"b": [1, 2.5, "x"]}, "rng": torch.get_rng_state()}
    ckpt.save(3, state)
    assert ckpt.latest().name == "step_00000003"
    loaded = ckpt.load()
    torch.testing.assert_close(loaded["a"], state["a"])
    assert loaded["nested"]["b"] == [1, 2.5, "x"]
    import pytest

    with pytest.raises(ValueError, match="rank1.pt: missing"):
        Checkpointer(tmp_path / "ck", rank=1, world_size=2).load()
