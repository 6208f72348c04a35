"""BuildPlan: what a features build covers, shared by every (possibly remote) step.

The plan is written to ``OUT/_work/plan.json`` by ``prepare_build`` so that shard
builds fanned out to other processes or pipeline tasks need only (plan path, shard).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gem.data.contract import DAY_PARTITION, EVENTS_DIR, SURFACES, TASKS, parse_utc
from gem.features.storage import write_json_atomic

WORK_DIR = "_work"
SHARDS_DIR = "shards"
PLAN_FILE = "plan.json"
US_PER_DAY = 86_400_000_000


@dataclass(kw_only=True)
class ShardKey:
    bucket: int
    day: str  # UTC day YYYY-MM-DD of the examples' event_time

    @property
    def name(self) -> str:
        return f"b{self.bucket:03d}-{self.day}"

    @classmethod
    def parse(cls, name: str) -> "ShardKey":
        bucket, _, day = name.partition("-")
        if not bucket.startswith("b") or not day:
            raise ValueError(f"shard name {name!r} must look like b003-2026-01-05")
        return cls(bucket=int(bucket[1:]), day=day)


@dataclass(kw_only=True)
class BuildPlan:
    data_dir: str
    out_dir: str
    window_start: str  # inclusive, UTC ISO-8601
    window_end: str  # exclusive
    window_start_us: int
    window_end_us: int
    history_days: list[str]  # every dataset day up to the window end (history source)
    stage_groups: list[list[str]]  # consecutive history days staged together (one file per bucket)
    example_days: list[str]  # first day of each shard period (one shard per bucket and period)
    days_per_shard: int  # days of impressions per shard (1: bucket x day)
    max_seq_len: int
    num_buckets: int
    include_organic: bool
    feast_repo: str
    surfaces: list[str] = field(default_factory=lambda: list(SURFACES))  # the data's (gem.data.profile)
    tasks: list[str] = field(default_factory=lambda: list(TASKS))

    @property
    def work_dir(self) -> Path:
        return Path(self.out_dir) / WORK_DIR

    @property
    def staging_dir(self) -> Path:
        return self.work_dir / "staging"

    @property
    def feast_dir(self) -> Path:
        return self.work_dir / "feast"

    @property
    def shards_dir(self) -> Path:
        return Path(self.out_dir) / SHARDS_DIR

    def staging_file(self, bucket: int, group: int) -> Path:
        return self.staging_dir / f"bucket={bucket:03d}" / f"group={group:05d}.parquet"

    def period_us(self, day: str) -> tuple[int, int]:
        """[start, end) in microseconds of the shard period starting at ``day``."""
        lo = day_start_us(day)
        return lo, lo + self.days_per_shard * US_PER_DAY

    def groups_until(self, end_us: int) -> list[int]:
        """Indices of the staging groups holding any day before ``end_us``."""
        return [i for i, days in enumerate(self.stage_groups) if day_start_us(days[0]) < end_us]

    def groups_overlapping(self, lo_us: int, hi_us: int) -> list[int]:
        return [i for i, days in enumerate(self.stage_groups)
                if any(lo_us <= day_start_us(d) < hi_us for d in days)]

    def group_of(self, day: str) -> int:
        for i, days in enumerate(self.stage_groups):
            if day in days:
                return i
        return -1

    def write(self) -> Path:
        path = self.work_dir / PLAN_FILE
        write_json_atomic(asdict(self), path)
        return path

    @classmethod
    def read(cls, path: Path) -> "BuildPlan":
        path = Path(path)
        if path.is_dir():
            path = path / WORK_DIR / PLAN_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no build plan; run prepare_build first")
        return cls(**json.loads(path.read_text()))


def to_us(moment: dt.datetime) -> int:
    return int(round(moment.timestamp() * 1_000_000))


def day_start_us(day: str) -> int:
    return to_us(parse_utc(day + "T00:00:00+00:00"))


def dataset_days(data_dir: Path) -> list[str]:
    base = Path(data_dir) / EVENTS_DIR
    return sorted(p.name.split("=", 1)[1] for p in base.glob(f"{DAY_PARTITION}=*") if p.is_dir())


def window_days(start_us: int, end_us: int, every: int = 1) -> list[str]:
    """UTC days of the window, every ``every``-th one (shard period starts)."""
    first = start_us // US_PER_DAY
    last = (end_us - 1) // US_PER_DAY
    epoch = dt.date(1970, 1, 1)
    return [(epoch + dt.timedelta(days=int(d))).isoformat() for d in range(first, last + 1, every)]
