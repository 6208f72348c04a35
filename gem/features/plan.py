"""BuildPlan: what a features build covers, shared by every (possibly remote) step.

The plan is written to ``OUT/_work/plan.json`` by ``prepare_build`` so that shard
builds fanned out to other processes or pipeline tasks need only (plan path, shard).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

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
    stage_groups: list[list[str]]  # consecutive history days staged together (one pass each)
    example_days: list[str]  # first day of each shard period (one shard per bucket and period)
    period_days: list[int]  # days of each period (the chosen width: see shard_periods)
    days_per_shard: int  # as configured: 0 = chosen from events per day, N = every period N days
    shard_events: int  # the events per bucket a period is filled to when days_per_shard is 0
    max_seq_len: int
    num_buckets: int
    include_organic: bool
    feast_repo: str
    surfaces: list[str] = field(default_factory=lambda: list(SURFACES))  # the data's (gem.data.profile)
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    data_tasks: list[str] = field(default_factory=lambda: list(TASKS))  # the tasks with labels in the data
    data_warnings: list[str] = field(default_factory=list)  # gem.data.profile's, shown again in the report
    # the point-in-time counters' jobs, each a group of key kinds (gem.features.counters); [] = no counters
    counter_groups: list[list[str]] = field(default_factory=list)

    @property
    def work_dir(self) -> Path:
        return Path(self.out_dir) / WORK_DIR

    @property
    def staging_dir(self) -> Path:
        return self.work_dir / "staging"

    @property
    def index_dir(self) -> Path:
        return self.work_dir / "index"

    @property
    def feast_dir(self) -> Path:
        return self.work_dir / "feast"

    @property
    def shards_dir(self) -> Path:
        return Path(self.out_dir) / SHARDS_DIR

    def counters_dir(self, job: int) -> Path:
        return self.work_dir / "counters" / f"job={job:02d}"

    def part_dir(self, bucket: int, part: int) -> Path:
        """Staged events of one bucket and period (``part`` -1: before the first period)."""
        name = "base" if part < 0 else f"part={part:05d}"
        return self.staging_dir / f"bucket={bucket:03d}" / name

    def staging_file(self, bucket: int, part: int, group: int) -> Path:
        return self.part_dir(bucket, part) / f"group={group:05d}.parquet"

    def index_file(self, bucket: int, part: int) -> Path:
        return self.index_dir / f"bucket={bucket:03d}" / f"part={part:05d}.parquet"

    def base_file(self, bucket: int) -> Path:
        """The stored events from before the first period, all columns (the first shard's)."""
        return self.index_dir / f"bucket={bucket:03d}" / "base.parquet"

    def period_starts_us(self) -> np.ndarray:
        return np.array([day_start_us(d) for d in self.example_days], dtype=np.int64)

    def part_of(self, event_time_us: np.ndarray) -> np.ndarray:
        """int64 (n,): the period of each event time, -1 before the first one."""
        return np.searchsorted(self.period_starts_us(), event_time_us, side="right").astype(np.int64) - 1

    def period_index(self, day: str) -> int:
        try:
            return self.example_days.index(day)
        except ValueError:
            raise ValueError(f"{self.out_dir}: no shard period starts on {day}") from None

    def period_us(self, day: str) -> tuple[int, int]:
        """[start, end) in microseconds of the shard period starting at ``day``."""
        lo = day_start_us(day)
        return lo, lo + self.period_days[self.period_index(day)] * US_PER_DAY

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
        fields = json.loads(path.read_text())
        if "period_days" not in fields:
            raise ValueError(f"{path}: a plan of an older layout; run prepare_build again")
        return cls(**fields)


def shard_periods(window: list[str], day_events: dict[str, int], *, days_per_shard: int, shard_events: int,
                  num_buckets: int) -> tuple[list[str], list[int]]:
    """(first day, days) of each shard period over the window's days. ``days_per_shard``
    N >= 1: N days each. 0: consecutive days are merged until the period holds
    ``shard_events`` events per bucket (``day_events``: events per day, e.g. from the
    Parquet footers), so the shards follow the events, not the calendar: a dense day is
    a period of its own, a sparse year a few."""
    if days_per_shard:
        starts = window[::days_per_shard]
        return starts, [days_per_shard] * len(starts)
    target = shard_events * num_buckets
    starts, days, filled = [], [], target
    for day in window:
        if filled >= target:
            starts.append(day)
            days.append(0)
            filled = 0
        days[-1] += 1
        filled += day_events.get(day, 0)
    return starts, days


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
