"""Atomic, per-rank checkpoints that load with ``torch.load(weights_only=True)``.

Layout: ``<dir>/step_00000100/rank{r}.pt`` plus ``<dir>/latest`` (the newest complete
step). Every rank writes its own file into ``step_*.tmp``; after a barrier rank 0
renames the folder and then rewrites ``latest`` (both atomic renames), so a run killed
at any moment leaves the previous checkpoint intact.

Sharded tensors (torchrec tables and their fused optimizer state) are saved as their
local shards only; loading copies them back in place, so a resume needs the same world
size and sharding plan. Nothing but tensors, numbers, strings, lists and dicts is
stored: no pickled objects.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor

LATEST = "latest"
SHARDS_KEY = "__local_shards__"


def to_plain(obj: Any) -> Any:
    """Replace ShardedTensors by their local shard tensors (recursively); copy tensors."""
    if isinstance(obj, ShardedTensor):
        return {SHARDS_KEY: [s.tensor.detach().clone() for s in obj.local_shards()]}
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_plain(v) for v in obj)
    return obj


def copy_into(current: Any, saved: Any, where: str = "") -> Any:
    """Copy saved values into the current structure in place; returns the structure to
    pass to ``load_state_dict``. Raises ValueError naming the first mismatching key."""
    if isinstance(current, ShardedTensor):
        shards = saved.get(SHARDS_KEY) if isinstance(saved, dict) else None
        local = current.local_shards()
        if shards is None or len(shards) != len(local):
            raise ValueError(f"{where}: checkpoint has {0 if shards is None else len(shards)} local shards, "
                             f"the model {len(local)}; resume needs the same world size and plan")
        for shard, tensor in zip(local, shards):
            shard.tensor.detach().copy_(tensor)
        return current
    if isinstance(current, torch.Tensor):
        if not isinstance(saved, torch.Tensor) or saved.shape != current.shape:
            raise ValueError(f"{where}: shape {getattr(saved, 'shape', type(saved))} in the checkpoint, "
                             f"{tuple(current.shape)} in the model")
        current.detach().copy_(saved)
        return current
    if isinstance(current, dict):
        missing = sorted(set(current) - set(saved)) if isinstance(saved, dict) else ["<not a dict>"]
        if missing:
            raise ValueError(f"{where}: key(s) {missing[:5]} missing from the checkpoint")
        return {k: copy_into(v, saved[k], f"{where}.{k}") for k, v in current.items()}
    return saved


def rng_state() -> dict[str, Any]:
    version, mt_state, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": [version, list(mt_state), gauss],
        "numpy": {"keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    def __init__(self, folder: str | Path, rank: int = 0, world_size: int = 1, keep: int = 2) -> None:
        self.folder, self.rank, self.world_size, self.keep = Path(folder), rank, world_size, keep

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Collective: every rank calls it with its own state."""
        final = self.folder / f"step_{step:08d}"
        tmp = self.folder / f"step_{step:08d}.tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        part = tmp / f"rank{self.rank}.pt.part"
        torch.save(to_plain(state), part)
        with open(part, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(part, tmp / f"rank{self.rank}.pt")
        self._barrier()
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            pointer = self.folder / f"{LATEST}.part"
            pointer.write_text(final.name + "\n")
            os.replace(pointer, self.folder / LATEST)
            self._prune()
        self._barrier()
        return final

    def _prune(self) -> None:
        done = sorted(p for p in self.folder.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def latest(self) -> Path | None:
        pointer = self.folder / LATEST
        if not pointer.is_file():
            return None
        path = self.folder / pointer.read_text().strip()
        return path if path.is_dir() else None

    def load(self, path: Path | None = None) -> dict[str, Any] | None:
        path = path or self.latest()
        if path is None:
            return None
        file = Path(path) / f"rank{self.rank}.pt"
        if not file.is_file():
            raise ValueError(f"{file}: missing; was the checkpoint written by {self.world_size} ranks?")
        return torch.load(file, map_location="cpu", weights_only=True)
