"""FeaturesConfig: every knob of the features stage (presets in gem/configs/features/)."""

from __future__ import annotations

from dataclasses import dataclass

from gem.config import ConfigError

# the orders the features loader reads shards in (here, not in the loader: configs check
# them without importing torch)
SHARD_ORDERS = ("random", "time")


@dataclass(kw_only=True)
class FeaturesConfig:
    max_seq_len: int = 1024  # last-N history events per example (the loader truncates to this)
    num_buckets: int = 8  # user hash buckets; shards are (bucket, period of whole UTC days)
    # days per shard period; 0 = chosen from the data: consecutive days are merged until a
    # period holds about shard_events events per bucket (a sparse 3-year log gets few
    # shards, a dense day stays a shard of its own); N >= 1: every period is N days
    days_per_shard: int = 0
    shard_events: int = 100_000
    include_organic: bool = False  # also emit an example for every organic event
    # False: label-blind histories (items acted on strictly before, without their labels;
    # no prior CTR): the peers' protocol (benchmarks/quality, protocol "peers")
    history_labels: bool = True
    # point-in-time counters of the item, advertiser, category, (surface, item) and user
    # (gem.features.counters) as dense features of every example
    counters: bool = False
    min_count: int = 1  # user/item ids seen fewer times before the window end map to 0
    vocab_from: str = ""  # a previous features dir whose vocabularies are reused
    workers: int = 0  # processes for staging and shard builds; 0 = one per core
    feast_repo: str = ""  # Feast repo with the definitions; "" = the project's feature_repo/
    recent_k: int = 20  # length of the Feast online recent-behaviour arrays
    keep_work: bool = False  # keep the staging/Feast work dir after the build (debugging)
    # rows the data validator quarantines: "refuse" the dataset, or "quarantine" them
    # and build from the valid rows (gem/features/validation.py)
    on_invalid: str = "refuse"

    def check(self) -> None:
        if not 1 <= self.max_seq_len <= 65_536:
            raise ConfigError(f"features.max_seq_len must be in [1, 65536], got {self.max_seq_len}")
        if not 1 <= self.num_buckets <= 4096:
            raise ConfigError(f"features.num_buckets must be in [1, 4096], got {self.num_buckets}")
        if not 0 <= self.days_per_shard <= 366:
            raise ConfigError(f"features.days_per_shard must be 0 (auto) or in [1, 366], got {self.days_per_shard}")
        if self.shard_events < 1:
            raise ConfigError(f"features.shard_events must be >= 1, got {self.shard_events}")
        if self.min_count < 1:
            raise ConfigError(f"features.min_count must be >= 1, got {self.min_count}")
        if self.recent_k < 1:
            raise ConfigError(f"features.recent_k must be >= 1, got {self.recent_k}")
        if self.on_invalid not in ("refuse", "quarantine"):
            raise ConfigError(f"features.on_invalid must be 'refuse' or 'quarantine', got {self.on_invalid!r}")
        if self.workers < 0:
            raise ConfigError(f"features.workers must be >= 0, got {self.workers}")
