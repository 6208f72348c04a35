"""Shared adapter plumbing: tolerant raw readers with quarantine, and dataset writing."""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa

from gem.data.contract import ITEMS_FILE, USERS_FILE, Manifest
from gem.data.io import claim_dataset_output, write_events_by_day, write_json_atomic, write_parquet_atomic

CONVERSION_DIR = "_conversion"  # underscore: skipped by Parquet dataset readers


@dataclass
class AdapterReport:
    """Raw-line accounting: for every raw file, lines read = converted + quarantined."""

    source: str
    lines: dict[str, int] = field(default_factory=dict)
    converted: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)
    quarantine_rows: list[dict] = field(default_factory=list, repr=False)

    def quarantine(self, file: str, line: int, raw: str, reason: str) -> None:
        self.quarantine_rows.append({"source_file": file, "line": line, "raw": raw, "reason": reason})
        self.quarantined[file] = self.quarantined.get(file, 0) + 1
        key = f"{file}.{reason}"
        self.reasons[key] = self.reasons.get(key, 0) + 1

    @property
    def reconciles(self) -> bool:
        return all(self.converted.get(f, 0) + self.quarantined.get(f, 0) == n for f, n in self.lines.items())


def read_delimited(path: Path, sep: str, columns: list[str], *, ints: list[str], report: AdapterReport,
                   encoding: str = "utf-8", checks: dict[str, Callable[[pd.Series], pd.Series]] | None = None,
                   header: bool = False) -> pd.DataFrame:
    """Read a delimited file (gzip when its name ends in .gz; ``sep`` may be
    several characters, as MovieLens-1M's "::"); quarantine lines with the wrong field
    count, non-integer values in ``ints`` or failing ``checks``. Adds a 1-based ``line`` column
    (the file's own line number). ``header``: the first line must name ``columns``; it is
    not a data line and is not counted."""
    text = read_text(path, encoding)
    lines = text.splitlines()
    name = path.name
    first = 1
    if header:
        if not lines or lines[0].strip().split(sep) != columns:
            raise ValueError(f"{path}: line 1 must be the header {sep.join(columns)!r}, got "
                             f"{(lines[0] if lines else '')[:200]!r}")
        text, lines, first = text.split("\n", 1)[1] if "\n" in text else "", lines[1:], 2
    report.lines[name] = len(lines)
    rows, kept = [], []
    split = (csv.reader(io.StringIO(text), delimiter=sep, quoting=csv.QUOTE_NONE) if len(sep) == 1
             else (line.split(sep) for line in lines))
    for number, fields_ in enumerate(split, first):
        if len(fields_) != len(columns):
            report.quarantine(name, number, sep.join(fields_), f"field_count:{len(fields_)}!={len(columns)}")
            continue
        rows.append(fields_)
        kept.append(number)
    frame = pd.DataFrame(rows, columns=columns)
    frame["line"] = np.asarray(kept, dtype=np.int64)
    bad = np.zeros(len(frame), bool)
    reasons = np.full(len(frame), "", dtype=object)
    for col in ints:
        parsed = pd.to_numeric(frame[col].str.strip(), errors="coerce")
        wrong = parsed.isna().to_numpy() | (parsed % 1 != 0).to_numpy()
        reasons[wrong & ~bad] = f"not_integer:{col}"
        bad |= wrong
        frame[col] = parsed.fillna(0).astype(np.int64)
    for col, check in (checks or {}).items():
        wrong = ~check(frame[col]).to_numpy()
        reasons[wrong & ~bad] = f"out_of_range:{col}"
        bad |= wrong
    for i in np.flatnonzero(bad):
        report.quarantine(name, int(frame["line"].iat[i]), sep.join(rows[i]), reasons[i])
    frame = frame[~bad].reset_index(drop=True)
    report.converted[name] = len(frame)
    return frame


def rating_events(ratings: pd.DataFrame, surface: np.ndarray) -> pa.Table:
    """Ratings (columns line, user_id, item_id, rating, timestamp in unix seconds) as ad
    impressions at their time: event_id = the line, click = rating >= 4, conversion =
    rating == 5 with conversion_time = event_time (the rating reveals both at once)."""
    from gem.data.contract import EVENTS_SCHEMA

    n = len(ratings)
    event_time = pd.to_datetime(ratings["timestamp"].to_numpy(), unit="s", utc=True)
    conversion = (ratings["rating"] == 5).to_numpy()
    return pa.table(
        {
            "event_id": pa.array(ratings["line"].to_numpy(np.int64)),
            "user_id": pa.array(ratings["user_id"].to_numpy(np.int64)),
            "item_id": pa.array(ratings["item_id"].to_numpy(np.int64)),
            "is_ad": pa.array(np.ones(n, bool)),
            "surface": pa.array(np.asarray(surface, dtype=object)),
            "event_time": pa.array(event_time, type=EVENTS_SCHEMA.field("event_time").type),
            "event_type": pa.array(["impression"] * n),
            "click": pa.array((ratings["rating"] >= 4).to_numpy().astype(np.int8)),
            "conversion": pa.array(conversion.astype(np.int8)),
            "conversion_time": pa.array(event_time.where(conversion), type=EVENTS_SCHEMA.field("conversion_time").type),
            "click_time": pa.nulls(n, EVENTS_SCHEMA.field("click_time").type),  # known at the rating
            "role": pa.nulls(n, pa.string()),
        },
        schema=EVENTS_SCHEMA,
    )


def day_window(events: pa.Table) -> tuple[str, str]:
    """[first UTC midnight, the midnight after the last day) of the events' times, ISO."""
    import datetime as dt

    times = pd.to_datetime(events.column("event_time").to_numpy(), utc=True)
    first = times.min().floor("D").to_pydatetime()
    return first.isoformat(), (times.max().floor("D").to_pydatetime() + dt.timedelta(days=1)).isoformat()


def read_text(path: Path, encoding: str = "utf-8") -> str:
    """A raw file's text, gunzipped when its name ends in .gz."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding=encoding, newline="") as fh:
            return fh.read()
    return path.read_text(encoding=encoding)


def finish_dataset(out_dir: Path, manifest: Manifest, events: pa.Table, users: pa.Table, items: pa.Table,
                   report: AdapterReport) -> Manifest:
    """Write the contract dataset plus the adapter's quarantine and report."""
    claim_dataset_output(out_dir, inputs=(report.source,))
    write_parquet_atomic(users, out_dir / USERS_FILE)
    write_parquet_atomic(items, out_dir / ITEMS_FILE)
    write_events_by_day(events, out_dir)
    quarantine = pa.Table.from_pylist(
        report.quarantine_rows,
        schema=pa.schema([("source_file", pa.string()), ("line", pa.int64()), ("raw", pa.string()),
                          ("reason", pa.string())]),
    )
    write_parquet_atomic(quarantine, out_dir / CONVERSION_DIR / "quarantine.parquet")
    summary = {k: v for k, v in asdict(report).items() if k != "quarantine_rows"}
    summary |= {"reconciles": report.reconciles, "events": events.num_rows, "users": users.num_rows,
                "items": items.num_rows}
    write_json_atomic(summary, out_dir / CONVERSION_DIR / "report.json")
    manifest.extra = dict(manifest.extra, conversion=summary)
    manifest.write(out_dir)
    return manifest
