"""Atomic checkpoints of the whole training state in torch.distributed.checkpoint (DCP),
loadable at any world size.

Layout: ``<dir>/step_00000100/`` holds DCP's files (``.metadata`` and one ``.distcp``
file per rank: each rank writes its own shards, a replicated tensor is written once),
``state.json`` (progress, data position, lr schedule, the dense optimizer's settings)
and ``rng/rank{r}.json``; ``<dir>/latest`` names the newest complete step. The ranks
write into ``step_*.tmp``; after all of them are done rank 0 renames the folder and
then rewrites ``latest`` (both atomic renames), so a run killed at any moment leaves
the previous checkpoint intact.

Resharding: the tables and their fused row-wise Adagrad state are torchrec
ShardedTensors, the dense parameters plain tensors (DDP) or DTensors (FSDP2); DCP stores
each with its global offsets, so a load at another world size or plan reads every
rank's new shards from whichever files hold them. The dense optimizer's state is stored
by parameter name, as its own indices depend on the wrapping. Each rank resumes its own
random stream; at another world size every rank takes rank 0's.

Nothing is unpickled but DCP's own metadata classes: DCP pickles ``.metadata``, which
is read here by an unpickler that admits only those (tensors load weights-only).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata

from gem.errors import UserError

LATEST = "latest"
STATE_FILE = "state.json"
MODEL, EMBEDDING_OPT, DENSE_OPT = "model", "embedding_optimizer", "dense_optimizer"
# prefixes the wrappers add to parameter names (DMP, DDP, FSDP, activation checkpointing)
_WRAPPER_PREFIXES = ("_dmp_wrapped_module.", "module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be resumed by this run (another format or model)."""


def rng_state() -> dict[str, Any]:
    version, mt_state, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state().tolist(), "python": [version, list(mt_state), gauss],
             "numpy": {"keys": np_keys.tolist(), "pos": int(np_pos), "has_gauss": int(np_has_gauss),
                       "gauss": float(np_gauss)}}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np.array(np_state["keys"], dtype=np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def parameter_name(name: str) -> str:
    """A parameter's name in the user's model, whatever wraps it."""
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix):], True
    return name.replace("._checkpoint_wrapped_module", "")


def _optimizer_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    names = {id(p): parameter_name(n) for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def dense_optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, Any]]:
    """The optimizer's per-parameter state keyed by parameter name."""
    state = optimizer.state_dict()["state"]
    return {name: dict(state[i]) for i, name in enumerate(_optimizer_names(model, optimizer)) if i in state}


def _settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.state_dict()["param_groups"]]


class _MetadataUnpickler(pickle.Unpickler):
    ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
               ("pathlib", "Path"), ("collections", "OrderedDict")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED or module.startswith("torch.distributed.checkpoint."):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a DCP metadata class")


class SafeReader(FileSystemReader):
    """DCP's file reader whose metadata unpickler admits only DCP's metadata classes."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with open(Path(self.path) / ".metadata", "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


class Checkpointer:
    def __init__(self, folder: str | Path, rank: int = 0, world_size: int = 1, keep: int = 2) -> None:
        self.folder, self.rank, self.world_size, self.keep = Path(folder), rank, world_size, keep

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def save(self, step: int, tensors: dict[str, Any], state: dict[str, Any], rng: dict[str, Any]) -> Path:
        """Collective. ``tensors``: DCP's state dict (plain, sharded or DTensors); ``state``:
        JSON, written by rank 0 (the same on every rank); ``rng``: this rank's random state."""
        final = self.folder / f"step_{step:08d}"
        tmp = self.folder / f"step_{step:08d}.tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "rng").mkdir(parents=True)
        self._barrier()
        try:
            dcp.save(tensors, storage_writer=FileSystemWriter(tmp, sync_files=True))
        except CheckpointException as exc:  # a BaseException: the rank's own error (a full disk...) raised as itself
            raise _first_failure(exc, self.rank) from exc
        _write_json(tmp / "rng" / f"rank{self.rank}.json", rng)
        if self.rank == 0:
            _write_json(tmp / STATE_FILE, {**state, "world_size": self.world_size})
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

    def read_state(self, path: Path | None = None) -> dict[str, Any] | None:
        """The JSON part of the newest (or the given) checkpoint, with this rank's random
        state under "rng" (rank 0's when the checkpoint had fewer ranks); None: none yet."""
        path = path or self.latest()
        if path is None:
            return None
        if not (path / STATE_FILE).is_file():
            old = " (per-rank files rank*.pt of the format before DCP)" if any(path.glob("rank*.pt")) else ""
            raise CheckpointError(f"{path}: not a checkpoint this version resumes{old}; train anew in another "
                                  "--out, or resume it with the version that wrote it")
        state = json.loads((path / STATE_FILE).read_text())
        own = path / "rng" / f"rank{self.rank}.json"
        saved_here = state.get("world_size") == self.world_size and own.is_file()
        state["rng"] = json.loads((own if saved_here else path / "rng" / "rank0.json").read_text())
        state["path"] = str(path)
        return state

    def load_tensors(self, path: Path, tensors: dict[str, Any]) -> None:
        """Collective: fill ``tensors`` (this rank's state dict, its shards as the current
        plan places them) in place from the checkpoint at ``path``."""
        try:
            dcp.load(tensors, storage_reader=SafeReader(path))
        except (CheckpointException, ValueError, RuntimeError) as exc:  # DCP: every rank's errors in one
            raise CheckpointError(f"{path}: does not fit this model (another config or vocabularies?): "
                                  f"{str(exc).strip().splitlines()[-1][:400]}") from exc

    def metadata(self, path: Path) -> Metadata:
        return SafeReader(path).read_metadata()


