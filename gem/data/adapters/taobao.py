"""Taobao UserBehavior (`user_id,item_id,category_id,behavior,timestamp`, no header)
-> contract dataset.

Mapping (docs/data-contract.md has the rationale):
- a page view (pv) is an ad impression that was clicked (click = 1), event_id =
  4 x line number;
- conversion = the same user carts, favs or buys the same item at or after the pv,
  within ``attribution_days``; conversion_time = the first such action. cart/fav/buy
  lines are consumed as conversion signals, not as events;
- the log has no unclicked impressions, so a click label would be constant: each pv
  gets ``negatives_per_click`` sampled unclicked impressions (event_id = 4 x line + j)
  at the same second, items drawn by page-view popularity (seeded), never the clicked
  item. They are marked in the manifest as synthetic;
- surface = SURFACES[category_id mod 4] (the log has no surfaces; categories stand in
  for verticals); items: category_id, advertiser unknown (0), format "image",
  objective "conversions"; users: no attributes (all null).
- the synthetic negatives are ``role = "example"``: scored, never shown in a history
  (the user never saw them);
- ``label="action"`` instead: every pv is an impression (no synthetic rows) whose
  click is the cart/fav/buy of the item by the user within ``attribution_days``,
  known at ``click_time`` = the first such action (a delayed label); no conversion.
- the declared window is 2017-11-25 .. 2017-12-03 in China time (UTC+8); lines outside
  it (a few early outliers) are quarantined with reason ``outside_window``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from gem.data.adapters.common import AdapterReport, finish_dataset, read_delimited
from gem.data.contract import EVENTS_SCHEMA, ITEMS_SCHEMA, SURFACES, USERS_SCHEMA, Manifest

BEHAVIORS = ("pv", "cart", "fav", "buy")
CONVERSION_BEHAVIORS = ("cart", "fav", "buy")
CHINA = dt.timezone(dt.timedelta(hours=8))
WINDOW_START = dt.datetime(2017, 11, 25, tzinfo=CHINA)
WINDOW_END = dt.datetime(2017, 12, 4, tzinfo=CHINA)
MAX_NEGATIVES = 3


LABELS = ("pv", "action")


def convert_taobao(raw_csv: str | Path, out_dir: str | Path, *, seed: int = 0, negatives_per_click: int = 1,
                   attribution_days: float = 3.0, label: str = "pv") -> Manifest:
    raw_csv, out_dir = Path(raw_csv), Path(out_dir)
    if raw_csv.is_dir():
        raw_csv = raw_csv / "UserBehavior.csv"
    if not raw_csv.is_file():
        raise FileNotFoundError(f"{raw_csv}: missing; expected Taobao UserBehavior.csv")
    if not 0 <= negatives_per_click <= MAX_NEGATIVES:
        raise ValueError(f"negatives_per_click must be in [0, {MAX_NEGATIVES}], got {negatives_per_click}")
    if label not in LABELS:
        raise ValueError(f"label must be one of {LABELS}, got {label!r}")
    if label == "action":
        negatives_per_click = 0
    report = AdapterReport(source=str(raw_csv))
    start_s, end_s = int(WINDOW_START.timestamp()), int(WINDOW_END.timestamp())
    rows = read_delimited(
        raw_csv, ",", ["user_id", "item_id", "category_id", "behavior", "timestamp"],
        ints=["user_id", "item_id", "category_id", "timestamp"], report=report,
        checks={"behavior": lambda b: b.isin(BEHAVIORS)},
    )
    outside = ~rows["timestamp"].between(start_s, end_s - 1)
    for _, row in rows[outside].iterrows():
        report.quarantine(raw_csv.name, int(row["line"]), ",".join(str(row[c]) for c in
                          ("user_id", "item_id", "category_id", "behavior", "timestamp")), "outside_window")
    report.converted[raw_csv.name] -= int(outside.sum())
    rows = rows[~outside]

    pv = rows[rows["behavior"] == "pv"].reset_index(drop=True)
    signals = rows[rows["behavior"].isin(CONVERSION_BEHAVIORS)]
    report.notes["impressions_from_pv"] = len(pv)
    report.notes["conversion_signals"] = len(signals)

    # first conversion signal at or after each pv, inside the attribution window
    joined = pv[["line", "user_id", "item_id", "timestamp"]].merge(
        signals[["user_id", "item_id", "timestamp"]].rename(columns={"timestamp": "signal_time"}),
        on=["user_id", "item_id"],
    )
    joined = joined[(joined["signal_time"] >= joined["timestamp"])
                    & (joined["signal_time"] - joined["timestamp"] <= attribution_days * 86_400)]
    first_signal = joined.groupby("line")["signal_time"].min()
    conv_time = pv["line"].map(first_signal)
    report.notes["impressions_converted"] = int(conv_time.notna().sum())

    item_category = rows.groupby("item_id")["category_id"].agg(lambda c: c.mode().iat[0])
    rng = np.random.default_rng(seed)
    popularity = pv["item_id"].value_counts()
    pool, weights = popularity.index.to_numpy(), popularity.to_numpy(dtype=float)
    if label == "action":  # the pv is the exposure; cart/fav/buy within the window is the (delayed) click
        frames = [_impressions(pv, None, item_category, clicked=conv_time.notna().to_numpy(), event_id=pv["line"] * 4,
                               click_time=conv_time)]
    else:
        frames = [_impressions(pv, conv_time, item_category, clicked=True, event_id=pv["line"] * 4)]
    for j in range(1, negatives_per_click + 1):
        negative_items = rng.choice(pool, size=len(pv), p=weights / weights.sum())
        same = negative_items == pv["item_id"].to_numpy()
        negative_items[same] = rng.choice(pool, size=int(same.sum()))  # one redraw, then drop leftovers
        keep = negative_items != pv["item_id"].to_numpy()
        negatives = pv[keep].assign(item_id=negative_items[keep])
        frames.append(_impressions(negatives, None, item_category, clicked=False, event_id=negatives["line"] * 4 + j))
    report.notes["synthetic_negative_impressions"] = sum(len(f) for f in frames[1:])
    events_df = pd.concat(frames, ignore_index=True)

    events = pa.table(
        {
            "event_id": pa.array(events_df["event_id"].to_numpy(np.int64)),
            "user_id": pa.array(events_df["user_id"].to_numpy(np.int64)),
            "item_id": pa.array(events_df["item_id"].to_numpy(np.int64)),
            "is_ad": pa.array(np.ones(len(events_df), bool)),
            "surface": pa.array(events_df["surface"].to_numpy()),
            "event_time": pa.array(pd.to_datetime(events_df["timestamp"], unit="s", utc=True),
                                   type=EVENTS_SCHEMA.field("event_time").type),
            "event_type": pa.array(["impression"] * len(events_df)),
            "click": pa.array(events_df["click"].to_numpy(np.int8)),
            "conversion": pa.array(events_df["conversion"].to_numpy(np.int8)),
            "conversion_time": pa.array(pd.to_datetime(events_df["conversion_time"], unit="s", utc=True),
                                        type=EVENTS_SCHEMA.field("conversion_time").type, from_pandas=True),
            "click_time": pa.array(pd.to_datetime(events_df["click_time"], unit="s", utc=True),
                                   type=EVENTS_SCHEMA.field("click_time").type, from_pandas=True),
            "role": pa.array(events_df["role"].to_numpy(), pa.string(), from_pandas=True),
        },
        schema=EVENTS_SCHEMA,
    )
    item_ids = np.union1d(item_category.index.to_numpy(), events_df["item_id"].unique())
    categories = item_category.reindex(item_ids).fillna(0).to_numpy(np.int64)
    items = pa.table(
        {
            "item_id": pa.array(item_ids.astype(np.int64)),
            "is_ad": pa.array(np.ones(len(item_ids), bool)),
            "advertiser_id": pa.array(np.zeros(len(item_ids), np.int64)),
            "category_id": pa.array(categories),
            "format": pa.array(["image"] * len(item_ids)),
            "objective": pa.array(["conversions"] * len(item_ids)),
        },
        schema=ITEMS_SCHEMA,
    )
    user_ids = np.unique(events_df["user_id"].to_numpy(np.int64))
    users = pa.table({"user_id": pa.array(user_ids)} | {
        name: pa.nulls(len(user_ids), pa.string()) for name in USERS_SCHEMA.names[1:]
    }, schema=USERS_SCHEMA)
    manifest = Manifest(
        name="taobao",
        source="Alibaba Tianchi UserBehavior",
        window_start=WINDOW_START.astimezone(dt.timezone.utc).isoformat(),
        window_end=WINDOW_END.astimezone(dt.timezone.utc).isoformat(),
        description=("pv = ad impression; click = cart/fav/buy within the attribution window, known at that time"
                     if label == "action" else
                     "pv = clicked ad impression; cart/fav/buy later = conversion; sampled unclicked impressions"),
        extra={"negatives_per_click": negatives_per_click, "seed": seed, "attribution_days": attribution_days,
               "label": label, "synthetic_negatives": "event_id % 4 != 0 (role example: never in a history)"},
    )
    return finish_dataset(out_dir, manifest, events, users, items, report)


def _impressions(pv: pd.DataFrame, conv_time: pd.Series | None, item_category: pd.Series, *, clicked,
                 event_id: pd.Series, click_time: pd.Series | None = None) -> pd.DataFrame:
    category = item_category.reindex(pv["item_id"].to_numpy()).fillna(0).to_numpy(np.int64)
    converted = conv_time.notna().to_numpy() if conv_time is not None else np.zeros(len(pv), bool)
    clicked = np.broadcast_to(np.asarray(clicked, dtype=bool), (len(pv),))
    synthetic = not clicked.any() and click_time is None
    if click_time is not None:  # null where equal to the event time (known at once) or unclicked
        delayed = clicked & (click_time.to_numpy(dtype=float) > pv["timestamp"].to_numpy(dtype=float))
        click_time = np.where(delayed, click_time.to_numpy(dtype=float), np.nan)
    else:
        click_time = np.full(len(pv), np.nan)
    return pd.DataFrame(
        {
            "event_id": event_id.to_numpy(np.int64),
            "user_id": pv["user_id"].to_numpy(np.int64),
            "item_id": pv["item_id"].to_numpy(np.int64),
            "surface": np.asarray(SURFACES, dtype=object)[category % len(SURFACES)],
            "timestamp": pv["timestamp"].to_numpy(np.int64),
            "click": clicked.astype(np.int8),
            "conversion": converted.astype(np.int8),
            "conversion_time": conv_time.to_numpy(dtype=float) if conv_time is not None else np.full(len(pv), np.nan),
            "click_time": click_time,
            "role": np.full(len(pv), "example" if synthetic else None, dtype=object),
        }
    )
