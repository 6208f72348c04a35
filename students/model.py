"""VerticalStudent: a small DCN-v2-style model for one surface.

Shapes: B batch, F sparse features, h history items, D dense features, E teacher
embedding width (2 x GEM's encode_dim when representation transfer is on, else 0), d
the student's embedding dim. Input width X = (F + 1) * d + D + E (+ d for the surface
embedding of multi-surface domain models).

    x0 (B, X) = [sparse embeddings, mean of the h most recent history items (item table),
                 dense, teacher embeddings and/or their two-tower score (cfg.teacher_inputs)]
    x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l        (low-rank cross, rank r)
    cond logits (B, 2) = MLP(x_L)                       (click, conversion | click)

It never runs GEM: teacher embeddings are precomputed inputs (from Feast).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gem.model.heads import ModelOutput, joint_logits, mlp
from students.config import StudentModelConfig


@dataclass
class StudentInputs:
    sparse: torch.Tensor  # int64 (B, F), dense ids (0 = unknown)
    history: torch.Tensor  # int64 (B, h), item ids, 0 = padding
    dense: torch.Tensor  # float32 (B, D)
    surface: torch.Tensor  # int64 (B,)
    teacher_emb: torch.Tensor | None = None  # float32 (B, E)

    @property
    def batch_size(self) -> int:
        return int(self.sparse.shape[0])


TEACHER_INPUTS = ("embeddings", "score", "both")
# a standardised teacher-embedding input is clipped to this many of the training window's
# standard deviations: a dimension nearly constant over the window (its std floored at
# 1e-3) otherwise turns a later row's ordinary value into a z of 10^3 and the student's
# probability into 0 (Ciao's students on the teacher's whole window: holdout NE up to 2.87
# with validation NE below 1); the training rows' own z stayed below 6.2 there
EMB_Z_LIMIT = 8.0


def teacher_score(teacher_emb_BE: torch.Tensor) -> torch.Tensor:
    """(B, 1): the teacher's two-tower term, user . item / sqrt(width), as GEM adds it to
    its click logit (gem.model.heads.TwoTower.score); read from the raw embeddings, since
    standardising each dimension would change the product."""
    user, item = teacher_emb_BE.chunk(2, dim=1)
    return (user * item).sum(1, keepdim=True) * user.shape[1] ** -0.5


class LowRankCross(nn.Module):
    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.v = nn.Linear(dim, rank, bias=False)
        self.u = nn.Linear(rank, dim)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.u(self.v(x)) + x


class VerticalStudent(nn.Module):
    def __init__(self, cfg: StudentModelConfig, cardinalities: dict[str, int], num_dense: int,
                 teacher_emb_dim: int = 0, num_surfaces: int = 0, vocab_digests: dict[str, str] | None = None,
                 knowledge: dict | None = None) -> None:
        super().__init__()
        if "item_id" not in cardinalities:
            raise ValueError(f"the student needs an item_id feature to pool the history; got {list(cardinalities)}")
        self.cfg, self.keys, self.num_dense = cfg, list(cardinalities), num_dense
        self.vocab_digests = dict(vocab_digests or {})  # the ids' meaning: a window of other vocabularies is refused
        # the knowledge it learned from (students/lineage.py): a store of another teacher's is refused
        self.knowledge = dict(knowledge or {})
        dim = cfg.embedding_dim
        self.tables = nn.ModuleDict({k: nn.Embedding(max(int(c), 1), dim) for k, c in cardinalities.items()})
        for table in self.tables.values():
            nn.init.normal_(table.weight, std=0.05)
        self.item_pos = self.keys.index("item_id")
        self.surface_embedding = nn.Embedding(max(num_surfaces, 1), dim) if cfg.surface_input else None
        self.teacher_emb_dim = teacher_emb_dim
        if cfg.teacher_inputs not in TEACHER_INPUTS:
            raise ValueError(f"student.teacher_inputs={cfg.teacher_inputs!r} must be one of {TEACHER_INPUTS}")
        teacher_width = ((teacher_emb_dim if cfg.teacher_inputs != "score" else 0)
                         + (1 if teacher_emb_dim and cfg.teacher_inputs != "embeddings" else 0))
        # teacher embeddings are standardised with the training window's statistics
        self.register_buffer("emb_mean", torch.zeros(teacher_emb_dim))
        self.register_buffer("emb_std", torch.ones(teacher_emb_dim))
        # capacity-matched baselines: own user/item embeddings as wide as the teacher's
        extra = int(getattr(cfg, "extra_id_dim", 0) or 0)
        self.extra = nn.ModuleDict({k: nn.Embedding(max(int(cardinalities[k]), 1), extra)
                                    for k in ("user_id", "item_id") if extra and k in cardinalities})
        for table in self.extra.values():
            nn.init.normal_(table.weight, std=0.05)
        in_dim = ((len(self.keys) + 1 + int(cfg.surface_input)) * dim + num_dense + teacher_width
                  + extra * len(self.extra))
        self.in_dim = in_dim
        self.cross = nn.ModuleList(LowRankCross(in_dim, cfg.cross_rank) for _ in range(cfg.cross_layers))
        self.mlp = mlp([in_dim, *cfg.mlp_hidden], last_activation=True)
        self.out = nn.Linear(([in_dim, *cfg.mlp_hidden])[-1], 2)

    def features(self, x: StudentInputs) -> torch.Tensor:
        """x0 (B, X)."""
        parts = [self.tables[k](x.sparse[:, i]) for i, k in enumerate(self.keys)]
        hist_BhD = self.tables["item_id"](x.history)
        mask_Bh = (x.history > 0).to(hist_BhD.dtype)
        pooled = (hist_BhD * mask_Bh[..., None]).sum(1) / mask_Bh.sum(1, keepdim=True).clamp(min=1.0)
        parts += [pooled, x.dense]
        for k, table in self.extra.items():
            parts.append(table(x.sparse[:, self.keys.index(k)]))
        if self.surface_embedding is not None:
            parts.append(self.surface_embedding(x.surface))
        if self.teacher_emb_dim:
            if x.teacher_emb is None or x.teacher_emb.shape[1] != self.teacher_emb_dim:
                raise ValueError(f"the student was built for {self.teacher_emb_dim} teacher-embedding inputs, got "
                                 f"{None if x.teacher_emb is None else tuple(x.teacher_emb.shape)}")
            if self.cfg.teacher_inputs != "score":
                parts.append(((x.teacher_emb - self.emb_mean) / self.emb_std).clamp(-EMB_Z_LIMIT, EMB_Z_LIMIT))
            if self.cfg.teacher_inputs != "embeddings":
                parts.append(teacher_score(x.teacher_emb))
        return torch.cat(parts, dim=1)

    def forward(self, x: StudentInputs) -> ModelOutput:
        x0 = self.features(x)
        h = x0
        for layer in self.cross:
            h = layer(x0, h)
        cond = self.out(self.mlp(h))
        return ModelOutput(logits=joint_logits(cond.float()), cond_logits=cond)


def share_teacher_tables(student: VerticalStudent, teacher: nn.Module, *, frozen: bool) -> list[str]:
    """Copy GEM's non-sequence embedding tables into the student's same-named tables
    (parameter sharing); returns the shared keys. Dims must match (the distiller builds
    the student with the teacher's embedding_dim when sharing is on)."""
    bags = teacher.inputs.sparse.ebc.embedding_bags
    shared = []
    for key, table in student.tables.items():
        name = f"t_{key}"
        if name not in bags:
            continue
        weight = bags[name].weight.detach()
        if tuple(weight.shape) != tuple(table.weight.shape):
            raise ValueError(f"table {key}: teacher {tuple(weight.shape)} vs student {tuple(table.weight.shape)}; "
                             "sharing needs the same cardinality and embedding_dim")
        with torch.no_grad():
            table.weight.copy_(weight)
        table.weight.requires_grad_(not frozen)
        shared.append(key)
    return shared


def student_flops_per_example(model: VerticalStudent, x: StudentInputs) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    was = model.training
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    model.train(was)
    return counter.get_total_flops() / x.batch_size
