"""Late and corrected data: the days up to the last processed one that changed or are new
(``find_late_data``), refused or backfilled, never ignored.

The local refresh compares the data with its ``state.json`` (gem_app.refresh.state).
The recurring refresh pipeline on a cluster keeps no state: each run's commit
(``promote``) records every event day's content digest of its dataset under the
tracking root (``.runs/data_days.json``, one entry per dataset folder), and the next
run's ingest compares the dataset with that record (``late_data_plan``): ``refuse``
(the compiled refresh pipeline's default) fails before any work, naming the days;
``backfill`` widens the teacher window back to the earliest such day, every window
rebuilt from the current data. A run that fails never reaches the commit, so it
records nothing. The digests travel from ingest to the commit in a file
(``write_days``): a long log's days are too many for a task's command line.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path

from gem.data.contract import Manifest
from gem.errors import UserError
from gem.utils.atomic import write_json

LATE_DATA_POLICIES = ("refuse", "backfill")
COMMIT_DIR = ".runs"  # under the tracking root: the promotion journal, its lock and the committed days
RECORD = "data_days.json"  # in COMMIT_DIR: each dataset's days as its last committed run read them
KEEP_DATASETS = 20  # the record keeps the newest datasets' entries (a local refresh reads a new view each cycle)
DAYS_FILE = "data_days.json"  # in the workspace: the days ingest read, for the commit


class LateDataRefused(UserError, RuntimeError):
    """Late or corrected days under ``late_data=refuse``."""


@dataclass
class LateData:
    """Days up to the last processed one that are not as the refresh saw them."""

    changed: list[str] = field(default_factory=list)  # content differs from the processed day's
    added: list[str] = field(default_factory=list)  # not there when processed (late, or older than the first)
    removed: list[str] = field(default_factory=list)  # processed, now gone (reported, not late data)

    def __bool__(self) -> bool:
        return bool(self.changed or self.added)

    @property
    def days(self) -> list[str]:
        return sorted({*self.changed, *self.added})

    def describe(self) -> str:
        parts = [f"{what} {', '.join(days)}" for what, days in (("changed", self.changed), ("new", self.added)) if days]
        return "late or corrected data at or before the last processed day: " + "; ".join(parts)

    def as_dict(self) -> dict:
        return {"changed": self.changed, "added": self.added}


def find_late_data(state: dict, digests: dict[str, str]) -> LateData:
    """What differs, up to the state's last day, between the recorded digests and now."""
    if "last_day" not in state:
        return LateData()
    last, seen = state["last_day"], state.get("days", {})
    late = LateData()
    for day, digest in sorted(digests.items()):
        if day <= last and day not in seen:
            late.added.append(day)
        elif day in seen and seen[day] != digest:
            late.changed.append(day)
    late.removed = sorted(d for d in seen if d not in digests)
    return late


def backfill_teacher_days(view: Path, last_day: dt.date, earliest: dt.date, student_days: int = 1,
                          holdout_days: int = 1) -> int:
    """Days of continued pretraining that reach back to ``earliest`` (the earliest late
    or corrected day): the refresh teacher window [earliest, teacher end), at least the
    usual 1 day, at most the view's days before the teacher end."""
    teacher_end = last_day - dt.timedelta(days=student_days + holdout_days - 1)
    before = [d for d in Manifest.read(view).days() if d < teacher_end]
    return max(1, min((teacher_end - earliest).days, len(before)))




def _path(tracking_root: str | Path) -> Path:
    return Path(tracking_root) / COMMIT_DIR / RECORD


def write_days(workspace: str | Path, digests: dict[str, str]) -> str:
    """The day digests ingest read, written for the commit; their path ("" when none)."""
    if not digests:
        return ""
    path = Path(workspace) / DAYS_FILE
    write_json(dict(sorted(digests.items())), path)
    return str(path)


def read_days(path: str) -> dict[str, str]:
    return json.loads(Path(path).read_text()) if path else {}


def committed_days(tracking_root: str | Path, data: str | Path) -> dict:
    """{"last_day", "days": {day: digest}} the last committed run recorded for ``data``
    ({} when none did)."""
    path = _path(tracking_root)
    if not path.is_file():
        return {}
    return json.loads(path.read_text()).get(str(Path(data).resolve()), {})


def record_committed_days(tracking_root: str | Path, data: str | Path, digests: dict[str, str]) -> None:
    """At a run's commit: ``data``'s days as that run read them (``write_days``' file)."""
    if not digests:
        return
    path = _path(tracking_root)
    whole = json.loads(path.read_text()) if path.is_file() else {}
    key = str(Path(data).resolve())
    whole.pop(key, None)
    whole[key] = {"last_day": max(digests), "days": dict(sorted(digests.items())),
                  "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    whole = dict(list(whole.items())[-KEEP_DATASETS:])  # insertion order: the newest last
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(whole, path)


def late_data_plan(tracking_root: str | Path, data: str | Path, digests: dict[str, str], policy: str, *,
                   teacher_days: int, student_days: int, holdout_days: int) -> tuple[LateData, int]:
    """(what differs from the last committed run's record, the teacher days to use).
    ``refuse`` raises LateDataRefused naming the days; ``backfill`` widens the teacher
    window back to the earliest of them."""
    if policy not in LATE_DATA_POLICIES:
        raise ValueError(f"late_data must be one of {LATE_DATA_POLICIES} (or empty: not checked), got {policy!r}")
    late = find_late_data(committed_days(tracking_root, data), digests)
    if not late:
        return late, teacher_days
    if policy == "refuse":
        raise LateDataRefused(f"{data}: {late.describe()} (recorded by the last committed run in "
                              f"{_path(tracking_root)}); run with the pipeline parameter late_data=backfill to "
                              "rebuild the windows and continue the teacher from the earliest of them, or restore "
                              "those days")
    days = sorted(dt.date.fromisoformat(d) for d in digests)
    widened = backfill_teacher_days(Path(data), days[-1], dt.date.fromisoformat(late.days[0]),
                                    student_days=max(student_days, 1), holdout_days=max(holdout_days, 1))
    return late, max(teacher_days, widened)
