"""Windows of a features build and the keys of their impressions.

A "window" is a features directory (``gem features build``) optionally narrowed to the
shards whose UTC day lies in ``[start, end)``. ``example_keys`` returns, per impression,
what Feast joins on: the impression id, the raw (contract) user and item ids, the
surface and the event time.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd

from gem.data.contract import parse_utc
from gem.features.loader import read_manifest
from gem.features.segments import read_examples, read_segment
from gem.features.vocab import Vocabularies

KEY_COLUMNS = ("example_id", "user_id", "item_id", "surface", "event_timestamp")


def select_shards(features_dir: str | Path, start: str | None = None, end: str | None = None) -> list[str]:
    """Names of the shards with a day in [start, end) (UTC ISO dates or times). A shard
    spans ``days`` days from its first ``day`` (wide shards of a sparse log), so it is
    picked when any of them overlaps the window; its rows outside are the caller's to drop
    (generate_knowledge reads them through a time-cut split)."""
    manifest = read_manifest(features_dir)
    lo = parse_utc(start) if start else None
    hi = parse_utc(end) if end else None
    out = []
    for shard in manifest["shards"]:
        day = dt.date.fromisoformat(shard["day"])
        first = dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc)
        last = first + dt.timedelta(days=int(shard.get("days", 1)))
        if (lo is None or last > lo) and (hi is None or first < hi):
            out.append(shard["name"])
    return out


def window_bounds(features_dir: str | Path, start: str | None = None, end: str | None = None) -> tuple[str, str]:
    """The effective [start, end) of a window: the build's window narrowed by start/end."""
    window = read_manifest(features_dir)["window"]
    lo, hi = parse_utc(window["start"]), parse_utc(window["end"])
    if start:
        lo = max(lo, parse_utc(start))
    if end:
        hi = min(hi, parse_utc(end))
    return lo.isoformat(), hi.isoformat()


def example_keys(features_dir: str | Path, shards: list[str] | None = None) -> pd.DataFrame:
    """One row per impression of the shards: KEY_COLUMNS, with raw ids (item_id -1 when
    the item is outside the build's vocabulary) and a UTC event_timestamp."""
    features_dir = Path(features_dir)
    names = shards if shards is not None else [s["name"] for s in read_manifest(features_dir)["shards"]]
    items = Vocabularies.read(features_dir).values["item_id"].to_numpy(zero_copy_only=False)
    frames = []
    for name in names:
        shard = features_dir / "shards" / name
        # examples hold dense ids; the raw user id is on the user row of the example's own event
        ex = read_examples(shard, read_segment(shard))
        frames.append(pd.DataFrame({"example_id": ex["example_id"], "item_id": ex["item_id"], "surface": ex["surface"],
                                    "event_time": ex["event_time"], "user_id": ex["raw_user_id"]}))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in KEY_COLUMNS})
    df = pd.concat(frames, ignore_index=True)
    dense_item = df["item_id"].to_numpy().astype(np.int64)
    raw_item = np.where(dense_item > 0, items[np.maximum(dense_item - 1, 0)] if len(items) else -1, -1)
    return pd.DataFrame({
        "example_id": df["example_id"].astype(np.int64),
        "user_id": df["user_id"].astype(np.int64),
        "item_id": raw_item.astype(np.int64),
        "surface": df["surface"].astype(np.int64),
        "event_timestamp": pd.to_datetime(df["event_time"].astype(np.int64), unit="us", utc=True),
    })
