"""Process group and torchrec model parallelism.

Every run, one process or many, wraps the model in ``DistributedModelParallel``:
embedding tables are sharded by the planner (restricted to sharding types that work
on the current device) with a fused row-wise Adagrad applied in backward; the dense
part is replicated and data parallel (DDP), or sharded with FSDP2 (``sharding.dense``:
"shard"). A single process uses a world of one, so a one-process
run and a torchrun run execute the same code, except DDP itself: across one rank its
all-reduce changes nothing, yet its bucket copies and the division by the world size
cost 8-15% of a small-preset step on 2 CPU cores, so a world of one goes without.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import PlannerError
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from gem.model.embeddings import SparseArch
from gem.training import local_lookup
from gem.training.config import DENSE_MODES
from gem.training.planning import MIB, ROW_WISE, PlanRefused, check_budget, describe_plan, sharding_types, table_sizes

EBC_SHARDING_TYPES = ("table_wise", "column_wise", "table_column_wise", "data_parallel", "row_wise")
EC_SHARDING_TYPES = ("table_wise", "column_wise", "row_wise")


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    launched: bool  # under torchrun

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto") -> DistEnv:
    """Join torchrun's process group, or make a world of one (gloo on CPU, nccl on GPU)."""
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        if launched:
            dist.init_process_group(backend, timeout=dt.timedelta(minutes=10))
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, dev, backend, launched)


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def attach_embedding_optimizer(model: nn.Module, lr: float, eps: float = 1e-8) -> None:
    """Row-wise Adagrad on every torchrec table, run inside backward (fused by the sharder)."""
    for arch in (m for m in model.modules() if isinstance(m, SparseArch)):
        for module in arch.tables():
            apply_optimizer_in_backward(RowWiseAdagrad, module.parameters(), {"lr": lr, "eps": eps})


