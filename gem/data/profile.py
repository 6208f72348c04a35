"""What a contract dataset holds: its surfaces, its labels, and what is degenerate.

``profile_dataset(DIR)`` scans a few narrow columns of every event file once and says
which of the manifest's surfaces have events (in manifest order: the dataset's
surface vocabulary), which tasks the labels support (``click`` always, ``conversion``
only when some row converts), examples / clicks / conversions per surface, and the
span of days (the features stage sizes its shards from it). ``warnings`` lists what a
model cannot learn from: a declared surface without events, a surface whose examples
have no click, a constant label, users or items without any attribute.

Every stage that plans per surface or per task (features spec, model heads, students,
gate, knowledge, summary) follows ``surfaces`` / ``tasks`` from here, never a fixed
vocabulary.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gem.data.contract import (
    ITEM_ATTRIBUTES,
    ITEMS_FILE,
    TIMESTAMP,
    USER_ATTRIBUTES,
    USERS_FILE,
    DatasetHandle,
    event_files,
)
from gem.errors import UserError

US_PER_DAY = 86_400_000_000


class SurfaceError(UserError, ValueError):
    """A surface was asked for that the dataset does not have."""


@dataclass
class DataProfile:
    declared_surfaces: list[str]
    surfaces: list[str]  # declared surfaces with at least one event, manifest order
    tasks: list[str]  # "click", plus "conversion" when any row converts
    events: int = 0
    examples: dict[str, int] = field(default_factory=dict)  # ad rows (role not history) per surface
    clicks: dict[str, int] = field(default_factory=dict)
    conversions: dict[str, int] = field(default_factory=dict)
    delayed_clicks: int = 0  # rows whose click became known after event_time
    roles: dict[str, int] = field(default_factory=dict)
    first_day: int = 0  # days since 1970 of the first / last event
    last_day: int = 0
    active_days: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def span_days(self) -> int:
        return self.last_day - self.first_day + 1 if self.events else 0

    def to_dict(self) -> dict:
        return asdict(self) | {"span_days": self.span_days}

    def require_surfaces(self, asked: list[str] | None) -> list[str]:
        """The surfaces to plan for: ``asked`` (checked) or all of the data's."""
        if not asked:
            return list(self.surfaces)
        absent = [s for s in asked if s not in self.surfaces]
        if absent:
            raise SurfaceError(f"surface(s) {absent} not in the dataset; it has events on {self.surfaces}"
                               + (f" (declared but empty: {sorted(set(self.declared_surfaces) - set(self.surfaces))})"
                                  if set(self.declared_surfaces) - set(self.surfaces) else ""))
        return [s for s in self.surfaces if s in asked]


def _column(table: pa.Table, name: str, default) -> np.ndarray:
    if name not in table.column_names or pa.types.is_null(table.column(name).type):  # absent, or all null
        return np.full(table.num_rows, default)
    return pc.fill_null(table.column(name), default).to_numpy(zero_copy_only=False)


def _day_of(path: Path) -> int | None:
    """Days since 1970 of an event file's ``day=YYYY-MM-DD`` folder (the contract puts
    every event in its own day's folder; the validator quarantines the rest)."""
    import datetime as dt

    name = path.parent.name
    try:
        return (dt.date.fromisoformat(name.split("=", 1)[1]) - dt.date(1970, 1, 1)).days
    except (IndexError, ValueError):
        return None


ROLE_NAMES = ("both", "history", "example")
COLUMNS = ("surface", "is_ad", "click", "conversion", "event_time", "click_time", "role")
CACHE_FILE = ".profile.npz"  # hidden: skipped by digests and event readers
CACHE_VERSION = 1


