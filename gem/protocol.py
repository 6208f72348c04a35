"""The time protocol: which days train the teacher, which the students, which judge them.

Teacher ``[start, teacher_end)``, students ``[teacher_end, student_end)``, holdout
``[student_end, end)``; UTC ISO-8601 strings: whole days cut from the dataset's own
days (``split_windows``) or at given time cut points (``cut_windows``). ``window_tag``
is the one spelling of a window used in lineage tags. ``overlap_students`` lets the
students also train on the teacher window's last days (``student_start`` before
``teacher_end``: as GEM's verticals train on the days their foundation model saw); the
rows from ``teacher_end`` stay the fresh ones (the students' validation part, the
adapter's fit).

Explicit splits of the examples from outside (a benchmark's or a paper's protocol):
``Split`` (time cut points, or a file of example ids with their part) and its
functions ``assign_split`` and ``quantile_cuts``. ``python -m gem score`` and ``train``
take one as ``--cut ISO`` (once or twice) or ``--split-file``; the features loader keeps
one part of it row for row (``FeatureLoader(..., split=, part=)``).
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from gem.data.contract import Manifest
from gem.errors import UserError


@dataclass(kw_only=True, frozen=True)
class Windows:
    start: str
    teacher_end: str
    student_end: str
    end: str
    student_start: str = ""  # "" = teacher_end (no overlap)

    def as_dict(self) -> dict[str, str]:
        return asdict(self) | {"student_start": self.students_from}

    @property
    def students_from(self) -> str:
        """Where the students' training window starts (teacher_end unless overlapped)."""
        return self.student_start or self.teacher_end


ALL_TEACHER_DAYS = -1  # student_overlap_days: the students train on every day of the teacher's window


def overlap_students(windows: Windows, days: int) -> Windows:
    """``windows`` with the students' window starting ``days`` days before the teacher's
    end (at most at the teacher's start; 0: no overlap; ``ALL_TEACHER_DAYS``: at the
    teacher's start)."""
    from gem.data.contract import parse_utc

    if days < 0 and days != ALL_TEACHER_DAYS:
        raise WindowError(f"student_overlap_days={days} must be >= 0 (or {ALL_TEACHER_DAYS}: the teacher's every day)")
    if not days:
        return windows
    if days == ALL_TEACHER_DAYS:
        return replace(windows, student_start=windows.start)
    start = max(parse_utc(windows.teacher_end) - dt.timedelta(days=days), parse_utc(windows.start))
    return replace(windows, student_start=start.isoformat())


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
        raise WindowError(f"{data}: {len(days)} day(s) in the window; the protocol needs at least {needed} "
                          f"(teacher + {student_days} student + {holdout_days} holdout)")
    teacher_end = days[-(student_days + holdout_days)]
    student_end = days[-holdout_days]
    start = manifest.start.isoformat()
    if teacher_days > 0:
        first = days.index(teacher_end) - teacher_days
        if first < 0:
            raise WindowError(f"{data}: teacher_days={teacher_days} reaches before the dataset's first day")
        start = _midnight(days[first])
    return Windows(start=start, teacher_end=_midnight(teacher_end), student_end=_midnight(student_end),
                   end=manifest.end.isoformat())


def cut_windows(data: str | Path, cuts: list[str]) -> Windows:
    """The three windows at explicit time cut points: ``cuts`` = [teacher_end,
    student_end] (ISO-8601), strictly increasing and strictly inside the dataset's window."""
    from gem.data.contract import parse_utc

    manifest = Manifest.read(Path(data))
    if len(cuts) != 2:
        raise WindowError(f"cuts: two time cut points (teacher end, student end), got {list(cuts)}")
    points = [manifest.start, *(parse_utc(c) for c in cuts), manifest.end]
    if not all(a < b for a, b in zip(points, points[1:])):
        raise WindowError(f"cuts {list(cuts)} must be increasing and inside {data}'s window "
                          f"[{manifest.start.isoformat()}, {manifest.end.isoformat()})")
    return Windows(start=points[0].isoformat(), teacher_end=points[1].isoformat(), student_end=points[2].isoformat(),
                   end=points[3].isoformat())


class WindowError(UserError, ValueError):
    """A protocol window the data cannot fill: no example, or examples of one label only."""


