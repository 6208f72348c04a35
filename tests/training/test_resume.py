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


def test_checkpoint_roundtrip_refuses_the_old_format_and_foreign_pickles(tmp_path):
    import pickle

    from gem.training.checkpoint import Checkpointer, CheckpointError, SafeReader, rng_state

    ckpt = Checkpointer(tmp_path / "ck")
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "nested": {"b": torch.ones(4)}}
    path = ckpt.save(3, tensors, {"progress": {"step": 3}, "loader": {"position": 1}}, rng_state())
    assert ckpt.latest() == path and path.name == "step_00000003"
    state = ckpt.read_state()
    assert state["progress"] == {"step": 3} and state["world_size"] == 1 and "torch" in state["rng"]
    into = {"a": torch.zeros(2, 3), "nested": {"b": torch.zeros(4)}}
    ckpt.load_tensors(path, into)
    torch.testing.assert_close(into["a"], tensors["a"])
    torch.testing.assert_close(into["nested"]["b"], tensors["nested"]["b"])
    with pytest.raises(CheckpointError, match="does not fit this model"):
        ckpt.load_tensors(path, {"a": torch.zeros(3, 3)})

    (path / ".metadata").write_bytes(pickle.dumps(print))  # anything but DCP's metadata is refused
    with pytest.raises(pickle.UnpicklingError, match="builtins.print is not a DCP metadata class"):
        SafeReader(path).read_metadata()

    old = tmp_path / "old" / "step_00000004"  # the per-rank format before DCP
    old.mkdir(parents=True)
    torch.save({"model": {}}, old / "rank0.pt")
    (old.parent / "latest").write_text(old.name + "\n")
    with pytest.raises(CheckpointError, match=r"per-rank files rank\*\.pt of the format before DCP"):
        Checkpointer(old.parent).read_state()
