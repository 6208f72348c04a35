"""Ciao product ratings (`ratings.csv.gz`: user_id,item_id,category_id,rating,helpfulness,
timestamp, with a header) -> contract dataset: a real multi-surface log.

Mapping (docs/data-contract.md has the rationale):
- every rating is an ad impression (``is_ad``, event_type "impression") at its
  timestamp (day-level in the source); event_id = the line number in the file;
- surface = the product category, named ``cat01`` .. ``cat28`` (all 28 declared in the
  manifest, in number order): the categories are where a person acts;
- click = rating >= 4, conversion = rating == 5 (conversion_time = event_time);
- items: category_id = the category of the product's first kept rating; no advertiser
  (0), format "product", objective "review"; users: no attributes (all null);
- not used: ``helpfulness`` (other readers' later votes on the review: known only after
  the rating, so a leak as a feature) and ``trust.csv.gz``.
Defects, each quarantined with its reason (input lines = converted + quarantined):
- a rating outside 1-5 (the source has 34 rows rated 0): ``out_of_range:rating``;
- a repeated (user, product) pair: the earliest rating is kept (ties: the earlier line),
  every later one is quarantined as ``repeat:user_item`` (a product is rated once; a
  later re-rating would be scored against the user's own earlier label of it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from gem.data.adapters.common import AdapterReport, day_window, finish_dataset, rating_events, read_delimited
from gem.data.contract import ITEMS_SCHEMA, USERS_SCHEMA, Manifest

COLUMNS = ["user_id", "item_id", "category_id", "rating", "helpfulness", "timestamp"]
CATEGORIES = 28
REPEAT = "repeat:user_item"


def surface_name(category: int) -> str:
    return f"cat{int(category):02d}"


def convert_ciao(raw: str | Path, out_dir: str | Path) -> Manifest:
    raw, out_dir = Path(raw), Path(out_dir)
    path = raw / "ratings.csv.gz" if raw.is_dir() else raw
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected the Ciao ratings.csv.gz (see ../shared/data/README.md)")
    report = AdapterReport(source=str(path))
    rows = read_delimited(path, ",", COLUMNS, ints=COLUMNS, report=report, header=True,
                          checks={"rating": lambda r: r.between(1, 5),
                                  "category_id": lambda c: c.between(1, CATEGORIES)})
    rows = _drop_repeats(rows, path.name, report)
    if rows.empty:
        raise ValueError(f"{path}: no valid rating line (see the conversion quarantine)")
    events = rating_events(rows, np.array([surface_name(c) for c in rows["category_id"].to_numpy()], dtype=object))
    first_rating = rows.sort_values(["timestamp", "line"]).drop_duplicates("item_id")
    items = pa.table(
        {
            "item_id": pa.array(first_rating["item_id"].to_numpy(np.int64)),
            "is_ad": pa.array(np.ones(len(first_rating), bool)),
            "advertiser_id": pa.array(np.zeros(len(first_rating), np.int64)),
            "category_id": pa.array(first_rating["category_id"].to_numpy(np.int64)),
            "format": pa.array(["product"] * len(first_rating)),
            "objective": pa.array(["review"] * len(first_rating)),
        },
        schema=ITEMS_SCHEMA,
    )
    user_ids = np.unique(rows["user_id"].to_numpy(np.int64))
    users = pa.table({"user_id": pa.array(user_ids), **{c: pa.nulls(len(user_ids), pa.string())
                                                         for c in ("age_bucket", "gender", "country", "device")}},
                     schema=USERS_SCHEMA)
    first, last = day_window(events)
    manifest = Manifest(
        name="ciao",
        source="Ciao product ratings (Tang, Gao, Liu)",
        window_start=first,
        window_end=last,
        surfaces=[surface_name(c) for c in range(1, CATEGORIES + 1)],
        description="ratings as ad impressions; rating>=4 click, rating==5 conversion; product categories as "
                    "surfaces; repeated (user, product) pairs: the earliest kept",
    )
    return finish_dataset(out_dir, manifest, events, users, items, report)


def _drop_repeats(rows: pd.DataFrame, name: str, report: AdapterReport) -> pd.DataFrame:
    """Keep each (user, product)'s earliest rating (ties: the earlier line); quarantine the rest."""
    ordered = rows.sort_values(["timestamp", "line"], kind="stable")
    later = ordered.duplicated(["user_id", "item_id"], keep="first")
    for _, row in ordered[later].sort_values("line").iterrows():
        raw = ",".join(str(row[c]) for c in COLUMNS)
        report.quarantine(name, int(row["line"]), raw, REPEAT)
    report.converted[name] -= int(later.sum())
    return rows[~later.reindex(rows.index).to_numpy()].reset_index(drop=True)
