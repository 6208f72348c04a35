"""A generated matrix of contract datasets with the shapes real data has and the
simulator does not: one surface, no conversions, string-like ids, many events at the
same second, a 3-year span with few events per day, users without attributes."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gem.data.contract import EVENTS_SCHEMA, USERS_FILE, USERS_SCHEMA, Manifest, event_files, with_optional_columns
from gem.data.io import write_events_by_day

SHAPES = ("one_surface", "no_conversions", "string_ids", "same_second", "three_years", "users_without_attributes")


def _events(root: Path):
    frames = [with_optional_columns(pq.read_table(p)).select(EVENTS_SCHEMA.names).to_pandas()
              for p in event_files(root)]
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def _rewrite(root: Path, frame, manifest: Manifest) -> None:
    shutil.rmtree(root / "events")
    write_events_by_day(pa.Table.from_pandas(frame, schema=EVENTS_SCHEMA, preserve_index=False), root)
    manifest.write(root)


def make_shape(base: Path, out: Path, shape: str) -> Path:
    """``base`` (a small simulated dataset) turned into ``shape`` at ``out``."""
    shutil.copytree(base, out, ignore=shutil.ignore_patterns("_validation", ".gem-output"))
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
    elif shape == "three_years":  # the same events spread over 3 years: few per day
        rng = np.random.default_rng(0)
        start = ev["event_time"].min().floor("D")
        offset = np.sort(rng.integers(0, 3 * 365 * 86_400, len(ev)))
        order = np.argsort(ev["event_time"].to_numpy(), kind="stable")
        new_time = np.empty(len(ev), dtype="datetime64[us]")
        new_time[order] = (start.to_datetime64() + offset.astype("timedelta64[s]")).astype("datetime64[us]")
        import pandas as pd

        delay = ev["conversion_time"] - ev["event_time"]
        ev["event_time"] = pd.to_datetime(new_time, utc=True)
        ev["conversion_time"] = ev["event_time"] + delay
        manifest.window_end = (start + dt.timedelta(days=3 * 365 + 1)).isoformat()
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