@dataclass
class DailyCounts:
    """Per UTC day of event time (``days``: days since 1970) and declared surface: rows,
    examples, clicks, conversions; per day: delayed clicks and rows per role. Every
    whole-day window's profile is a sum over these rows."""

    declared: list[str]
    days: np.ndarray  # (D,) int64
    rows: np.ndarray  # (D, S) int64
    examples: np.ndarray
    clicks: np.ndarray
    conversions: np.ndarray
    delayed: np.ndarray  # (D,)
    roles: np.ndarray  # (D, len(ROLE_NAMES))

    def between(self, first_day: int | None, end_day: int | None) -> "DailyCounts":
        keep = np.ones(len(self.days), bool)
        if first_day is not None:
            keep &= self.days >= first_day
        if end_day is not None:
            keep &= self.days < end_day
        return DailyCounts(self.declared, *(getattr(self, f)[keep] for f in _ARRAYS))

    def events_by_day(self) -> dict[str, int]:
        """Rows on a declared surface per UTC day, ``YYYY-MM-DD`` (a day without any: absent)."""
        import datetime as dt

        epoch = dt.date(1970, 1, 1)
        return {(epoch + dt.timedelta(days=int(d))).isoformat(): int(n)
                for d, n in zip(self.days, self.rows.sum(axis=1))}


_ARRAYS = ("days", "rows", "examples", "clicks", "conversions", "delayed", "roles")


