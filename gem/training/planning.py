"""Sharding plans under a per-rank memory budget.

``sharding.rank_memory_mib`` caps what one rank may hold of the embedding tables and
their row-wise Adagrad state. A table larger than the cap is sharded row-wise (its rows
spread over every rank) instead of the configured type; a budget that cannot hold the
tables even so is refused before the model is sharded, naming the table and the numbers.
The plan the planner chose is described table by table (type, ranks, bytes per rank) for
the log and MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from gem.errors import UserError
from gem.model.embeddings import SparseArch

MIB = 2**20
ROW_WISE = "row_wise"
OPTIMIZER_BYTES_PER_ROW = 4  # row-wise Adagrad: one fp32 accumulator per row (per column shard)


class PlanRefused(UserError, ValueError):
    """The memory budget cannot hold the embedding tables."""


@dataclass(frozen=True)
class TableSize:
    name: str
    bags: bool  # an EmbeddingBagCollection's (pooled) table, else a sequence table
    rows: int
    dim: int
    elem_bytes: int = 4

    def shard_bytes(self, rows: int, cols: int) -> int:
        return rows * cols * self.elem_bytes + rows * OPTIMIZER_BYTES_PER_ROW

    @property
    def bytes(self) -> int:
        return self.shard_bytes(self.rows, self.dim)


def table_sizes(model: nn.Module) -> list[TableSize]:
    sizes = []
    for arch in (m for m in model.modules() if isinstance(m, SparseArch)):
        for module in arch.tables():
            bags = isinstance(module, EmbeddingBagCollection)
            for cfg in module.embedding_bag_configs() if bags else module.embedding_configs():
                sizes.append(TableSize(cfg.name, bags, cfg.num_embeddings, cfg.embedding_dim,
                                       _elem_bytes(cfg.data_type.name)))
    return sizes


def _elem_bytes(data_type: str) -> int:
    return {"FP32": 4, "FP16": 2, "BF16": 2, "INT8": 1}.get(data_type, 4)


def sharding_types(tables: list[TableSize], cap_bytes: int, ebc: str, ec: str) -> dict[str, str]:
    """The sharding type of each table: the configured one, or row-wise for a table
    larger than the cap."""
    return {t.name: ROW_WISE if cap_bytes and t.bytes > cap_bytes else (ebc if t.bags else ec) for t in tables}


def check_budget(tables: list[TableSize], world_size: int, cap_bytes: int) -> None:
    """Refuse a cap that cannot hold the tables: one table larger than the cap even when
    its rows are spread over every rank, or all of them larger than every rank's cap."""
    if not cap_bytes:
        return
    cap = f"sharding.rank_memory_mib={cap_bytes / MIB:.4g}"
    for t in sorted(tables, key=lambda t: -t.bytes):
        per_rank = t.shard_bytes(-(-t.rows // world_size), t.dim)
        if per_rank > cap_bytes:
            raise PlanRefused(f"{cap}: table {t.name} ({t.rows:,} rows x {t.dim} dims, {_mib(t.bytes)} with its "
                              f"Adagrad state) needs {_mib(per_rank)} per rank even row-wise over {world_size} "
                              f"rank(s), over the cap of {_mib(cap_bytes)}; raise the cap or add ranks")
    total = sum(t.bytes for t in tables)
    if total > world_size * cap_bytes:
        largest = max(tables, key=lambda t: t.bytes)
        raise PlanRefused(f"{cap}: the {len(tables)} tables need {_mib(total)} with their Adagrad state "
                          f"(largest: {largest.name}, {_mib(largest.bytes)}), over {world_size} rank(s) x "
                          f"{_mib(cap_bytes)}; raise the cap or add ranks")


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / MIB:.3g} MiB"


def describe_plan(plan, tables: list[TableSize]) -> list[dict]:
    """One row per table: its sharding type, the ranks holding it and their bytes
    (weights and optimizer state) of it."""
    sizes = {t.name: t for t in tables}
    rows = []
    for module_plan in plan.plan.values():
        for name, sharding in module_plan.items():
            table = sizes[name]
            per_rank: dict[int, int] = {}
            shards = sharding.sharding_spec.shards if sharding.sharding_spec is not None else []
            for shard in shards:
                rank = shard.placement.rank()
                per_rank[rank] = per_rank.get(rank, 0) + table.shard_bytes(*shard.shard_sizes)
            if not shards:  # data parallel: a full copy on every rank
                per_rank = dict.fromkeys(sharding.ranks or [], table.bytes)
            rows.append({"table": name, "sharding": sharding.sharding_type, "ranks": sorted(per_rank),
                         "bytes_per_rank": {str(r): b for r, b in sorted(per_rank.items())}})
    return sorted(rows, key=lambda r: r["table"])


def format_plan(rows: list[dict]) -> str:
    lines = [f"{'table':<24} {'sharding':<18} {'ranks':<12} bytes per rank"]
    for row in rows:
        ranks = ",".join(map(str, row["ranks"]))
        sizes = " ".join(f"{r}:{b:,}" for r, b in row["bytes_per_rank"].items())
        lines.append(f"{row['table']:<24} {row['sharding']:<18} {ranks:<12} {sizes}")
    return "\n".join(lines)


def rank_totals(rows: list[dict]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for row in rows:
        for rank, num in row["bytes_per_rank"].items():
            totals[rank] = totals.get(rank, 0) + num
    return dict(sorted(totals.items(), key=lambda kv: int(kv[0])))
