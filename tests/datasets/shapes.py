"""A generated matrix of contract datasets with the shapes real data has and the
simulator does not: one surface, no conversions, string-like ids, many events at the
same second, a 3-year span with few events per day, users without attributes, a dense
past with a sparse recent tail."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gem.data.contract import EVENTS_SCHEMA, USERS_FILE, USERS_SCHEMA, Manifest, event_files, with_optional_columns
from gem.data.io import write_events_by_day

SHAPES = ("one_surface", "no_conversions", "string_ids", "same_second", "three_years", "users_without_attributes",
          "sparse_tail")


def _events(root: Path):
    frames = [with_optional_columns(pq.read_table(p)).select(EVENTS_SCHEMA.names).to_pandas()
              for p in event_files(root)]
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def _rewrite(root: Path, frame, manifest: Manifest) -> None:
    shutil.rmtree(root / "events")
    write_events_by_day(pa.Table.from_pandas(frame, schema=EVENTS_SCHEMA, preserve_index=False), root)
    manifest.write(root)


def _spread(ev, start, span_s: int, every_days: int = 1):
    """The events moved to sorted random times over ``span_s`` seconds from ``start`` (on
    every ``every_days``-th day only), in their time order; delays kept."""
    import pandas as pd

    rng = np.random.default_rng(0)
    offset = np.sort(rng.integers(0, span_s, len(ev)))
    offset = offset // (every_days * 86_400) * (every_days * 86_400) + offset % 86_400
    order = np.argsort(ev["event_time"].to_numpy(), kind="stable")
    new_time = np.empty(len(ev), dtype="datetime64[us]")
    new_time[order] = (start.to_datetime64() + offset.astype("timedelta64[s]")).astype("datetime64[us]")
    delay = ev["conversion_time"] - ev["event_time"]
    click_delay = ev["click_time"] - ev["event_time"]
    ev = ev.copy()
    ev["event_time"] = pd.to_datetime(new_time, utc=True)
    ev["conversion_time"] = ev["event_time"] + delay
    ev["click_time"] = ev["event_time"] + click_delay
    return ev


def repeated_years(base: Path, out: Path, years: int, every_days: int = 7) -> Path:
    """``base``'s events spread over one year (on every ``every_days``-th day), repeated
    for ``years`` years with new event ids: the same events per day whatever the span,
    while every user's history keeps growing year after year."""
    import pandas as pd

    shutil.copytree(base, out, ignore=shutil.ignore_patterns("_validation", ".gem-output", ".profile.npz"))
    manifest = Manifest.read(out)
    ev = _events(out)
    start = ev["event_time"].min().floor("D")
    year = _spread(ev, start, 365 * 86_400, every_days)
    step = int(ev["event_id"].max()) + 1
    copies = []
    for k in range(years):
        copy = year.copy()
        for column in ("event_time", "conversion_time", "click_time"):
            copy[column] = copy[column] + dt.timedelta(days=365 * k)
        copy["event_id"] = copy["event_id"] + k * step
        copies.append(copy)
    manifest.window_end = (start + dt.timedelta(days=365 * years + 1)).isoformat()
    _rewrite(out, pd.concat(copies, ignore_index=True), manifest)
    return out


def make_shape(base: Path, out: Path, shape: str) -> Path:
    """``base`` (a small simulated dataset) turned into ``shape`` at ``out``."""
    import pandas as pd

    shutil.copytree(base, out, ignore=shutil.ignore_patterns("_validation", ".gem-output", ".profile.npz"))
    manifest = Manifest.read(out)
    ev = _events(out)
    if shape == "one_surface":  # a single surface named by the data, and no conversion at all
        ev["surface"] = "search"
        ev["conversion"] = 0
        ev["conversion_time"] = None
        manifest.surfaces = ["search"]
    elif shape == "no_conversions":
        ev["conversion"] = 0
        ev["conversion_time"] = None
    elif shape == "string_ids":  # ids given as numeric strings in the files (the validator coerces them)
        shutil.rmtree(out / "events")
        for day, part in ev.groupby(ev["event_time"].dt.date):
            part = part.astype({"user_id": str, "item_id": str, "event_id": str})
            target = out / "events" / f"day={day.isoformat()}"
            target.mkdir(parents=True)
            pq.write_table(pa.Table.from_pandas(part, preserve_index=False), target / "part-0.parquet")
        return out
    elif shape == "same_second":  # every event of a user's day at one second
        ev["event_time"] = ev["event_time"].dt.floor("D") + dt.timedelta(hours=12)
        ev["conversion_time"] = ev["conversion_time"].where(ev["conversion_time"].isna(), ev["event_time"]
                                                            + dt.timedelta(seconds=1))
    elif shape == "three_years":  # the same events spread over 3 years, on every 7th day: few per day
        start = ev["event_time"].min().floor("D")
        ev = _spread(ev, start, 3 * 365 * 86_400, every_days=7)
        manifest.window_end = (start + dt.timedelta(days=3 * 365 + 1)).isoformat()
    elif shape == "sparse_tail":  # a dense past, then the last two days' events spread thin over 120 days
        last = ev["event_time"].dt.floor("D").max() - dt.timedelta(days=1)
        tail = ev["event_time"] >= last
        ev = pd.concat([ev[~tail], _spread(ev[tail], last, 120 * 86_400, every_days=3)], ignore_index=True)
        manifest.window_end = (last + dt.timedelta(days=121)).isoformat()
    elif shape == "users_without_attributes":
        users = pq.read_table(out / USERS_FILE)
        pq.write_table(pa.table({"user_id": users.column("user_id")} | {
            c: pa.nulls(users.num_rows, pa.string()) for c in USERS_SCHEMA.names[1:]}, schema=USERS_SCHEMA),
            out / USERS_FILE)
        return out
    else:
        raise ValueError(shape)
    _rewrite(out, ev, manifest)
    return out


def make_shapes(base: Path, out: Path, shapes: list[str]) -> Path:
    """``base`` turned into every shape of ``shapes`` at once, applied in the given order
    ("string_ids" must come last: it writes the ids as strings, as a raw file would)."""
    if "string_ids" in shapes[:-1]:
        raise ValueError("string_ids must be the last shape")
    source = base
    for i, shape in enumerate(shapes):
        target = out if i == len(shapes) - 1 else out.parent / f"{out.name}.{i}-{shape}"
        source = make_shape(source, target, shape)
    return out
