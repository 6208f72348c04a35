"""The files of one shard -- its examples and its history *segment* -- written and read back.

Histories are carried across the shards of a bucket: the shard of period ``d`` stores
only the events of period ``d`` (its segment; the window's first shard also holds the
stored events from before the window), and an example's sequence is read from the
user's events in the segments of its bucket up to its own period. Each stored event is
in exactly one segment. Layout of ``OUT/shards/b003-2026-01-05/``:

- ``history.parquet``, one row per event of the segment, ordered by (user_id,
  event_time, event_id): ``item`` (dense id), ``code`` (event_type +
  5 is_ad + 10 click + 20 hidden + 40 surface, int16; the staged codes, 0 = unknown;
  hidden = a row with role "example", stored for its own example, never in a history),
  ``gap_s`` (whole seconds since the
  user's previous event in the segment; on a user's first event of the segment, seconds
  since the start of the shard's (first) day, negative for events before it) and
  ``conversion_time`` (us, null without conversion), ``click_time`` (us, when a click
  became known; null when known at the event time or without click). Event seconds are floored, so an
  age computed from them is never smaller than the true age.
- ``users.parquet``, one row per user with events in the segment (the user's events
  are the next ``events`` rows of history.parquet): ``user_id`` (raw), ``user`` (dense
  id), ``events``, and ``events_before``, ``ad_impressions_before``,
  ``ad_clicks_before``: counts over the user's events before their first *stored*
  event, nonzero only on the row holding that event (see shards.py for what is stored).
- ``examples.parquet``, one row per example of the period, in history order:
  ``event`` (row of the example's own event in history.parquet: its item, surface,
  click and event second come from there), ``ties`` (events of the same user at the
  same microsecond before it, excluded from its history), ``time_us`` (event_time
  modulo one second), ``example_id``, ``conversion``, one column per attribute
  (``user_<a>``, ``item_<a>``; dense ids from Feast point-in-time).
- ``stats.json``: counts and histograms for the validation report.

Encodings: sorted or counting columns are delta-encoded, wide random ones byte-stream
split, and the rest dictionary encoded (see ``ENCODINGS``), all zstd.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from gem.data.contract import ITEM_ATTRIBUTES, USER_ATTRIBUTES
from gem.features.plan import ShardKey, day_start_us
from gem.features.storage import read_parquet

FORMAT = "gem-features/3"  # manifest format: this layout (histories carried across day shards, label times)
EXAMPLES_FILE, HISTORY_FILE, USERS_FILE = "examples.parquet", "history.parquet", "users.parquet"
STATS_FILE = "stats.json"
SHARD_FILES = (EXAMPLES_FILE, HISTORY_FILE, STATS_FILE, USERS_FILE)
US_PER_S = 1_000_000
NO_CONVERSION = np.iinfo(np.int64).max  # conversion_time of events without one (as staged)
ATTRIBUTE_FEATURES = (*(f"user_{a}" for a in USER_ATTRIBUTES), *(f"item_{a}" for a in ITEM_ATTRIBUTES))
BEFORE_COLUMNS = ("events_before", "ad_impressions_before", "ad_clicks_before")
DELTA, SPLIT = "DELTA_BINARY_PACKED", "BYTE_STREAM_SPLIT"
ENCODINGS = {
    HISTORY_FILE: {"item": SPLIT, "code": SPLIT, "gap_s": SPLIT, "conversion_time": DELTA, "click_time": DELTA},
    USERS_FILE: {"user_id": DELTA, "user": DELTA, "events": SPLIT},
    EXAMPLES_FILE: {"event": DELTA, "time_us": DELTA, "example_id": DELTA},
}
# code = event_type (0..4) + 5 is_ad + 10 click + 20 hidden + 40 surface (0 = unknown, 1..S)
NO_CLICK_TIME = np.iinfo(np.int64).min  # click_time of events whose click was known at event_time


def pack_codes(event_type: np.ndarray, surface: np.ndarray, is_ad: np.ndarray, click: np.ndarray,
               hidden: np.ndarray | None = None) -> np.ndarray:
    """int16 (n,): the small event codes in one value (compresses to their joint entropy)."""
    hidden = np.zeros(len(event_type), np.int32) if hidden is None else hidden
    code = (event_type.astype(np.int32) + 5 * (is_ad > 0) + 10 * (click > 0) + 20 * (hidden > 0)
            + 40 * surface.astype(np.int32))
    if len(code) and code.max() > np.iinfo(np.int16).max:
        raise ValueError(f"{int(surface.max())} surfaces: at most {np.iinfo(np.int16).max // 40 - 1} fit the code")
    return code.astype(np.int16)


def unpack_codes(code: np.ndarray) -> dict[str, np.ndarray]:
    code = code.astype(np.int32)
    return {"event_type": (code % 5).astype(np.int8), "is_ad": (code // 5 % 2).astype(np.int8),
            "click": (code // 10 % 2).astype(np.int8), "hidden": (code // 20 % 2).astype(np.int8),
            "surface": (code // 40).astype(np.int16)}


def ref_second(day: str) -> int:
    """Reference second of the gaps of the shard of ``day``: the start of that UTC day."""
    return day_start_us(day) // US_PER_S


@dataclass
class Segment:
    """The history segment of one shard, decoded: rows (R,) and flat events (n,)."""

    users: dict[str, np.ndarray]  # user_id, user, events, *BEFORE_COLUMNS
    row_offsets: np.ndarray  # int64 (R + 1,): row r is events[row_offsets[r]:row_offsets[r + 1]]
    events: dict[str, np.ndarray]  # item, event_type, surface, is_ad, click, conversion_time, event_s

    def __len__(self) -> int:
        return int(self.row_offsets[-1])


def read_segment(shard_dir: Path) -> Segment:
    users = read_parquet(Path(shard_dir) / USERS_FILE)
    history = read_parquet(Path(shard_dir) / HISTORY_FILE)
    users = {name: users.column(name).to_numpy() for name in users.column_names}
    offsets = np.concatenate([[0], np.cumsum(users["events"], dtype=np.int64)])
    events = unpack_codes(history.column("code").to_numpy())
    events["item"] = history.column("item").to_numpy()
    events["conversion_time"] = pc.fill_null(history.column("conversion_time"), NO_CONVERSION).to_numpy()
    events["click_time"] = pc.fill_null(history.column("click_time"), NO_CLICK_TIME).to_numpy()
    # event seconds: the row's first gap is relative to the shard's day, the others to the previous event
    running = np.cumsum(history.column("gap_s").to_numpy(), dtype=np.int64)
    before_row = np.concatenate([[0], running])[offsets[:-1]]
    ref = ref_second(ShardKey.parse(Path(shard_dir).name).day)
    events["event_s"] = ref + running - np.repeat(before_row, np.diff(offsets))
    return Segment(users=users, row_offsets=offsets, events=events)


def read_examples(shard_dir: Path, segment: Segment) -> dict[str, np.ndarray]:
    """The example columns of a shard, with those read from the example's own event in
    its segment: ``row`` (user row), ``raw_user_id``, ``user_id`` (dense), ``item_id``,
    ``surface`` (index into the spec's surfaces), ``click``, ``event_time`` (us)."""
    table = read_parquet(Path(shard_dir) / EXAMPLES_FILE)
    ex = {name: table.column(name).to_numpy() for name in table.column_names}
    own, ev = ex["event"].astype(np.int64), segment.events
    row = np.searchsorted(segment.row_offsets, own, side="right") - 1
    ex.update(row=row, raw_user_id=segment.users["user_id"][row], user_id=segment.users["user"][row],
              item_id=ev["item"][own], surface=np.maximum(ev["surface"][own] - 1, 0).astype(np.int8),
              click=ev["click"][own], event_time=ev["event_s"][own] * US_PER_S + ex["time_us"])
    return ex


class SegmentCache:
    """Decoded segments, least recently used dropped beyond ``max_events`` in total."""

    def __init__(self, max_events: int):
        self.max_events, self._items, self._events = max_events, OrderedDict(), 0

    def get(self, shard_dir: Path) -> Segment:
        key = str(shard_dir)
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        segment = read_segment(shard_dir)
        self._items[key] = segment
        self._events += len(segment)
        while self._events > self.max_events and len(self._items) > 1:
            _, dropped = self._items.popitem(last=False)
            self._events -= len(dropped)
        return segment
