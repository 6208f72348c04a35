"""The time protocol: which days train the teacher, which the students, which judge them.

Teacher ``[start, teacher_end)``, students ``[teacher_end, student_end)``, holdout
``[student_end, end)``; UTC ISO-8601 strings, whole days cut from the dataset's own
days. ``window_tag`` is the one spelling of a window used in lineage tags.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from pathlib import Path

from gem.data.contract import Manifest


@dataclass(kw_only=True, frozen=True)
class Windows:
    start: str
    teacher_end: str
    student_end: str
    end: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def window_tag(start: object, end: object) -> str:
    """``<start>..<end>``: how a [start, end) window is written in tags and summaries."""
    return f"{start}..{end}"


def dataset_window_tag(data: str | Path) -> str:
    manifest = Manifest.read(Path(data))
    return window_tag(manifest.window_start, manifest.window_end)


def _midnight(day: dt.date) -> str:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.timezone.utc).isoformat()


def split_windows(data: str | Path, *, student_days: int = 1, holdout_days: int = 1,
                  teacher_days: int = 0) -> Windows:
    """Teacher gets every day but the last ``student_days + holdout_days`` (only the
    last ``teacher_days`` of those when > 0: continued pretraining on fresh days)."""
    manifest = Manifest.read(Path(data))
    days = manifest.days()
    needed = student_days + holdout_days + 1
    if len(days) < needed:
        raise ValueError(f"{data}: {len(days)} day(s) in the window; the protocol needs at least {needed} "
                         f"(teacher + {student_days} student + {holdout_days} holdout)")
    teacher_end = days[-(student_days + holdout_days)]
    student_end = days[-holdout_days]
    start = manifest.start.isoformat()
    if teacher_days > 0:
        first = days.index(teacher_end) - teacher_days
        if first < 0:
            raise ValueError(f"{data}: teacher_days={teacher_days} reaches before the dataset's first day")
        start = _midnight(days[first])
    return Windows(start=start, teacher_end=_midnight(teacher_end), student_end=_midnight(student_end),
                   end=manifest.end.isoformat())
