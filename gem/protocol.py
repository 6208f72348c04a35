"""The time protocol: which days train the teacher, which the students, which judge them.

Teacher ``[start, teacher_end)``, students ``[teacher_end, student_end)``, holdout
``[student_end, end)``; UTC ISO-8601 strings: whole days cut from the dataset's own
days (``split_windows``) or at given time cut points (``cut_windows``). ``window_tag``
is the one spelling of a window used in lineage tags.

Explicit splits of the examples from outside (a benchmark's or a paper's protocol):
``Split`` (time cut points, or a file of example ids with their part) and its
functions ``assign_split`` and ``quantile_cuts``. ``python -m gem score`` and ``train``
take one as ``--cut ISO`` (once or twice) or ``--split-file``; the features loader keeps
one part of it row for row (``FeatureLoader(..., split=, part=)``).
"""

from __future__ import annotations

import datetime as dt
import functools
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


def cut_windows(data: str | Path, cuts: list[str]) -> Windows:
    """The three windows at explicit time cut points: ``cuts`` = [teacher_end,
    student_end] (ISO-8601), strictly increasing and strictly inside the dataset's window."""
    from gem.data.contract import parse_utc

    manifest = Manifest.read(Path(data))
    if len(cuts) != 2:
        raise ValueError(f"cuts: two time cut points (teacher end, student end), got {list(cuts)}")
    points = [manifest.start, *(parse_utc(c) for c in cuts), manifest.end]
    if not all(a < b for a, b in zip(points, points[1:])):
        raise ValueError(f"cuts {list(cuts)} must be increasing and inside {data}'s window "
                         f"[{manifest.start.isoformat()}, {manifest.end.isoformat()})")
    return Windows(start=points[0].isoformat(), teacher_end=points[1].isoformat(), student_end=points[2].isoformat(),
                   end=points[3].isoformat())


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
    frame = _read_ids(path)
    if not {"example_id", "part"} <= set(frame.columns):
        raise ValueError(f"{path}: needs columns example_id and part (one of {SPLIT_PARTS})")
    bad = ~frame["part"].isin(SPLIT_PARTS).to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{path}: row {row}: field part = {frame['part'].iloc[row]!r}; parts are {SPLIT_PARTS} "
                         f"({int(bad.sum())} such rows)")
    twice = frame["example_id"].duplicated().to_numpy()
    if twice.any():
        row = int(np.flatnonzero(twice)[0])
        raise ValueError(f"{path}: row {row}: example_id {frame['example_id'].iloc[row]} is listed twice")
    part = pd.Series(frame["part"].to_numpy(), index=frame["example_id"].astype(np.int64).to_numpy())
    return part.reindex(example_id).fillna("").to_numpy(dtype=object)


@dataclass(frozen=True)
class Split:
    """An explicit split of a window's examples: ``cuts`` (microseconds; one: train/test,
    two: train/validation/test, a cut point starting the later part) or ``ids_file`` (a
    Parquet/CSV file with columns example_id, part). ``key`` names it in loader states."""

    cuts: tuple[int, ...] = ()
    ids_file: str = ""

    def __post_init__(self):
        if bool(self.cuts) == bool(self.ids_file):
            raise ValueError("a split is time cut points or a file of example ids: give exactly one")
        if self.cuts and len(self.cuts) not in (1, 2):
            raise ValueError(f"cuts: one or two time cut points, got {list(self.cuts)}")

    @classmethod
    def from_options(cls, cuts: list[str] | None = None, ids_file: str | Path | None = None) -> "Split | None":
        """From command-line options (ISO-8601 cut points, a file path); None when neither."""
        from gem.data.contract import parse_utc

        if not cuts and not ids_file:
            return None
        us = tuple(int(round(parse_utc(c).timestamp() * 1_000_000)) for c in cuts or ())
        return cls(cuts=us, ids_file=str(Path(ids_file).resolve()) if ids_file else "")

    @property
    def names(self) -> tuple[str, ...]:
        """The parts this split can assign (a file: those it lists)."""
        if self.cuts:
            return ("train", "test") if len(self.cuts) == 1 else SPLIT_PARTS
        return tuple(p for p in SPLIT_PARTS if p in set(_read_ids(self.ids_file)["part"]))

    @property
    def key(self) -> str:
        if self.cuts:
            return "cuts=" + ",".join(str(c) for c in sorted(self.cuts))
        import hashlib

        return "ids=" + hashlib.sha256(Path(self.ids_file).read_bytes()).hexdigest()[:16]

    def parts(self, example_id, time_us):
        """object (N,): the part of each example ("" = in no part)."""
        return assign_split(example_id, time_us, cuts=list(self.cuts) or None, ids_file=self.ids_file or None)


def _read_ids(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such split file (columns example_id, part)")
    stat = path.stat()
    return _read_ids_cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read_ids_cached(path: str, mtime_ns: int, size: int):
    import pandas as pd  # a loader asks once per shard: the file is read once while unchanged

    return pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