def _first_failure(exc: CheckpointException, rank: int) -> BaseException:
    failures = exc.failures
    failure = failures.get(rank) or next(iter(failures.values()), None)
    failure = failure[0] if isinstance(failure, tuple) else failure
    return failure if isinstance(failure, BaseException) else RuntimeError(str(exc))


def _write_json(path: Path, obj: Any) -> None:
    part = path.with_suffix(".part")
    with open(part, "w") as handle:
        json.dump(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(part, path)


def training_tensors(dmp: nn.Module, dense_optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What DCP saves: the model (sharded tables included), the fused embedding
    optimizer's state and the dense optimizer's state by parameter name."""
    return {MODEL: dmp.state_dict(), EMBEDDING_OPT: dmp.fused_optimizer.state_dict()["state"],
            DENSE_OPT: dense_optimizer_tensors(dmp, dense_optimizer)}


def training_settings(dense_optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"dense_optimizer": _settings(dense_optimizer)}


def restore_training(ckpt: Checkpointer, path: Path, dmp: nn.Module, dense_optimizer: torch.optim.Optimizer,
                     settings: list[dict[str, Any]]) -> None:
    """Collective: load the model and both optimizers from ``path`` at this run's world
    size and plan."""
    names = _optimizer_names(dmp, dense_optimizer)
    params = [p for group in dense_optimizer.param_groups for p in group["params"]]
    meta = ckpt.metadata(path).state_dict_metadata
    # the dense optimizer's state is created at its first step: shape it from the checkpoint
    dense: dict[str, dict[str, Any]] = {}
    for name, param in zip(names, params):
        keys = {k.split(".")[-1]: v for k, v in meta.items() if k.startswith(f"{DENSE_OPT}.{name}.")
                and k.count(".") == name.count(".") + 2}
        dense[name] = {key: (torch.zeros_like(param) if tuple(m.size) == tuple(param.shape)
                             else torch.zeros(tuple(m.size), dtype=m.properties.dtype, device=param.device))
                       for key, m in keys.items()}
    dense = {name: state for name, state in dense.items() if state}
    fused = dmp.fused_optimizer.state_dict()
    tensors = {MODEL: dmp.state_dict(), EMBEDDING_OPT: fused["state"], DENSE_OPT: dense}
    ckpt.load_tensors(path, tensors)
    dmp.load_state_dict(tensors[MODEL])
    dmp.fused_optimizer.load_state_dict(fused)
    if len(settings) != len(dense_optimizer.param_groups):
        raise CheckpointError(f"{path}: {len(settings)} dense parameter group(s) saved, "
                              f"{len(dense_optimizer.param_groups)} in this run")
    index = {name: i for i, name in enumerate(names)}
    groups, start = [], 0
    for saved, group in zip(settings, dense_optimizer.param_groups):
        groups.append({**saved, "params": list(range(start, start + len(group["params"])))})
        start += len(group["params"])
    dense_optimizer.load_state_dict({"state": {index[n]: s for n, s in tensors[DENSE_OPT].items()},
                                     "param_groups": groups})
