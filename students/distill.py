"""Distill a frozen GEM teacher into one vertical student per surface.

    results = distill(train_table, eval_table, cfg, teacher_model=gem)   # {surface: StudentResult}

Order: Student Adapter (fit on the newest period(s) of the training window) -> the
per-domain foundation models (hierarchical) -> one student per surface, each trained on
its surface's impressions with the switched-on soft targets and input features, then
evaluated on the next window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from gem.data.profile import SurfaceError
from students.adapter import StudentAdapter, newest
from students.config import DistillConfig, StudentModelConfig
from students.data import StudentTable
from students.losses import SoftTarget, soften
from students.model import VerticalStudent, share_teacher_tables, student_flops_per_example
from students.train import evaluate, predict, train_student


@dataclass
class StudentResult:
    surface: str
    model: VerticalStudent
    metrics: dict[str, float]
    train_loss: list[float]
    methods: list[str]
    teacher_version: str
    flops_per_example: float
    shared_tables: list[str] = field(default_factory=list)
    train_examples: int = 0
    eval_examples: int = 0
    selection: dict = field(default_factory=dict)  # best epoch, validation label loss, epochs run
    eval_index: torch.Tensor | None = None  # positions of this surface's rows in the eval table
    eval_probs: torch.Tensor | None = None  # (n_eval, T) the student's probabilities on them
    # the student's size as built (sharing sets embedding_dim to the teacher's): parameters,
    # embedding_dim, extra_id_dim, teacher-embedding input width
    size: dict = field(default_factory=dict)


@dataclass
class DistillOutput:
    students: dict[str, StudentResult]
    adapter: StudentAdapter | None = None
    domain_models: dict[str, VerticalStudent] = field(default_factory=dict)
    windows: dict[str, list[int]] = field(default_factory=dict)  # name -> [start_us, end_us): the lineage


def cardinalities(spec, cfg: StudentModelConfig) -> dict[str, int]:
    return {k: int(spec.sparse[k]) for k in cfg.sparse_features}


def build_student(cfg: StudentModelConfig, spec, table: StudentTable, *, representation: bool,
                  seed: int, num_surfaces: int = 0) -> VerticalStudent:
    torch.manual_seed(seed)
    emb_dim = int(table.teacher_emb.shape[1]) if representation else 0
    model = VerticalStudent(cfg, cardinalities(spec, cfg), len(cfg.dense_features), emb_dim, num_surfaces,
                            vocab_digests=spec.vocab_digests, knowledge=table.knowledge)
    with torch.no_grad():  # start at the window's base rates: p(click), p(conversion | click)
        click = table.labels[:, 0].mean().clamp(1e-4, 1 - 1e-4)
        conv = (table.labels[:, 1].sum() / table.labels[:, 0].sum().clamp(min=1)).clamp(1e-4, 1 - 1e-4)
        model.out.bias.copy_(torch.logit(torch.stack([click, conv])))
    if emb_dim:
        emb = table.teacher_emb
        model.emb_mean.copy_(emb.mean(0))
        model.emb_std.copy_(emb.std(0).clamp(min=1e-3))
    return model


def capacity_matched(cfg: DistillConfig, *, teacher_emb_width: int = 0, teacher_embedding_dim: int = 0
                     ) -> DistillConfig:
    """The no-teacher student as large as ``cfg``'s transfer student: with representation
    transfer, learned user and item embeddings as wide as the teacher's (the same input
    width); with parameter sharing, the teacher's embedding_dim. Otherwise the plain
    no-teacher student."""
    from dataclasses import replace

    from students.config import TransferConfig

    tr, changes = cfg.transfer, {}
    if tr.representation.enabled:
        if teacher_emb_width <= 0:
            raise ValueError("capacity_matched: representation transfer needs the teacher-embedding width")
        changes["extra_id_dim"] = teacher_emb_width // 2
    if tr.sharing != "off":
        if teacher_embedding_dim <= 0:
            raise ValueError("capacity_matched: parameter sharing needs the teacher's embedding_dim")
        changes["embedding_dim"] = teacher_embedding_dim
    return replace(cfg, student=replace(cfg.student, **changes), transfer=TransferConfig())


def student_size(model: VerticalStudent) -> dict:
    return {"parameters": int(sum(p.numel() for p in model.parameters())),
            "embedding_dim": int(model.cfg.embedding_dim), "extra_id_dim": int(model.cfg.extra_id_dim),
            "teacher_emb_dim": int(model.teacher_emb_dim)}


def _require(table: StudentTable, what: str, needed: bool, name: str) -> None:
    if needed and getattr(table, what) is None:
        raise ValueError(f"{name}: the table has no {what}; attach the teacher's knowledge (attach_knowledge) first")


def fit_adapter(train: StudentTable, cfg: DistillConfig, dense_names: list[str]) -> StudentAdapter:
    a = cfg.transfer.adapter
    unknown = [f for f in a.features if f not in dense_names]
    if unknown:
        raise ValueError(f"adapter features {unknown} must be among the student's dense features {dense_names}")
    num_surfaces = train.teacher_all.shape[1] if train.teacher_all is not None else int(train.surface.max()) + 1
    adapter = StudentAdapter(a, num_surfaces, train.labels.shape[1], [dense_names.index(f) for f in a.features])
    return adapter.fit(newest(train, a.newest_periods, cfg.period_days))


def resolve_domains(domains: dict[str, list[str]], surfaces: list[str]) -> dict[str, list[str]]:
    """The configured domains, or by default two: the first and the second half of the
    data's surfaces (GEM -> two domain models -> vertical students)."""
    if domains:
        return dict(domains)
    half = (len(surfaces) + 1) // 2
    groups = {"+".join(surfaces[:half]): list(surfaces[:half]), "+".join(surfaces[half:]): list(surfaces[half:])}
    return {k: v for k, v in groups.items() if v}


