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


# -- explicit splits from outside: time cut points or a file of example ids -------------

SPLIT_PARTS = ("train", "validation", "test")


def quantile_cuts(times_us, quantiles=(0.8, 0.9)) -> list[int]:
    """Cut points (us) of a global time split at ``quantiles`` of example time (the
    peers' protocol: train < cut[0] <= validation < cut[1] <= test)."""
    import numpy as np

    times = np.sort(np.asarray(times_us, dtype=np.int64))
    if not len(times):
        raise ValueError("no example times to cut")
    return [int(times[min(int(q * len(times)), len(times) - 1)]) for q in quantiles]


def assign_split(example_id, time_us, *, cuts: list[int] | None = None, ids_file: str | Path | None = None):
    """object (N,): the part ("train", "validation", "test", or "" = unused) of each
    example, from time ``cuts`` (one cut: train/test; two: train/validation/test) or a
    file of example ids (Parquet or CSV with columns ``example_id`` and ``part``)."""
    import numpy as np
    import pandas as pd

    example_id = np.asarray(example_id, dtype=np.int64)
    if (cuts is None) == (ids_file is None):
        raise ValueError("give exactly one of cuts (time cut points) or ids_file (example ids per part)")
    if cuts is not None:
        cuts = sorted(int(c) for c in cuts)
        if len(cuts) not in (1, 2):
            raise ValueError(f"cuts: one or two time cut points, got {cuts}")
        names = ("train", "test") if len(cuts) == 1 else SPLIT_PARTS
        return np.asarray(names, dtype=object)[np.searchsorted(cuts, np.asarray(time_us, np.int64), side="right")]
    path = Path(ids_file)
    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    if not {"example_id", "part"} <= set(frame.columns):
        raise ValueError(f"{path}: needs columns example_id and part (one of {SPLIT_PARTS})")
    bad = sorted(set(frame["part"]) - set(SPLIT_PARTS))
    if bad:
        raise ValueError(f"{path}: unknown part(s) {bad}; parts are {SPLIT_PARTS}")
    if frame["example_id"].duplicated().any():
        raise ValueError(f"{path}: an example id is listed twice")
    part = pd.Series(frame["part"].to_numpy(), index=frame["example_id"].astype(np.int64).to_numpy())
    return part.reindex(example_id).fillna("").to_numpy(dtype=object)