def _fingerprint(data_dir: Path, files: list[Path]) -> str:
    """The event files and manifest by name, size and modification time: what the cached
    counts were made from (a rewritten or added file changes it)."""
    import hashlib

    h = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    for path in [data_dir / "manifest.json", *files]:
        st = path.stat()
        h.update(f"{path.relative_to(data_dir)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


BATCH_ROWS = 1 << 20  # rows counted at a time: memory follows a batch, not the log (100M events: ~4 GB at once)


def _read_events(files: list[Path]) -> Iterator[pa.Table]:
    """The profile's columns of ``files`` from one dataset scan, a batch at a time (a file
    without an optional column reads it as null). _TypesDisagree when the files' types
    do (then ``_read_each``)."""
    import pyarrow.dataset as ds

    schema = _schema()
    try:
        scanner = ds.dataset([str(f) for f in files], schema=schema, format="parquet").scanner(
            columns=list(COLUMNS), batch_size=BATCH_ROWS)
        for batch in scanner.to_batches():
            yield pa.Table.from_batches([batch], schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _TypesDisagree(str(exc)) from exc


def _read_each(files: list[Path]) -> Iterator[pa.Table]:
    """``_read_events`` file by file, each column cast to the contract's type."""
    schema = _schema()
    for path in files:
        names = set(pq.ParquetFile(path).schema_arrow.names)
        table = pq.read_table(path, columns=[c for c in COLUMNS if c in names])
        yield pa.table({c: (table.column(c).cast(schema.field(c).type) if c in names
                            else pa.nulls(table.num_rows, schema.field(c).type)) for c in COLUMNS})


class _TypesDisagree(Exception):
    pass


def _schema() -> pa.Schema:
    from gem.data.contract import EVENTS_SCHEMA

    return pa.schema([EVENTS_SCHEMA.field(c) for c in COLUMNS])


def _count_files(files: list[Path], declared: list[str], start_us: int | None, end_us: int | None) -> DailyCounts:
    """The counts of ``files``, a batch at a time and summed per day: memory follows a
    batch, not the log (the whole log's columns at once took ~4 GB at 100M events)."""
    try:
        return _sum_days([_count(t, declared, start_us, end_us) for t in _read_events(files)], declared)
    except _TypesDisagree:  # counted again file by file: nothing of the failed scan is kept
        return _sum_days([_count(t, declared, start_us, end_us) for t in _read_each(files)], declared)


def _sum_days(parts: list[DailyCounts], declared: list[str]) -> DailyCounts:
    days = np.unique(np.concatenate([p.days for p in parts])) if parts else np.zeros(0, np.int64)
    n_s = len(declared)
    shapes = {"rows": (n_s,), "examples": (n_s,), "clicks": (n_s,), "conversions": (n_s,), "delayed": (),
              "roles": (len(ROLE_NAMES),)}
    out = {f: np.zeros((len(days), *shape), np.int64) for f, shape in shapes.items()}
    for part in parts:
        at = np.searchsorted(days, part.days)  # a part's days are distinct
        for f in out:
            out[f][at] += getattr(part, f)
    return DailyCounts(declared=list(declared), days=days.astype(np.int64), **out)


def _count(table: pa.Table, declared: list[str], start_us: int | None, end_us: int | None) -> DailyCounts:
    n_s = len(declared)
    t = table.column("event_time").cast(TIMESTAMP).cast(pa.int64()).to_numpy(zero_copy_only=False)
    surface = pc.fill_null(pc.index_in(table.column("surface"), value_set=pa.array(declared)), -1)
    surface = surface.to_numpy(zero_copy_only=False)
    keep = surface >= 0
    if start_us is not None:
        keep &= t >= start_us
    if end_us is not None:
        keep &= t < end_us
    t, surface = t[keep], surface[keep]
    is_ad = _column(table, "is_ad", False).astype(bool)[keep]
    click = _column(table, "click", 0).astype(np.int64)[keep]
    conv = _column(table, "conversion", 0).astype(np.int64)[keep]
    role = _column(table, "role", "both").astype(object)[keep]
    ct = table.column("click_time").cast(TIMESTAMP).cast(pa.int64())
    has_ct = ~pc.is_null(ct).to_numpy(zero_copy_only=False)[keep]
    ctv = pc.fill_null(ct, 0).to_numpy(zero_copy_only=False)[keep]
    days, day_index = np.unique(t // US_PER_DAY, return_inverse=True)
    cell = day_index * n_s + surface
    size = len(days) * n_s
    example = is_ad & (role != "history")

    def per_cell(weights) -> np.ndarray:
        return np.bincount(cell, weights=weights, minlength=size).astype(np.int64).reshape(len(days), n_s)

    roles = np.stack([np.bincount(day_index, weights=role == name, minlength=len(days)) for name in ROLE_NAMES],
                     axis=1).astype(np.int64)
    return DailyCounts(
        declared=list(declared), days=days.astype(np.int64), rows=per_cell(None), examples=per_cell(example),
        clicks=per_cell(example * click), conversions=per_cell(example * conv),
        delayed=np.bincount(day_index, weights=has_ct & (click == 1) & (ctv > t), minlength=len(days)).astype(np.int64),
        roles=roles)


def daily_counts(data: str | Path | DatasetHandle) -> DailyCounts:
    """Every event file's counts per day and surface, from one scan; kept beside the data
    (``.profile.npz``, hidden) under the files' fingerprint, so later stages and windows of
    an unchanged dataset read no event file again."""
    dataset = DatasetHandle.open(data)
    data_dir = dataset.root
    declared = list(dataset.manifest.surfaces)
    files = event_files(data_dir)
    key = _fingerprint(data_dir, files)
    cache = data_dir / CACHE_FILE
    if cache.is_file():
        try:
            with np.load(cache, allow_pickle=False) as saved:
                if str(saved["key"]) == key and list(saved["declared"]) == declared:
                    return DailyCounts(declared, *(saved[f] for f in _ARRAYS))
        except (OSError, ValueError, KeyError):
            pass  # unreadable: counted again
    counts = _count_files(files, declared, None, None)
    try:
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, key=np.array(key), declared=np.array(declared), **{f: getattr(counts, f) for f in _ARRAYS})
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only dataset: counted on every call
    return counts


def profile_dataset(data: str | Path | DatasetHandle, *, start_us: int | None = None,
                    end_us: int | None = None) -> DataProfile:
    """The profile of ``data``'s events (only those in [start_us, end_us) when given).
    Whole-day windows are sums of ``daily_counts`` (one scan per dataset, cached); a window
    cut inside a day scans only the event files of the days it touches."""
    dataset = DatasetHandle.open(data)
    data_dir = dataset.root
    aligned = all(b is None or b % US_PER_DAY == 0 for b in (start_us, end_us))
    if aligned:
        counts = daily_counts(dataset).between(None if start_us is None else start_us // US_PER_DAY,
                                                None if end_us is None else end_us // US_PER_DAY)
    else:
        files = [f for f in event_files(data_dir) if (day := _day_of(f)) is None or not (
            (start_us is not None and (day + 1) * US_PER_DAY <= start_us)
            or (end_us is not None and day * US_PER_DAY >= end_us))]
        counts = _count_files(files, list(dataset.manifest.surfaces), start_us, end_us)
    return _profile(counts, data_dir)


def _profile(counts: DailyCounts, data_dir: Path) -> DataProfile:
    declared = counts.declared
    rows = counts.rows.sum(axis=0)
    examples, clicks, conversions = (getattr(counts, f).sum(axis=0) for f in ("examples", "clicks", "conversions"))
    surfaces = [s for i, s in enumerate(declared) if rows[i] > 0]
    tasks = ["click"] + (["conversion"] if conversions.sum() > 0 else [])
    roles = {name: int(n) for name, n in zip(ROLE_NAMES, counts.roles.sum(axis=0)) if n}
    active = counts.days[counts.rows.sum(axis=1) > 0]
    prof = DataProfile(
        declared_surfaces=declared, surfaces=surfaces, tasks=tasks, events=int(rows.sum()),
        examples={s: int(examples[i]) for i, s in enumerate(declared) if s in surfaces},
        clicks={s: int(clicks[i]) for i, s in enumerate(declared) if s in surfaces},
        conversions={s: int(conversions[i]) for i, s in enumerate(declared) if s in surfaces},
        delayed_clicks=int(counts.delayed.sum()), roles=dict(sorted(roles.items())),
        first_day=int(active.min()) if len(active) else 0, last_day=int(active.max()) if len(active) else 0,
        active_days=len(active),
    )
    prof.warnings = degeneracy_warnings(prof, data_dir)
    return prof


def degeneracy_warnings(prof: DataProfile, data_dir: Path | None = None) -> list[str]:
    """What a model cannot learn from, one sentence each (empty: nothing degenerate)."""
    out = []
    empty = [s for s in prof.declared_surfaces if s not in prof.surfaces]
    if empty:
        out.append(f"declared surface(s) {empty} have no events; planning only {prof.surfaces}")
    total_examples = sum(prof.examples.values())
    total_clicks = sum(prof.clicks.values())
    if prof.events and total_examples == 0:
        out.append("no example rows (is_ad rows whose role is not 'history'): nothing to score")
    elif total_examples and total_clicks in (0, total_examples):
        out.append(f"label 'click' is constant ({'all 1' if total_clicks else 'all 0'}) over {total_examples} examples")
    for s in prof.surfaces:
        n, c = prof.examples.get(s, 0), prof.clicks.get(s, 0)
        if n and c == 0:
            out.append(f"surface {s!r} has no positive click among its {n} examples")
        elif n and c == n:
            out.append(f"surface {s!r}: every one of its {n} examples is clicked (constant label)")
    if "conversion" not in prof.tasks:
        out.append("no conversion in the data: task 'conversion' is left out")
    if data_dir is not None:
        for file, attrs in ((USERS_FILE, USER_ATTRIBUTES), (ITEMS_FILE, ITEM_ATTRIBUTES)):
            path = Path(data_dir) / file
            if not path.is_file():
                continue
            names = set(pq.ParquetFile(path).schema_arrow.names)
            table = pq.read_table(path, columns=[a for a in attrs if a in names])
            for a in attrs:
                if a not in table.column_names or table.num_rows == 0:
                    out.append(f"{file}: attribute {a!r} is missing: its feature is unknown (0) for every row")
                    continue
                col = table.column(a)
                known = pc.invert(pc.is_null(col))
                if pa.types.is_integer(col.type) and a in ("advertiser_id", "category_id"):
                    known = pc.and_(known, pc.not_equal(pc.fill_null(col, 0), 0))
                if not pc.any(known).as_py():
                    out.append(f"{file}: attribute {a!r} is null for every row: its feature is unknown (0) for all")
    return out
