"""Student and transfer configuration (presets in ``gem/configs/students/<name>.yaml``).

Every transfer method is a switch; any combination is valid:

- ``kd``: labels + the teacher's soft predictions (``weight``, ``temperature``);
- ``adapter``: soft targets from a Student Adapter fit on the newest labelled window;
- ``representation``: teacher user/item embeddings as precomputed input features;
- ``sharing``: student tables initialised from GEM's tables (``frozen`` or ``finetune``);
- ``hierarchical``: soft targets from a per-domain foundation model distilled from GEM.

With every switch off (the default) the student is the no-teacher baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gem.config import ranged

SHARING_MODES = ("off", "frozen", "finetune")


@dataclass(kw_only=True)
class StudentModelConfig:
    embedding_dim: int = 8  # forced to the teacher's when sharing is on
    sparse_features: list[str] = field(default_factory=lambda: [
        "user_id", "item_id", "item_advertiser_id", "item_category_id", "item_format", "item_objective",
        "user_age_bucket", "user_country", "user_device", "user_gender"])
    # dense features a scorer can compute at request time (no offline-only aggregates)
    dense_features: list[str] = field(default_factory=lambda: [
        "log_history_len", "hour_of_day_sin", "hour_of_day_cos"])
    history_len: int = 8  # most recent history items, mean-pooled with the item table
    cross_layers: int = 1  # DCN-v2 low-rank cross layers
    cross_rank: int = 4
    mlp_hidden: list[int] = field(default_factory=lambda: [32, 16])
    surface_input: bool = False  # a surface embedding (multi-surface domain models only)
    # capacity-matched baselines: learned user_id and item_id embeddings of this width
    # each, as wide as the teacher embeddings a representation-transfer student reads
    extra_id_dim: int = 0
    # what a representation-transfer student reads of the teacher's user and item
    # embeddings: "embeddings" (both, standardised), "score" (only their scaled dot
    # product, the two-tower term of GEM's click logit) or "both"
    teacher_inputs: str = "embeddings"


@dataclass(kw_only=True)
class KDConfig:
    weight: float = 0.0  # 0 disables; loss = (1 - sum of soft weights) * labels + weight * soft
    temperature: float = 1.0


@dataclass(kw_only=True)
class AdapterConfig:
    weight: float = 0.0  # 0 disables
    temperature: float = 1.0
    newest_periods: int = 1  # the adapter is fit on the last N periods of the student window only
    features: list[str] = field(default_factory=lambda: ["log_history_len"])  # dense features it also sees
    cross_surface: bool = True  # also read the teacher's logits for the other surfaces
    hidden: int = 0  # 0: logistic regression; >0: one hidden layer
    l2: float = 1e-3  # towards the identity map (the teacher as it is) for a logistic head
    max_iter: int = 100
    # a (surface, task) head needs this many clicks and as many non-clicks in its fit window;
    # fewer, and it passes the teacher through unchanged (fit on 3 rows, a head of ~30
    # inputs inverted the teacher on sparse real logs, and its students with it)
    min_labels: int = 10


@dataclass(kw_only=True)
class RepresentationConfig:
    enabled: bool = False
    scale: float = 1.0  # teacher embeddings are standardised, then multiplied by this


@dataclass(kw_only=True)
class HierarchicalConfig:
    weight: float = 0.0  # 0 disables; the student's soft target is the domain model
    # domain -> its surfaces; {} = two domains, the first and second half of the data's surfaces
    domains: dict[str, list[str]] = field(default_factory=dict)
    kd_weight: float = 0.5  # the domain model's own distillation from GEM
    use_adapter: bool = True  # the domain model learns from adapter targets when available
    model: StudentModelConfig = field(default_factory=lambda: StudentModelConfig(
        embedding_dim=16, mlp_hidden=[128, 64], cross_layers=2, cross_rank=16, surface_input=True))
    epochs: int = 3


@dataclass(kw_only=True)
class TransferConfig:
    kd: KDConfig = field(default_factory=KDConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    representation: RepresentationConfig = field(default_factory=RepresentationConfig)
    sharing: str = "off"
    hierarchical: HierarchicalConfig = field(default_factory=HierarchicalConfig)

    def validate(self) -> "TransferConfig":
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"transfer.sharing={self.sharing!r} must be one of {SHARING_MODES}")
        soft = self.kd.weight + self.adapter.weight + self.hierarchical.weight
        for name, w in (("kd.weight", self.kd.weight), ("adapter.weight", self.adapter.weight),
                        ("hierarchical.weight", self.hierarchical.weight)):
            if w < 0:
                raise ValueError(f"transfer.{name}={w} must be >= 0")
        if soft > 1.0:
            raise ValueError(f"soft-target weights sum to {soft}; they must sum to <= 1 (the rest is labels)")
        for name, t in (("kd.temperature", self.kd.temperature), ("adapter.temperature", self.adapter.temperature)):
            if t <= 0:
                raise ValueError(f"transfer.{name}={t} must be > 0")
        for domain, surfaces in self.hierarchical.domains.items():
            if not surfaces or not all(isinstance(s, str) and s for s in surfaces):  # checked against the data's
                raise ValueError(f"transfer.hierarchical.domains[{domain!r}]={surfaces}: surfaces must be a "
                                 f"non-empty list of the data's surface names")
        if self.adapter.newest_periods < 1:
            raise ValueError(f"transfer.adapter.newest_periods={self.adapter.newest_periods} must be >= 1")
        return self

    def needs_teacher(self) -> bool:
        return bool(self.kd.weight or self.adapter.weight or self.hierarchical.weight
                    or self.representation.enabled or self.sharing != "off")

    def methods(self) -> list[str]:
        """The switched-on methods, for tags and tables."""
        on = [name for name, flag in (
            ("kd", self.kd.weight > 0), ("adapter", self.adapter.weight > 0),
            ("representation", self.representation.enabled), ("sharing", self.sharing != "off"),
            ("hierarchical", self.hierarchical.weight > 0)) if flag]
        return on or ["no_teacher"]


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = ranged(3e-3, gt=0)
    weight_decay: float = ranged(0.0, ge=0)  # decoupled (AdamW): each step shrinks weights by lr * weight_decay
    batch_size: int = ranged(256, gt=0)
    epochs: int = ranged(3, gt=0)  # the most epochs; with a validation table and patience > 0, early stopping
    patience: int = ranged(0, ge=0)  # epochs without a better validation loss before stopping (0: no early stopping)
    # with a validation table, also check it every this many training rows inside an epoch
    # (0: at epoch ends only): an epoch of a window that reaches into the teacher's days
    # holds 10^5 rows a surface, too coarse a step to stop at; smaller tables are unchanged
    check_rows: int = ranged(0, ge=0)
    # > 0: stop after this many epochs' rows (a refit of a point validation stopped mid-epoch)
    stop_epochs: float = ranged(0.0, ge=0)


@dataclass(kw_only=True)
class KnowledgeReadConfig:
    # cadence of the knowledge job that writes teacher embeddings to the online store: a
    # student reads them as of the last materialization before the request ("1d", "6h",
    # ...); "impression" reads the row just before each impression (a labelled upper bound)
    refresh_every: str = "1d"


def refresh_interval(text: str):
    """``"1d"`` / ``"6h"`` / ``"30m"`` -> timedelta; ``"impression"`` / ``"0"`` -> None."""
    import datetime as dt

    text = str(text).strip().lower()
    if text in ("impression", "0", "", "none"):
        return None
    units = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
    if text[-1] not in units:
        raise ValueError(f"knowledge.refresh_every={text!r}: use e.g. 1d, 6h, 30m or 'impression'")
    value = dt.timedelta(**{units[text[-1]]: float(text[:-1])})
    if value <= dt.timedelta(0):
        raise ValueError(f"knowledge.refresh_every={text!r} must be positive (or 'impression')")
    return value


OLDER_ROWS = ("choose", "all", "fresh")


@dataclass(kw_only=True)
class SelectionConfig:
    """Students chosen on validation (students/selection.py): the newest ``validation_share``
    of the student window's rows (cut at one time) is held out of training; every point
    of ``grid`` (dotted overrides of this config) trains one student with early stopping
    on it, and the lowest validation label loss wins. The no-teacher reference searches
    ``no_teacher_grid``, a grid of the same size. ``validation_share`` 0: no selection."""
    validation_share: float = ranged(0.0, ge=0, lt=1)
    grid: list[dict] = field(default_factory=list)
    no_teacher_grid: list[dict] = field(default_factory=list)
    # Platt-recalibrate (on validation) a chosen student whose validation NE is >= 1 while
    # its teacher's is below 1 (or unknown)
    calibrate: bool = True
    # retrain the chosen point on the whole student window for the chosen epochs (a
    # recalibrated student is kept as validated: its calibration was fit on that model)
    refit: bool = True
    # when the student window reaches into the teacher's days (pipeline run
    # --student-overlap-days): "all" searches the grid on every row; "fresh" never trains on
    # the teacher's days; "choose" searches on the fresh rows, trains the chosen point on
    # every row as well and keeps the lower validation loss (per surface: noisier than
    # "all" on MovieLens-1M and Ciao, docs/transfer.md)
    older_rows: str = "all"


@dataclass(kw_only=True)
class DistillConfig:
    surfaces: list[str] = field(default_factory=list)  # [] = every surface of the data (spec.surfaces)
    student: StudentModelConfig = field(default_factory=StudentModelConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    knowledge: KnowledgeReadConfig = field(default_factory=KnowledgeReadConfig)
    seed: int = 0
    period_days: float = ranged(1.0, gt=0)  # length of one "period" (the adapter's newest window unit)
    # >0: the last validation_days of the student window are held out of training (and of
    # the adapter's fit) for early stopping and model selection
    validation_days: float = 0.0
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    tracking_uri: str = ""  # "": sqlite:///<out>/mlflow.db
    experiment: str = "gem-distill"
    register: bool = True  # register each student in the MLflow model registry

    def validate(self) -> "DistillConfig":
        if not all(isinstance(s, str) and s for s in self.surfaces):  # checked against the data's in distill
            raise ValueError(f"surfaces {self.surfaces} must be surface names of the data")
        self.transfer.validate()
        refresh_interval(self.knowledge.refresh_every)
        if self.validation_days < 0 or self.optim.patience < 0:
            raise ValueError("validation_days and optim.patience must be >= 0")
        sel = self.selection
        if sel.older_rows not in OLDER_ROWS:
            raise ValueError(f"selection.older_rows={sel.older_rows!r}: use one of {OLDER_ROWS}")
        if sel.validation_share and sel.grid and sel.no_teacher_grid and len(sel.grid) != len(sel.no_teacher_grid):
            raise ValueError(f"selection: the no-teacher grid must be as large as the student's (the same budget); "
                             f"got {len(sel.no_teacher_grid)} and {len(sel.grid)} points")
        return self