@dataclass(kw_only=True, frozen=True)
class Evidence:
    """What the student and the holdout windows must each hold, per surface, for a student
    to be trained and judged there: ``examples`` examples with ``positives`` clicked and as
    many unclicked ones, and the window at least ``min_share`` of the log's examples; each
    window takes at most ``max_share`` of them (the teacher keeps the rest). A surface that
    cannot reach the minimum within that cap gets no student."""

    examples: int = 200
    positives: int = 30  # the promotion gate's own floor (gem_app/promotion.py GateConfig.min_positives)
    min_share: float = 0.0
    max_share: float = 0.25

    def check(self) -> "Evidence":
        if self.examples < 1 or self.positives < 1:
            raise ValueError(f"window evidence: examples ({self.examples}) and positives ({self.positives}) must be "
                             ">= 1")
        if not (0.0 <= self.min_share <= self.max_share <= 0.5):  # NaN fails too
            raise ValueError(f"window evidence: need 0 <= min_share ({self.min_share}) <= max_share "
                             f"({self.max_share}) <= 0.5")
        return self

    @classmethod
    def from_dict(cls, raw: dict | None) -> "Evidence":
        """From pipeline parameters (kfp turns ints into floats); unknown keys refused."""
        known = {f: type(v) for f, v in asdict(cls()).items()}
        unknown = sorted(set(raw or {}) - set(known))
        if unknown:
            raise ValueError(f"window evidence: unknown setting(s) {unknown}; known: {sorted(known)}")
        return cls(**{k: known[k](v) for k, v in (raw or {}).items()}).check()

    def describe(self) -> str:
        share = f", >= {self.min_share:.0%} of the log" if self.min_share else ""
        return (f">= {self.examples} examples, {self.positives} clicked and {self.positives} unclicked per surface"
                f"{share}, at most {self.max_share:.0%} of the log's examples per window")


@dataclass
class EvidenceChoice:
    """Windows chosen by evidence, what each holds, and the surfaces that get students."""

    windows: Windows
    surfaces: list[str]
    sizes: dict[str, dict[str, dict[str, int]]]  # window -> surface -> examples / clicks
    warnings: list[str]

    def lines(self) -> dict[str, str]:
        """Per window: its span and what it holds, in a few words."""
        out = {}
        for name, (lo, hi) in (("student", (self.windows.teacher_end, self.windows.student_end)),
                               ("holdout", (self.windows.student_end, self.windows.end))):
            sizes = self.sizes[name]
            n, c = sum(v["examples"] for v in sizes.values()), sum(v["clicks"] for v in sizes.values())
            fewest = min(self.surfaces, key=lambda s: sizes[s]["clicks"]) if self.surfaces else None
            low = (f"; fewest clicks {fewest} {sizes[fewest]['clicks']}/{sizes[fewest]['examples']}"
                   if fewest else "")
            out[f"{name} window"] = f"{lo[:10]}..{hi[:10]} {n:,} examples, {c:,} clicked{low}"
        return out


