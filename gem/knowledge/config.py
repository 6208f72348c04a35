"""KnowledgeConfig (presets in ``gem/configs/knowledge/<name>.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from gem.config import ConfigError


@dataclass(kw_only=True)
class KnowledgeConfig:
    batch_size: int = 1024  # impressions per teacher forward
    threads: int = 0  # torch intra-op threads; 0: chosen by timing batches (gem/training/threads.py)
    embeddings: bool = True  # also write the user/item embedding tables
    precision: str = "fp32"  # "bf16": autocast the teacher forward
    # torch.compile the teacher's dense blocks (compiled code cached beside the output,
    # <workspace>/compile-cache in the pipeline: gem/training/compile_cache.py); off: on
    # this project's 2-core CPUs it was not faster (docs/training-efficiency.md)
    compile: bool = False
    # days before the first downstream window that the knowledge also covers (from the
    # window before it), so that its first day's requests read what the last
    # materializations wrote instead of nothing
    lead_days: int = 2

    def validate(self) -> "KnowledgeConfig":
        if self.batch_size < 1:
            raise ConfigError(f"knowledge.batch_size={self.batch_size} must be >= 1")
        if self.lead_days < 0:
            raise ConfigError(f"knowledge.lead_days={self.lead_days} must be >= 0")
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"knowledge.precision={self.precision!r} must be fp32 or bf16")
        return self