def domain_targets(train: StudentTable, spec, cfg: DistillConfig, adapter_probs: torch.Tensor | None,
                   valid: StudentTable | None = None) -> tuple[torch.Tensor, dict[str, VerticalStudent]]:
    """Hierarchical: per domain, a mid-sized multi-surface model distilled from GEM (and
    the adapter) on the training window; returns its (N, T) predictions and the models."""
    h, kd = cfg.transfer.hierarchical, cfg.transfer.kd
    probs = torch.full_like(train.labels, float("nan"))
    models = {}
    names = list(spec.surfaces)
    for d, (name, surfaces) in enumerate(sorted(resolve_domains(h.domains, names).items())):
        ids = torch.tensor([names.index(s) for s in surfaces])
        rows = torch.isin(train.surface, ids)
        part = train.subset(rows)
        if len(part) == 0:
            continue
        model = build_student(h.model, spec, part, representation=part.teacher_emb is not None,
                              seed=cfg.seed * 7919 + 101 + d, num_surfaces=len(names))
        source = adapter_probs[rows] if (h.use_adapter and adapter_probs is not None) else \
            soften(part.teacher_logits, kd.temperature)
        temperature = 1.0 if (h.use_adapter and adapter_probs is not None) else kd.temperature
        optim = type(cfg.optim)(**{**cfg.optim.__dict__, "epochs": h.epochs})
        train_student(model, part, optim, seed=cfg.seed * 7919 + 101 + d,
                      soft_targets=[SoftTarget("teacher", h.kd_weight, source, temperature)],
                      valid=None if valid is None else valid.subset(torch.isin(valid.surface, ids)))
        probs[rows] = predict(model, part)
        models[name] = model
    return probs, models


