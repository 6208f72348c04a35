"""MovieLens-100K (GroupLens `u.data`, `u.user`, `u.item`) -> contract dataset.

Mapping (docs/data-contract.md has the rationale):
- every rating is an ad impression of a promoted title (``is_ad`` true, event_type
  "impression") at the rating's timestamp; event_id = 1-based line number in u.data;
- click = rating >= 4 (liked), conversion = rating == 5 (loved), conversion_time =
  event_time (the rating reveals both at once); so conversion implies click;
- surface = the title's genre group: messaging (Animation, Children's), stories
  (Comedy, Musical), video (Action, Adventure, Crime, Fantasy, Horror, Mystery,
  Sci-Fi, Thriller), feed (everything else: Drama, Romance, Documentary, ...), picked in
  that priority order among the title's genres;
- users: age bucket from age, gender lower-cased, country = "US-<first zip digit>"
  (a region; non-numeric zips give "US-?"), device unknown; occupation kept as an
  extra column;
- items: category_id = 1 + index of the first genre flag, advertiser unknown (0),
  format "video", objective "conversions".
Malformed lines are quarantined with their reason; input = converted + quarantined.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from gem.data.adapters.common import AdapterReport, day_window, finish_dataset, rating_events, read_delimited
from gem.data.contract import ITEMS_SCHEMA, USERS_SCHEMA, Manifest

GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
    "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi",
    "Thriller", "War", "Western",
)
SURFACE_BY_GENRE_GROUP = (
    ("messaging", ("Animation", "Children's")),
    ("stories", ("Comedy", "Musical")),
    ("video", ("Action", "Adventure", "Crime", "Fantasy", "Horror", "Mystery", "Sci-Fi", "Thriller")),
)
DEFAULT_SURFACE = "feed"
AGE_EDGES = (18, 25, 35, 45, 55)
AGE_LABELS = ("13-17", "18-24", "25-34", "35-44", "45-54", "55+")


def convert_movielens(raw_dir: str | Path, out_dir: str | Path) -> Manifest:
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    for name in ("u.data", "u.user", "u.item"):
        if not (raw_dir / name).is_file():
            raise FileNotFoundError(f"{raw_dir / name}: missing; expected the GroupLens MovieLens-100K files")
    report = AdapterReport(source=str(raw_dir))

    ratings = read_delimited(raw_dir / "u.data", "\t", ["user_id", "item_id", "rating", "timestamp"],
                             ints=["user_id", "item_id", "rating", "timestamp"], report=report,
                             checks={"rating": lambda r: r.between(1, 5)})
    users_raw = read_delimited(raw_dir / "u.user", "|", ["user_id", "age", "gender", "occupation", "zip"],
                               ints=["user_id", "age"], report=report)
    item_cols = ["item_id", "title", "release", "video_release", "url", *GENRES]
    items_raw = read_delimited(raw_dir / "u.item", "|", item_cols, ints=["item_id", *GENRES], report=report,
                               encoding="latin-1")

    genre_flags = items_raw[list(GENRES)].to_numpy(dtype=bool)
    surface = np.full(len(items_raw), DEFAULT_SURFACE, dtype=object)
    for name, group in reversed(SURFACE_BY_GENRE_GROUP):  # highest priority written last
        idx = [GENRES.index(g) for g in group]
        surface[genre_flags[:, idx].any(axis=1)] = name
    first_genre = np.where(genre_flags.any(axis=1), genre_flags.argmax(axis=1), 0)
    items = pa.table(
        {
            "item_id": pa.array(items_raw["item_id"].to_numpy(np.int64)),
            "is_ad": pa.array(np.ones(len(items_raw), bool)),
            "advertiser_id": pa.array(np.zeros(len(items_raw), np.int64)),
            "category_id": pa.array((first_genre + 1).astype(np.int64)),
            "format": pa.array(["video"] * len(items_raw)),
            "objective": pa.array(["conversions"] * len(items_raw)),
        },
        schema=ITEMS_SCHEMA,
    )
    zip_region = users_raw["zip"].astype(str).str[:1].where(users_raw["zip"].astype(str).str[:1].str.isdigit(), "?")
    users = pa.table(
        {
            "user_id": pa.array(users_raw["user_id"].to_numpy(np.int64)),
            "age_bucket": pa.array(np.asarray(AGE_LABELS, dtype=object)[
                np.searchsorted(AGE_EDGES, users_raw["age"], side="right")]),
            "gender": pa.array(users_raw["gender"].str.lower()),
            "country": pa.array("US-" + zip_region),
            "device": pa.nulls(len(users_raw), pa.string()),
        },
        schema=USERS_SCHEMA,
    ).append_column("occupation", pa.array(users_raw["occupation"]))

    surface_of_item = pd.Series(surface, index=items_raw["item_id"].to_numpy())
    events = rating_events(ratings, surface_of_item.reindex(ratings["item_id"].to_numpy()).fillna(DEFAULT_SURFACE)
                           .to_numpy())
    first, last = day_window(events)
    manifest = Manifest(
        name="movielens100k",
        source="GroupLens MovieLens-100K",
        window_start=first,
        window_end=last,
        description="ratings as ad impressions; rating>=4 click, rating==5 conversion; genre groups as surfaces",
    )
    return finish_dataset(out_dir, manifest, events, users, items, report)
