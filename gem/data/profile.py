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

from dataclasses import asdict, dataclass, field
from pathlib import Path

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
    Manifest,
    event_files,
)

US_PER_DAY = 86_400_000_000


class SurfaceError(ValueError):
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


def profile_dataset(data_dir: str | Path, *, start_us: int | None = None, end_us: int | None = None) -> DataProfile:
    """Scan the events of ``data_dir`` (only those in [start_us, end_us) when given;
    files of days outside that window are not read)."""
    data_dir = Path(data_dir)
    manifest = Manifest.read(data_dir)
    declared = list(manifest.surfaces)
    n_s = len(declared)
    events = 0
    examples, clicks, conversions = (np.zeros(n_s, np.int64) for _ in range(3))
    rows_per_surface = np.zeros(n_s, np.int64)
    delayed, roles = 0, {}
    days: set[int] = set()
    for path in event_files(data_dir):
        day = _day_of(path)
        if day is not None and ((start_us is not None and (day + 1) * US_PER_DAY <= start_us)
                                or (end_us is not None and day * US_PER_DAY >= end_us)):
            continue
        names = set(pq.ParquetFile(path).schema_arrow.names)
        wanted = ("surface", "is_ad", "click", "conversion", "event_time", "click_time", "role")
        cols = [c for c in wanted if c in names]
        table = pq.read_table(path, columns=cols)
        t = table.column("event_time").cast(TIMESTAMP).cast(pa.int64()).to_numpy(zero_copy_only=False)
        keep = np.ones(len(t), bool)
        if start_us is not None:
            keep &= t >= start_us
        if end_us is not None:
            keep &= t < end_us
        if not keep.any():
            continue
        surface = pc.index_in(table.column("surface"), value_set=pa.array(declared))
        surface = pc.fill_null(surface, -1).to_numpy(zero_copy_only=False)[keep]
        ok = surface >= 0
        surface = surface[ok]
        is_ad = _column(table, "is_ad", False).astype(bool)[keep][ok]
        click = _column(table, "click", 0).astype(np.int64)[keep][ok]
        conv = _column(table, "conversion", 0).astype(np.int64)[keep][ok]
        role = _column(table, "role", "both").astype(object)[keep][ok]
        example = is_ad & (role != "history")
        rows_per_surface += np.bincount(surface, minlength=n_s)
        examples += np.bincount(surface, weights=example, minlength=n_s).astype(np.int64)
        clicks += np.bincount(surface, weights=example * click, minlength=n_s).astype(np.int64)
        conversions += np.bincount(surface, weights=example * conv, minlength=n_s).astype(np.int64)
        if "click_time" in table.column_names:
            ct = table.column("click_time").cast(TIMESTAMP).cast(pa.int64())
            has = ~pc.is_null(ct).to_numpy(zero_copy_only=False)[keep][ok]
            ctv = pc.fill_null(ct, 0).to_numpy(zero_copy_only=False)[keep][ok]
            delayed += int((has & (click == 1) & (ctv > t[keep][ok])).sum())
        values, counts = np.unique(role.astype(str), return_counts=True)
        for v, c in zip(values, counts):
            roles[v] = roles.get(v, 0) + int(c)
        events += int(ok.sum())
        days.update(np.unique(t[keep][ok] // US_PER_DAY).tolist())
    surfaces = [s for i, s in enumerate(declared) if rows_per_surface[i] > 0]
    tasks = ["click"] + (["conversion"] if conversions.sum() > 0 else [])
    prof = DataProfile(
        declared_surfaces=declared, surfaces=surfaces, tasks=tasks, events=events,
        examples={s: int(examples[i]) for i, s in enumerate(declared) if s in surfaces},
        clicks={s: int(clicks[i]) for i, s in enumerate(declared) if s in surfaces},
        conversions={s: int(conversions[i]) for i, s in enumerate(declared) if s in surfaces},
        delayed_clicks=delayed, roles=dict(sorted(roles.items())),
        first_day=min(days) if days else 0, last_day=max(days) if days else 0, active_days=len(days),
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