class _RowWiseBagSharder(EmbeddingBagCollectionSharder):
    """Also offers row-wise sharding of pooled tables on CPU (torchrec lists it for CUDA
    only; it runs on CPU/gloo), for tables larger than a rank's memory cap."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = super().sharding_types(compute_device_type)
        return types if ROW_WISE in types else [*types, ROW_WISE]


def shard_model(model: nn.Module, env: DistEnv, *, ebc_sharding: str = "table_wise",
                ec_sharding: str = "table_wise", rank_memory_bytes: int = 0,
                batch_size: int | None = None, dense: str = "replicate") -> DistributedModelParallel:
    """``rank_memory_bytes``: each rank's cap for its tables and their optimizer state
    (0: the device's memory); larger tables go row-wise, an impossible cap is refused
    (PlanRefused) before anything is sharded. ``batch_size``: per rank; the planner sizes
    each shard's input and output buffers by it (its default: 512). ``dense``: "replicate"
    (DDP: every rank holds the whole dense part) or "shard" (FSDP2: each rank a 1/world
    slice of its parameters, gradients and optimizer state)."""
    if dense not in DENSE_MODES:
        raise ValueError(f"dense={dense!r} must be one of {DENSE_MODES}")
    if ebc_sharding not in EBC_SHARDING_TYPES:
        raise ValueError(f"ebc_sharding={ebc_sharding!r} must be one of {EBC_SHARDING_TYPES}")
    if ec_sharding not in EC_SHARDING_TYPES:
        raise ValueError(f"ec_sharding={ec_sharding!r} must be one of {EC_SHARDING_TYPES}")
    tables = table_sizes(model)
    check_budget(tables, env.world_size, rank_memory_bytes)
    kinds = sharding_types(tables, rank_memory_bytes, ebc_sharding, ec_sharding)
    constraints = {name: ParameterConstraints(sharding_types=[kind]) for name, kind in kinds.items()}
    sharders = [_RowWiseBagSharder(), EmbeddingCollectionSharder()]
    cap = {"hbm_cap" if env.device.type == "cuda" else "ddr_cap": rank_memory_bytes} if rank_memory_bytes else {}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=env.world_size, compute_device=env.device.type, **cap),
        constraints=constraints,
        batch_size=batch_size,
        # the cap is for the tables: no share of it set aside for the dense part
        storage_reservation=FixedPercentageStorageReservation(0.0) if rank_memory_bytes else None,
    )
    try:
        plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    except PlannerError as exc:
        if not rank_memory_bytes:
            raise
        raise PlanRefused(f"sharding.rank_memory_mib={rank_memory_bytes / MIB:.4g}: the planner found no plan "
                          f"that fits ({str(exc).strip().splitlines()[0][:300]})") from exc
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if env.world_size == 1:
        wrapper = _NoDataParallel()
    elif dense == "shard":
        wrapper = _FullyShardDense()
    else:
        # static_graph=False: with DMP's default (True) the first step's dense gradients were
        # left unreduced on CPU/gloo (ranks diverged from the first step).
        wrapper = DefaultDataParallelWrapper(static_graph=False)
    dmp = DistributedModelParallel(module=model, device=env.device, plan=plan, sharders=sharders,
                                   data_parallel_wrapper=wrapper)
    load_unsharded_state(dmp, initial)
    dmp.plan_rows = describe_plan(plan, tables)
    local_lookup.install(dmp, env.world_size)
    return dmp


class _FullyShardDense(DataParallelWrapper):
    """FSDP2 over the dense part, the torchrec tables left out: each InterFormer layer and
    the heads are units of their own (one all-gather and reduce-scatter each), the rest of
    the dense parameters go with the root."""

    def wrap(self, dmp: DistributedModelParallel, env, device: torch.device) -> None:
        module = dmp._dmp_wrapped_module
        sharded = set(DistributedModelParallel._sharded_parameter_names(module))
        ignored = {p for name, p in module.named_parameters() if name in sharded}
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in [*getattr(module, "layers", []), getattr(module, "heads", None)]:
            if block is not None:
                fully_shard(block, mesh=mesh)
        fully_shard(module, mesh=mesh, ignored_params=ignored)


class _NoDataParallel(DataParallelWrapper):
    """Leaves the dense part as it is (a world of one has nothing to reduce)."""

    def wrap(self, dmp: DistributedModelParallel, env, device: torch.device) -> None:
        pass


def load_unsharded_state(dmp: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Copy full (unsharded) tensors into a DMP model's shards. Sharded modules start
    from their own random init, so without this the initial tables would depend on the
    world size and plan."""
    state = dmp.state_dict()
    for key, value in state.items():
        if key not in full:
            raise ValueError(f"{key}: missing from the unsharded state (keys like {list(full)[:3]})")
        if isinstance(value, DTensor):  # FSDP2: this rank's slice of the full tensor
            mine = distribute_tensor(full[key], value.device_mesh, value.placements).to_local()
            value.to_local().detach().copy_(mine)
        elif isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                rows, cols = shard.metadata.shard_offsets
                num_rows, num_cols = shard.metadata.shard_sizes
                shard.tensor.detach().copy_(full[key][rows:rows + num_rows, cols:cols + num_cols])
        else:
            value.detach().copy_(full[key])
    dmp.load_state_dict(state)


def dense_memory(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's bytes of the dense part: its parameters and their optimizer state (the
    local slices under FSDP2)."""
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = [v for p in params for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
    return {"memory/dense_param_bytes": sum(local(p).numel() * p.element_size() for p in params),
            "memory/dense_optimizer_bytes": sum(local(v).numel() * v.element_size() for v in state)}


def unwrap(model: nn.Module) -> nn.Module:
    """The user module inside DMP (and DDP)."""
    while hasattr(model, "module") or hasattr(model, "_dmp_wrapped_module"):
        model = getattr(model, "_dmp_wrapped_module", None) or model.module
    return model
