"""TrainConfig: presets in ``gem/configs/train/<name>.yaml``; the model's sizes come
from the model preset it names (``model_preset``) plus ``model.*`` overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

from gem.config import load_config
from gem.model.config import ModelConfig

PRECISIONS = ("fp32", "bf16")
ENGINES = ("native", "lightning")


@dataclass(kw_only=True)
class OptimConfig:
    dense_lr: float = 1e-3
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    embedding_lr: float = 0.05  # fused row-wise Adagrad on the torchrec tables
    embedding_eps: float = 1e-8
    grad_clip: float = 0.0  # dense max-norm; 0 disables
    warmup_steps: int = 0
    # after warmup: "none" keeps dense_lr; "linear"/"cosine" fall to dense_lr * min_lr_ratio
    # at the last step (max_steps, else epochs x batches per epoch)
    lr_decay: str = "none"
    min_lr_ratio: float = 0.0


@dataclass(kw_only=True)
class ShardingConfig:
    ebc: str = "table_wise"
    ec: str = "table_wise"


@dataclass(kw_only=True)
class TrainConfig:
    model_preset: str = "tiny"
    engine: str = "native"  # "lightning": single process, unsharded tables
    batch_size: int = 256  # global, across ranks
    epochs: int = 1
    max_steps: int = 0  # 0: run every epoch to the end
    seed: int = 0
    precision: str = "fp32"
    compile: bool = False
    activation_checkpointing: bool = False
    task_weights: list[float] = field(default_factory=lambda: [1.0, 1.0])
    optim: OptimConfig = field(default_factory=OptimConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    num_workers: int = 0
    shuffle: bool = True
    # "time": day by day, oldest first (the model ends on the freshest day, as on the live
    # stream); "random": shards in a seeded random order. See gem/features/loader.py.
    shard_order: str = "time"
    checkpoint_every: int = 100  # steps; 0 disables periodic checkpoints
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_batches: int = 0  # 0: the whole eval set
    synthetic_examples: int = 4096  # size of --features synthetic://
    tracking_uri: str = ""  # "": sqlite:///<out>/mlflow.db
    experiment: str = "gem-pretrain"
    run_name: str = ""
    system_metrics: bool = True
    log_model: bool = True
    measure_peak: bool = True

    def validate(self) -> "TrainConfig":
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} must be one of {PRECISIONS}")
        from gem.features.config import SHARD_ORDERS

        if self.shard_order not in SHARD_ORDERS:
            raise ValueError(f"shard_order={self.shard_order!r} must be one of {SHARD_ORDERS}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r} must be one of {ENGINES}")
        if self.batch_size <= 0 or self.epochs <= 0:
            raise ValueError(f"batch_size={self.batch_size} and epochs={self.epochs} must be > 0")
        if len(self.task_weights) != 2:
            raise ValueError(f"task_weights={self.task_weights} must have one weight per task (2)")
        return self


def load_train_config(preset: str | None = "tiny", overrides: list[str] | None = None,
                      path: str | None = None) -> tuple[TrainConfig, ModelConfig]:
    """Split ``overrides`` into model.* and the rest; returns (train, model) configs."""
    overrides = list(overrides or [])
    model_over = [o[len("model."):] for o in overrides if o.startswith("model.")]
    train_over = [o for o in overrides if not o.startswith("model.")]
    train = load_config(TrainConfig, section="train", preset=preset, path=path, overrides=train_over).validate()
    model = load_config(ModelConfig, section="model", preset=train.model_preset, overrides=model_over).validate()
    return train, model
