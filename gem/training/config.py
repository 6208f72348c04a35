"""TrainConfig: presets in ``gem/configs/train/<name>.yaml``; the model's sizes come
from the model preset it names (``model_preset``) plus ``model.*`` overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

from gem.config import ConfigError, check_ranges, load_config, ranged
from gem.model.config import ModelConfig

PRECISIONS = ("fp32", "bf16", "auto")  # auto: gem/training/precision.py
ENGINES = ("native", "lightning")
DECAYS = ("none", "linear", "cosine")  # optim.lr_decay
DENSE_MODES = ("replicate", "shard")  # sharding.dense: DDP, FSDP2


@dataclass(kw_only=True)
class OptimConfig:
    dense_lr: float = ranged(1e-3, ge=0)  # 0: the dense part stays as initialised (e.g. init_from)
    weight_decay: float = ranged(0.0, ge=0)
    betas: list[float] = ranged(default_factory=lambda: [0.9, 0.999], ge=0, lt=1)
    embedding_lr: float = ranged(0.05, ge=0)  # fused row-wise Adagrad on the torchrec tables
    embedding_eps: float = ranged(1e-8, gt=0)
    grad_clip: float = ranged(0.0, ge=0)  # dense max-norm; 0 disables
    warmup_steps: int = ranged(0, ge=0)
    # after warmup: "none" keeps dense_lr; "linear"/"cosine" fall to dense_lr * min_lr_ratio
    # at the last step (max_steps, else epochs x batches per epoch)
    lr_decay: str = "none"
    min_lr_ratio: float = ranged(0.0, ge=0, le=1)


@dataclass(kw_only=True)
class ShardingConfig:
    ebc: str = "table_wise"
    ec: str = "table_wise"
    # each rank's cap for its embedding tables and their optimizer state (0: none); larger
    # tables are sharded row-wise, a cap too small for the tables is refused (gem/training/planning.py)
    rank_memory_mib: float = ranged(0.0, ge=0)
    # the dense part across ranks: "replicate" (DDP) or "shard" (FSDP2, fully_shard)
    dense: str = "replicate"


@dataclass(kw_only=True)
class TrainConfig:
    model_preset: str = "tiny"
    engine: str = "native"  # "lightning": single process, unsharded tables
    batch_size: int = ranged(256, gt=0)  # global, across ranks
    epochs: int = ranged(1, gt=0)
    max_steps: int = ranged(0, ge=0)  # 0: run every epoch to the end
    seed: int = 0
    precision: str = "fp32"
    compile: bool = False
    activation_checkpointing: bool = False
    task_weights: list[float] = ranged(default_factory=lambda: [1.0, 1.0], ge=0)  # click, conversion
    optim: OptimConfig = field(default_factory=OptimConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    num_workers: int = ranged(0, ge=0)
    # torch intra-op threads; 0: chosen by timing steps (torch's default or 1, gem/training/threads.py)
    threads: int = ranged(0, ge=0)
    shuffle: bool = True
    # "time": day by day, oldest first (the model ends on the freshest day, as on the live
    # stream); "random": shards in a seeded random order. See gem/features/loader.py.
    shard_order: str = "time"
    checkpoint_every: int = ranged(100, ge=0)  # steps; 0 disables periodic checkpoints
    keep_checkpoints: int = ranged(2, ge=1)
    log_every: int = ranged(10, ge=0)
    eval_batches: int = ranged(0, ge=0)  # 0: the whole eval set
    synthetic_examples: int = ranged(4096, gt=0)  # size of --features synthetic://
    tracking_uri: str = ""  # "": sqlite:///<out>/mlflow.db
    experiment: str = "gem-pretrain"
    run_name: str = ""
    system_metrics: bool = True
    log_model: bool = True
    measure_peak: bool = True
    # train on a window whose histories are longer than the kernels' tested range (gem/limits.py)
    allow_long_sequences: bool = False

    def validate(self) -> "TrainConfig":
        """Every setting checked before any work (ConfigError naming the key)."""
        check_ranges(self)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision={self.precision!r} must be one of {PRECISIONS}")
        from gem.features.config import SHARD_ORDERS

        if self.shard_order not in SHARD_ORDERS:
            raise ConfigError(f"shard_order={self.shard_order!r} must be one of {SHARD_ORDERS}")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine={self.engine!r} must be one of {ENGINES}")
        if len(self.task_weights) != 2:
            raise ConfigError(f"task_weights={self.task_weights} must have one weight per task (click, conversion)")
        if not any(w > 0 for w in self.task_weights):
            raise ConfigError(f"task_weights={self.task_weights}: every task weighs 0, so the loss is 0 and "
                              "nothing is learned; give click a weight > 0")
        if len(self.optim.betas) != 2:
            raise ConfigError(f"optim.betas={self.optim.betas} must be two numbers in [0, 1)")
        if self.sharding.dense not in DENSE_MODES:
            raise ConfigError(f"sharding.dense={self.sharding.dense!r} must be one of {DENSE_MODES} "
                              "(DDP, FSDP2)")
        if self.optim.lr_decay not in DECAYS:
            raise ConfigError(f"optim.lr_decay={self.optim.lr_decay!r} must be one of {DECAYS}")
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
