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

from gem.data.contract import SURFACES

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
    l2: float = 1e-3
    max_iter: int = 100


@dataclass(kw_only=True)
class RepresentationConfig:
    enabled: bool = False
    scale: float = 1.0  # teacher embeddings are standardised, then multiplied by this


@dataclass(kw_only=True)
class HierarchicalConfig:
    weight: float = 0.0  # 0 disables; the student's soft target is the domain model
    domains: dict[str, list[str]] = field(default_factory=lambda: {"all": list(SURFACES)})
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
            unknown = sorted(set(surfaces) - set(SURFACES))
            if unknown or not surfaces:
                raise ValueError(f"transfer.hierarchical.domains[{domain!r}]={surfaces}: surfaces must be a "
                                 f"non-empty subset of {SURFACES}")
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
    lr: float = 3e-3
    weight_decay: float = 0.0
    batch_size: int = 256
    epochs: int = 3


@dataclass(kw_only=True)
class DistillConfig:
    surfaces: list[str] = field(default_factory=lambda: list(SURFACES))
    student: StudentModelConfig = field(default_factory=StudentModelConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    period_days: float = 1.0  # length of one "period" (the adapter's newest window unit)
    tracking_uri: str = ""  # "": sqlite:///<out>/mlflow.db
    experiment: str = "gem-distill"
    register: bool = True  # register each student in the MLflow model registry

    def validate(self) -> "DistillConfig":
        unknown = sorted(set(self.surfaces) - set(SURFACES))
        if unknown:
            raise ValueError(f"surfaces {unknown} are not in the contract's {SURFACES}")
        self.transfer.validate()
        return self
