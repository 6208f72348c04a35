"""Late and corrected data where no refresh state exists (the recurring refresh pipeline
on a cluster): the days each committed run read, kept beside the promotion journal.

The run's commit (``promote``) records every event day's content digest of its dataset
under the tracking root (``.runs/data_days.json``, one entry per dataset folder). The
next refresh run's ingest compares the dataset with that record, as the local refresh
compares it with its ``state.json`` (gem_app.refresh.state.find_late_data): a day at or
before the last recorded one that changed or is new is refused (``late_data=refuse``,
the compiled refresh pipeline's default) or backfilled (``backfill``: the teacher
window reaches back to the earliest such day; every window is rebuilt from the current
data), never ignored. A run that fails never reaches the commit, so it records nothing.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from gem.utils.atomic import write_json
from gem_app.refresh.cycle import backfill_teacher_days
from gem_app.refresh.state import LATE_DATA_POLICIES, LateData, LateDataRefused, find_late_data

RECORD = "data_days.json"
KEEP_DATASETS = 20  # the record keeps the newest datasets' entries (a local refresh reads a new view each cycle)


def _path(tracking_root: str | Path) -> Path:
    from gem_app.stages.gate import COMMIT_DIR

    return Path(tracking_root) / COMMIT_DIR / RECORD


def committed_days(tracking_root: str | Path, data: str | Path) -> dict:
    """{"last_day", "days": {day: digest}} the last committed run recorded for ``data``
    ({} when none did)."""
    path = _path(tracking_root)
    if not path.is_file():
        return {}
    return json.loads(path.read_text()).get(str(Path(data).resolve()), {})


def record_committed_days(tracking_root: str | Path, data: str | Path, digests: dict[str, str]) -> None:
    """At a run's commit: ``data``'s days as that run read them."""
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
