"""A cost model of one training step: FLOPs, the bytes each rank sends in all-to-alls
(torchrec's embedding exchange) and in the dense part's reductions, and the memory per
rank (tables and their optimizer state, dense parameters and AdamW state, activations),
from the config and the data's statistics. ``measure`` takes the same figures from a
real sharded step (torch.profiler's record of every gloo/nccl collective, the tensors
themselves), so the model can be checked against it; docs/scale.md applies it to a
paper-scale run.

What one rank sends per step, with B_r examples per rank, F features, I ids per example
(pooled features: one id each; sequences: the mean history length), D the table width:
- all-to-all, forward: the ids (8 bytes each) and the lengths (4 bytes per feature and
  example) to the ranks owning the rows, then the looked-up embeddings back: D floats
  per pooled feature and per sequence id; backward: the embeddings' gradients, as many.
- dense part, replicate (DDP): an all-reduce of every dense gradient (4 bytes each);
  shard (FSDP2): a reduce-scatter of them, plus all-gathers of the parameters in
  forward and again in backward (each rank contributes its 1/W slice).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

ID_BYTES, LENGTH_BYTES, FLOAT_BYTES = 8, 4, 4
ADAMW_STATES = 2  # exp_avg, exp_avg_sq (and a scalar step)


@dataclass(frozen=True)
class Feature:
    name: str
    dim: int
    ids_per_example: float  # 1 for a pooled id feature; the mean length of a sequence
    pooled: bool


@dataclass
class Workload:
    """What the model needs to know about a run; sizes in elements, not bytes."""

    batch_size: int  # global
    world_size: int
    features: list[Feature]
    table_bytes: int  # every table and its row-wise Adagrad state, all ranks together
    dense_params: int
    forward_flops_per_example: float
    activation_bytes_per_example: float  # saved for backward, at the mean history length
    dense: str = "replicate"  # or "shard"

    @property
    def per_rank(self) -> float:
        return self.batch_size / self.world_size


@dataclass
class StepCost:
    flops: float  # the whole step, all ranks
    all_to_all_bytes: float  # sent by one rank, forward and backward
    dense_comm_bytes: float  # all-reduce (DDP) or reduce-scatter + all-gathers (FSDP2), one rank
    table_bytes: float  # per rank (even split)
    dense_bytes: float  # per rank: parameters and AdamW state
    gradient_bytes: float  # per rank: the dense gradients, during the step
    activation_bytes: float  # per rank
    extra: dict = field(default_factory=dict)

    @property
    def memory_bytes(self) -> float:
        return self.table_bytes + self.dense_bytes + self.gradient_bytes + self.activation_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "memory_bytes": self.memory_bytes}


def predict(w: Workload) -> StepCost:
    ids = sum(f.ids_per_example for f in w.features)
    embeddings = sum(f.dim * (1 if f.pooled else f.ids_per_example) for f in w.features)
    lookup = w.per_rank * (ids * ID_BYTES + len(w.features) * LENGTH_BYTES)
    exchange = w.per_rank * embeddings * FLOAT_BYTES  # forward outputs; their gradients as many
    grads = w.dense_params * FLOAT_BYTES
    shard = 1 / w.world_size if w.dense == "shard" else 1.0
    if w.world_size == 1:
        dense_comm = 0.0
    elif w.dense == "shard":
        dense_comm = grads + 2 * grads / w.world_size  # reduce-scatter; all-gathers in forward and backward
    else:
        dense_comm = grads
    return StepCost(
        flops=3.0 * w.forward_flops_per_example * w.batch_size,
        all_to_all_bytes=(lookup + 2 * exchange) if w.world_size > 1 else 0.0,
        dense_comm_bytes=dense_comm,
        table_bytes=w.table_bytes / w.world_size,
        dense_bytes=grads * (1 + ADAMW_STATES) * shard,
        gradient_bytes=grads * shard,  # FSDP2 keeps only its slice after the reduce-scatter
        activation_bytes=w.activation_bytes_per_example * w.per_rank,
    )


def step_seconds(cost: StepCost, w: Workload, *, peak_flops: float, mfu: float, network_bytes_per_s: float,
                 overlap: float = 0.0) -> dict[str, float]:
    """Seconds of one step on ``w.world_size`` accelerators: compute at ``mfu`` of
    ``peak_flops``, communication at ``network_bytes_per_s`` per accelerator, of which
    ``overlap`` (0-1) hides behind compute."""
    compute = cost.flops / (w.world_size * peak_flops * mfu)
    comm = (cost.all_to_all_bytes + cost.dense_comm_bytes) / network_bytes_per_s
    return {"compute_s": compute, "comm_s": comm, "step_s": compute + (1 - overlap) * comm}


# -- from a model and its data, and measured from a real step ------------------------------

def workload_of(model, spec, probe, *, batch_size: int, world_size: int, dense: str = "replicate") -> Workload:
    """The workload of ``model`` (unsharded) on batches like ``probe`` (its mean history
    lengths; FLOPs and activations per example measured on it)."""
    from gem.model import batch_forward_flops
    from gem.training.planning import table_sizes

    tables = {t.name: t for t in table_sizes(model)}
    mean_len = {}
    for kjt in (probe.sparse, probe.sequence):
        lengths = kjt.lengths().float().view(len(kjt.keys()), -1).mean(dim=1)
        mean_len.update(zip(kjt.keys(), lengths.tolist()))
    # tables t_<feature> (pooled) and s_<feature> (sequences)
    features = [Feature(name[2:], t.dim, mean_len.get(name[2:], 1.0), t.bags) for name, t in tables.items()]
    dense_params = sum(p.numel() for n, p in model.named_parameters() if ".sparse.ebc." not in n
                       and ".sparse.ec." not in n)
    return Workload(batch_size=batch_size, world_size=world_size, features=features,
                    table_bytes=sum(t.bytes for t in tables.values()), dense_params=dense_params,
                    forward_flops_per_example=batch_forward_flops(model, probe) / probe.batch_size,
                    activation_bytes_per_example=saved_activation_bytes(model, probe) / probe.batch_size,
                    dense=dense)


def saved_activation_bytes(model, batch) -> int:
    """Bytes of the tensors autograd keeps from ``model(batch)``'s forward for backward,
    each storage once, counted after the forward: the parameters are not, nor what FSDP2
    gathered for the forward and freed after it."""
    import torch

    from gem.training.step import forward_loss

    params = {(p.to_local() if hasattr(p, "to_local") else p).untyped_storage().data_ptr()
              for p in model.parameters()}
    kept: dict[int, torch.UntypedStorage] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in params:
                kept[storage.data_ptr()] = storage
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _, _ = forward_loss(model, batch)
    held = sum(storage.nbytes() for storage in kept.values())
    del loss
    return held


def collective_bytes(events) -> dict[str, float]:
    """Bytes each collective's input held, summed by kind, from torch.profiler events
    (``gloo:all_to_all``, ``gloo:all_reduce``, ...)."""
    import torch

    sizes = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
             "unsigned char": 1, "signed char": 1, "bool": 1, "short int": 2}
    out: dict[str, float] = {}
    for event in events:
        backend, _, kind = event.name.partition(":")
        if backend not in ("gloo", "nccl") or not event.input_shapes:
            continue
        shape, dtype = event.input_shapes[0], (event.input_dtypes or ["float"])[0]
        out[kind] = out.get(kind, 0.0) + float(torch.Size(shape).numel()) * sizes.get(dtype, 4)
    return out