def evidence_windows(data: str | Path, evidence: Evidence, *, student_days: int = 0,
                     holdout_days: int = 0) -> EvidenceChoice:
    """The latest holdout span, and the span before it for the students, each the
    shortest run of whole days in which every surface that can reach ``evidence`` within
    the window's cap does (``student_days`` / ``holdout_days`` > 0: that many days
    instead). A WindowError when no surface can reach it in either window."""
    from gem.data.profile import daily_counts

    evidence.check()
    manifest = Manifest.read(Path(data))
    counts = daily_counts(data)
    days, ex, clicks = counts.days, counts.examples, counts.clicks
    declared = counts.declared
    total = int(ex.sum())
    if len(days) < 3:
        raise WindowError(f"{data}: events on {len(days)} day(s); the protocol needs at least 3 (teacher, student, "
                          "holdout)")

    def satisfied(lo: int, hi: int) -> np.ndarray:
        n, c = ex[lo:hi].sum(axis=0), clicks[lo:hi].sum(axis=0)
        return (n >= evidence.examples) & (c >= evidence.positives) & (n - c >= evidence.positives)

    def choose(hi: int, fixed: int, floor: int, wanted: np.ndarray | None) -> tuple[int, np.ndarray]:
        """The start of the window ending before day index ``hi`` and the surfaces it serves."""
        if fixed:
            first_day = days[hi - 1] - fixed + 1 if hi else 0
            lo = int(np.searchsorted(days, first_day))
            if lo <= floor:
                raise WindowError(f"{data}: {fixed} day(s) reach back to the data's first days; fewer, or --cut")
            return lo, satisfied(lo, hi)
        cap_lo = hi - 1  # the longest window within the cap (at least one day)
        while cap_lo - 1 > floor and ex[cap_lo - 1:hi].sum() <= evidence.max_share * total:
            cap_lo -= 1
        reach = satisfied(cap_lo, hi) & (wanted if wanted is not None else True)
        for lo in range(hi - 1, cap_lo - 1, -1):
            if (satisfied(lo, hi) >= reach).all() and ex[lo:hi].sum() >= evidence.min_share * total:
                return lo, reach
        return cap_lo, reach

    h, in_holdout = choose(len(days), holdout_days, 1, None)
    s, in_student = choose(h, student_days, 0, in_holdout)
    served = in_holdout & in_student
    bounds = {"student": (s, h), "holdout": (h, len(days))}
    sizes = {name: {d: {"examples": int(ex[lo:hi, i].sum()), "clicks": int(clicks[lo:hi, i].sum())}
                    for i, d in enumerate(declared)} for name, (lo, hi) in bounds.items()}
    warnings = []
    for i, surface in enumerate(declared):
        if served[i] or not ex[:, i].any():
            continue
        has = "; ".join(f"{name} {sizes[name][surface]['examples']} examples, {sizes[name][surface]['clicks']} "
                        f"clicked" for name in bounds)
        warnings.append(f"surface {surface!r} gets no student: it has {has}; each window needs {evidence.describe()}")
    if not served.any():
        raise WindowError(
            f"{data}: no surface reaches {evidence.describe()} in both the student and the holdout window "
            f"({total:,} examples over {len(days)} days with events). Lower the evidence "
            "(window_evidence: examples / positives / max_share) or give the windows: --student-days N "
            "--holdout-days N, or --cut TEACHER_END --cut STUDENT_END")
    start = _day_iso(days[s])
    windows = Windows(start=manifest.start.isoformat(), teacher_end=start, student_end=_day_iso(days[h]),
                      end=manifest.end.isoformat())
    return EvidenceChoice(windows=windows, surfaces=[d for i, d in enumerate(declared) if served[i]], sizes=sizes,
                          warnings=warnings)


def _day_iso(day: int) -> str:
    return _midnight(dt.date(1970, 1, 1) + dt.timedelta(days=int(day)))


def _us(iso: str) -> int:
    from gem.data.contract import parse_utc

    return int(round(parse_utc(iso).timestamp() * 1_000_000))


