"""Process group and torchrec model parallelism.

Every run, one process or many, wraps the model in ``DistributedModelParallel``:
embedding tables are sharded by the planner (restricted to sharding types that work
on the current device) with a fused row-wise Adagrad applied in backward; the dense
part is data parallel (DDP). A single process uses a world of one, so a one-process
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
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from gem.model.embeddings import SparseArch

EBC_SHARDING_TYPES = ("table_wise", "column_wise", "table_column_wise", "data_parallel")
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


def shard_model(model: nn.Module, env: DistEnv, *, ebc_sharding: str = "table_wise",
                ec_sharding: str = "table_wise") -> DistributedModelParallel:
    if ebc_sharding not in EBC_SHARDING_TYPES:
        raise ValueError(f"ebc_sharding={ebc_sharding!r} must be one of {EBC_SHARDING_TYPES}")
    if ec_sharding not in EC_SHARDING_TYPES:
        raise ValueError(f"ec_sharding={ec_sharding!r} must be one of {EC_SHARDING_TYPES}")
    constraints = {}
    for arch in (m for m in model.modules() if isinstance(m, SparseArch)):
        for table in arch.tables():
            bags = isinstance(table, EmbeddingBagCollection)
            for cfg in table.embedding_bag_configs() if bags else table.embedding_configs():
                constraints[cfg.name] = ParameterConstraints(sharding_types=[ebc_sharding if bags else ec_sharding])
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=env.world_size, compute_device=env.device.type),
        constraints=constraints,
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # static_graph=False: with DMP's default (True) the first step's dense gradients were
    # left unreduced on CPU/gloo (ranks diverged from the first step).
    wrapper = DefaultDataParallelWrapper(static_graph=False) if env.world_size > 1 else _NoDataParallel()
    dmp = DistributedModelParallel(module=model, device=env.device, plan=plan, sharders=sharders,
                                   data_parallel_wrapper=wrapper)
    load_unsharded_state(dmp, initial)
    return dmp


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
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                rows, cols = shard.metadata.shard_offsets
                num_rows, num_cols = shard.metadata.shard_sizes
                shard.tensor.detach().copy_(full[key][rows:rows + num_rows, cols:cols + num_cols])
        else:
            value.detach().copy_(full[key])
    dmp.load_state_dict(state)


def unwrap(model: nn.Module) -> nn.Module:
    """The user module inside DMP (and DDP)."""
    while hasattr(model, "module") or hasattr(model, "_dmp_wrapped_module"):
        model = getattr(model, "_dmp_wrapped_module", None) or model.module
    return model