def distill(train: StudentTable, eval_table: StudentTable | None, spec, cfg: DistillConfig, *,
            teacher_model: nn.Module | None = None, valid: StudentTable | None = None) -> DistillOutput:
    """Train the students on ``train``; ``valid`` (or, with ``cfg.validation_days``, the
    last days of ``train``'s window split off here) drives early stopping and is never
    trained on, nor used by the adapter's fit; ``eval_table`` is only scored."""
    cfg.validate()
    tr = cfg.transfer
    if valid is None and cfg.validation_days > 0:
        from students.data import split_at

        end = train.window_us[1] if train.window_us else int(train.event_time_us.max()) + 1
        train, valid = split_at(train, end - int(round(cfg.validation_days * 86_400e6)))
        if not len(train) or not len(valid):
            raise ValueError(f"validation_days={cfg.validation_days} leaves {len(train)} training and {len(valid)} "
                             f"validation rows in the student window {train.window_us[0]}..{valid.window_us[1]}")
    from students.protocol import check_rows

    check_rows(train=train, validation=valid, evaluation=eval_table)
    windows = {name: list(t.window_us) for name, t in (("train", train), ("validation", valid),
                                                          ("evaluation", eval_table))
               if t is not None and t.window_us}
    uses_predictions = bool(tr.kd.weight or tr.adapter.weight or tr.hierarchical.weight)
    _require(train, "teacher_logits", uses_predictions, "kd/adapter/hierarchical")
    _require(train, "teacher_emb", tr.representation.enabled, "representation")
    if eval_table is not None:
        _require(eval_table, "teacher_emb", tr.representation.enabled, "representation (eval)")
    if tr.sharing != "off" and teacher_model is None:
        raise ValueError(f"transfer.sharing={tr.sharing!r} needs the teacher model (its embedding tables)")
    student_cfg = cfg.student
    if tr.sharing != "off":
        student_cfg = type(student_cfg)(**{**student_cfg.__dict__,
                                           "embedding_dim": int(teacher_model.cfg.embedding_dim)})

    soft: list[SoftTarget] = []
    adapter = adapter_probs = None
    if tr.kd.weight > 0:
        soft.append(SoftTarget("kd", tr.kd.weight, soften(train.teacher_logits, tr.kd.temperature), tr.kd.temperature))
    if tr.adapter.weight > 0:  # also what the domain models learn from (hierarchical.use_adapter)
        adapter = fit_adapter(train, cfg, list(student_cfg.dense_features))
        windows["adapter_fit"] = [adapter.fit_window["start_us"], adapter.fit_window["end_us"]]
        adapter_probs = adapter(train)
        if tr.adapter.temperature != 1.0:
            logit = torch.logit(adapter_probs.clamp(1e-6, 1 - 1e-6))
            adapter_probs = soften(logit, tr.adapter.temperature)
        soft.append(SoftTarget("adapter", tr.adapter.weight, adapter_probs, tr.adapter.temperature))
    domain_models: dict[str, VerticalStudent] = {}
    if tr.hierarchical.weight > 0:
        probs, domain_models = domain_targets(train, spec, cfg, adapter_probs, valid)
        soft.append(SoftTarget("hierarchical", tr.hierarchical.weight, probs))

    students: dict[str, StudentResult] = {}
    absent = [name for name in cfg.surfaces if name not in spec.surfaces]
    if absent:
        raise SurfaceError(f"surface(s) {absent} not in the data; it has {list(spec.surfaces)}")
    for name in cfg.surfaces or spec.surfaces:
        s = list(spec.surfaces).index(name)
        part = train.subset(train.surface == s)
        if len(part) == 0:
            continue
        seed = cfg.seed * 1000 + s
        model = build_student(student_cfg, spec, part, representation=tr.representation.enabled, seed=seed)
        shared = share_teacher_tables(model, teacher_model, frozen=tr.sharing == "frozen") \
            if tr.sharing != "off" else []
        rows = train.surface == s
        terms = [SoftTarget(t.name, t.weight, t.probs[rows], t.temperature) for t in soft]
        losses = train_student(model, part, cfg.optim, seed=seed, soft_targets=terms,
                               desc=f"distill {name}",
                               valid=None if valid is None else valid.subset(valid.surface == s))
        metrics, n_eval, index, probs = {}, 0, None, None
        if eval_table is not None:
            index = torch.nonzero(eval_table.surface == s).flatten()
            ev = eval_table.subset(index)
            n_eval = len(ev)
            probs = predict(model, ev)
            metrics = evaluate(probs, ev, list(spec.surfaces), list(spec.tasks))
            metrics = {k.replace(f"/{name}/", "/"): v for k, v in metrics.items() if f"/{name}/" in k}
        flops = student_flops_per_example(model, part.inputs(slice(0, min(64, len(part)))))
        students[name] = StudentResult(name, model, metrics, losses, tr.methods(), train.teacher_version,
                                       flops, shared, len(part), n_eval, dict(getattr(model, "selection", {})),
                                       index, probs, student_size(model))
    return DistillOutput(students, adapter, domain_models, windows)