def check_windows(data: str | Path, windows: Windows, asked: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The surfaces students can be made for, and warnings. Every window must hold
    clicked and unclicked examples (the teacher learns, the students learn, the holdout
    ranks), else a WindowError that says how many examples the data has a day and how to
    widen the windows. A surface without both labels in the student or the holdout
    window gets no student (a warning), or fails when ``asked`` names it."""
    from gem.data.profile import SurfaceError, profile_dataset

    bounds = {"teacher": (windows.start, windows.teacher_end), "student": (windows.teacher_end, windows.student_end),
              "holdout": (windows.student_end, windows.end)}
    profiles = {name: profile_dataset(data, start_us=_us(lo), end_us=_us(hi)) for name, (lo, hi) in bounds.items()}
    for name, prof in profiles.items():
        n, c = sum(prof.examples.values()), sum(prof.clicks.values())
        if n == 0 or c in (0, n):
            whole = profile_dataset(data)
            total = sum(whole.examples.values())
            per_day = total / max(whole.span_days, 1)
            lo, hi = bounds[name]
            raise WindowError(
                f"{data}: the {name} window [{lo}, {hi}) holds {n} example(s), {c} clicked; a model needs clicked "
                f"and unclicked examples there. The data has {total:,} examples over {whole.span_days} days "
                f"({per_day:.1f} a day): widen the windows (pipeline run --student-days N --holdout-days N) or "
                f"give the cut points (--cut TEACHER_END --cut STUDENT_END)")
    usable, warnings = [], []
    for surface in profiles["teacher"].declared_surfaces:
        short = [name for name in ("student", "holdout")
                 if not 0 < profiles[name].clicks.get(surface, 0) < profiles[name].examples.get(surface, 0)]
        if not short:
            usable.append(surface)
        elif any(profiles[name].examples.get(surface, 0) for name in profiles):
            warnings.append(f"surface {surface!r} has no clicked and unclicked examples in the {' and '.join(short)} "
                            f"window(s): no student for it")
    if asked:
        missing = [s for s in asked if s not in usable]
        if missing:
            raise SurfaceError(f"surface(s) {missing} cannot get a student: the student and holdout windows hold "
                               f"clicked and unclicked examples only on {usable}")
        usable = [s for s in usable if s in asked]
    return usable, warnings


# -- explicit splits from outside: time cut points or a file of example ids -------------

SPLIT_PARTS = ("train", "validation", "test")


class SplitError(UserError, ValueError):
    """An explicit split that cannot be used: a split file that is unreadable or breaks
    its rules, cut points that are not one or two, a part that holds no example."""


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
        raise SplitError("give exactly one of cuts (time cut points) or ids_file (example ids per part)")
    if cuts is not None:
        cuts = sorted(int(c) for c in cuts)
        if len(cuts) not in (1, 2):
            raise SplitError(f"--cut: one or two time cut points, got {len(cuts)}")
        names = ("train", "test") if len(cuts) == 1 else SPLIT_PARTS
        return np.asarray(names, dtype=object)[np.searchsorted(cuts, np.asarray(time_us, np.int64), side="right")]
    path = Path(ids_file)
    frame = _read_ids(path)
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
            raise SplitError("a split is time cut points or a file of example ids: give exactly one")
        if self.cuts and len(self.cuts) not in (1, 2):
            raise SplitError(f"--cut: one or two time cut points, got {len(self.cuts)}")

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

    def evaluated_part(self, asked: str = "") -> str:
        """The part a training run evaluates: ``asked``, by default "validation" when the
        split has one, else "test"; never "train" (it would measure nothing)."""
        if asked == "train":
            raise SplitError("eval_part: evaluating on the training part would measure nothing")
        return asked or ("validation" if "validation" in self.names else "test")

    def describe(self, part: str) -> str:
        """The examples ``part`` holds, in words: its event-time bounds (ISO-8601 UTC), or
        the file that lists them."""
        if self.ids_file:
            return f"the examples {self.ids_file} lists as {part!r}"
        iso = [dt.datetime.fromtimestamp(c / 1e6, tz=dt.timezone.utc).isoformat() for c in sorted(self.cuts)]
        names = self.names
        if part not in names:
            return (f"a split at {len(iso)} cut point(s) has parts {list(names)} only"
                    + ("; two --cut give train, validation and test" if len(iso) == 1 else ""))
        i = names.index(part)
        lo, hi = (iso[i - 1] if i else None), (iso[i] if i < len(iso) else None)
        return "event time " + (f"before {hi}" if lo is None else f"from {lo}" if hi is None else f"in [{lo}, {hi})")

    def empty_part(self, part: str, features: str | Path, window: dict | None = None) -> SplitError:
        """The refusal of a part of this split that holds no example of ``features``."""
        span = f"; the window is [{window['start']}, {window['end']})" if window else ""
        way = ": choose cut points inside it" if self.cuts and part in self.names else ""
        return SplitError(f"{features}: no example in part {part!r} of the split ({self.describe(part)}){span}{way}")

    def parts(self, example_id, time_us):
        """object (N,): the part of each example ("" = in no part)."""
        return assign_split(example_id, time_us, cuts=list(self.cuts) or None, ids_file=self.ids_file or None)


def _read_ids(path: str | Path):
    """The split file's rows, checked: readable, columns example_id and part, every part
    one of SPLIT_PARTS, no example listed twice (SplitError naming the file and row)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such split file (columns example_id, part)")
    stat = path.stat()
    return _read_ids_cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read_ids_cached(path: str, mtime_ns: int, size: int):
    import pandas as pd  # a loader asks once per shard: the file is read once while unchanged

    rule = f"a split file is Parquet (.parquet) or CSV with columns example_id and part (one of {SPLIT_PARTS})"
    try:
        frame = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SplitError(f"{path}: not readable ({first}); {rule}") from None
    if not {"example_id", "part"} <= set(frame.columns):
        raise SplitError(f"{path}: columns {list(frame.columns)}; {rule}")
    bad = ~frame["part"].isin(SPLIT_PARTS).to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise SplitError(f"{path}: row {row}: field part = {frame['part'].iloc[row]!r}; parts are {SPLIT_PARTS} "
                         f"({int(bad.sum())} such rows)")
    try:
        frame["example_id"] = frame["example_id"].astype(np.int64)
    except (TypeError, ValueError, OverflowError):
        raise SplitError(f"{path}: column example_id must hold integer example ids") from None
    twice = frame["example_id"].duplicated().to_numpy()
    if twice.any():
        row = int(np.flatnonzero(twice)[0])
        raise SplitError(f"{path}: row {row}: example_id {frame['example_id'].iloc[row]} is listed twice")
    return frame
