"""MovieLens-1M (GroupLens `ratings.dat[.gz]`, `users.dat`, `movies.dat`, "::"-separated)
-> contract dataset.

Mapping (docs/data-contract.md has the rationale), as for MovieLens-100K where the two agree:
- every rating is an ad impression (``is_ad``, event_type "impression") at the rating's
  timestamp; event_id = 1-based line number in ratings.dat;
- click = rating >= 4, conversion = rating == 5, conversion_time = event_time (the
  rating reveals both at once);
- surface = the title's genre group (movielens.SURFACE_BY_GENRE_GROUP, the 100K rule);
- users: age_bucket from MovieLens-1M's age code ("<18", "18-24", ... "56+"), gender
  lower-cased, country = "US-<first zip digit>" (a region; "US-?" otherwise); the
  contract's ``device`` slot carries the occupation ("occupation:<name>"): the data has
  no device, and the slot is the contract's one free user attribute;
- items: category_id = 1 + index of the first listed genre; the contract's item slots
  carry what the data has: advertiser_id = release year (from the title, 0 if none),
  format = the full genre list ("Animation|Children's|Comedy"), objective = the decade
  ("1990s", "unknown");
- malformed lines are quarantined with their reason; input = converted + quarantined.

``implicit=True`` gives the implicit-feedback table of the CTR literature instead (a
popularity-dominated one): every rating is a positive (click 1, no conversion), and per
positive one negative: a movie drawn uniformly (``seed``) from the log's rated movies
that the user has not rated up to and including that time, shown at the positive's
time on that movie's surface, with role "example" (scored, never in a history: the user
never saw it). Negative event ids follow the last line number, in the positives' order.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from gem.data.adapters.common import AdapterReport, day_window, finish_dataset, rating_events, read_delimited
from gem.data.adapters.movielens import DEFAULT_SURFACE, SURFACE_BY_GENRE_GROUP
from gem.data.contract import ITEMS_SCHEMA, USERS_SCHEMA, Manifest

GENRES = (
    "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama", "Fantasy",
    "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
)
AGE_CODES = {1: "<18", 18: "18-24", 25: "25-34", 35: "35-44", 45: "45-49", 50: "50-55", 56: "56+"}
OCCUPATIONS = (
    "other", "academic/educator", "artist", "clerical/admin", "college/grad student", "customer service",
    "doctor/health care", "executive/managerial", "farmer", "homemaker", "K-12 student", "lawyer", "programmer",
    "retired", "sales/marketing", "scientist", "self-employed", "technician/engineer", "tradesman/craftsman",
    "unemployed", "writer",
)
SEP = "::"
_YEAR = re.compile(r"\((\d{4})\)\s*$")


def ratings_file(raw_dir: Path) -> Path:
    for name in ("ratings.dat", "ratings.dat.gz"):
        if (raw_dir / name).is_file():
            return raw_dir / name
    raise FileNotFoundError(f"{raw_dir}: no ratings.dat or ratings.dat.gz; expected the GroupLens MovieLens-1M files")


def convert_movielens1m(raw_dir: str | Path, out_dir: str | Path, *, implicit: bool = False,
                        seed: int = 0) -> Manifest:
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    ratings_path = ratings_file(raw_dir)
    for name in ("users.dat", "movies.dat"):
        if not (raw_dir / name).is_file():
            raise FileNotFoundError(f"{raw_dir / name}: missing; expected the GroupLens MovieLens-1M files")
    report = AdapterReport(source=str(raw_dir))
    ratings = read_delimited(ratings_path, SEP, ["user_id", "item_id", "rating", "timestamp"],
                             ints=["user_id", "item_id", "rating", "timestamp"], report=report,
                             checks={"rating": lambda r: r.between(1, 5)})
    users_raw = read_delimited(raw_dir / "users.dat", SEP, ["user_id", "gender", "age", "occupation", "zip"],
                               ints=["user_id", "age", "occupation"], report=report,
                               checks={"age": lambda a: a.isin(list(AGE_CODES)),
                                       "occupation": lambda o: o.between(0, len(OCCUPATIONS) - 1)})
    movies = read_delimited(raw_dir / "movies.dat", SEP, ["item_id", "title", "genres"], ints=["item_id"],
                            report=report, encoding="latin-1")
    items = _items(movies)
    users = _users(users_raw)
    if ratings.empty:
        raise ValueError(f"{ratings_path}: no valid rating line (see the conversion quarantine)")
    surface_of_item = pd.Series(_surfaces(movies["genres"]), index=movies["item_id"].to_numpy())
    def surfaces(item_ids: np.ndarray) -> np.ndarray:
        return surface_of_item.reindex(item_ids).fillna(DEFAULT_SURFACE).to_numpy()

    events = rating_events(ratings, surfaces(ratings["item_id"].to_numpy()))
    description = ("ratings as ad impressions; rating>=4 click, rating==5 conversion; genre groups as surfaces; "
                   "device = occupation, advertiser_id = release year, format = genres, objective = decade")
    if implicit:
        events = implicit_events(ratings, surfaces, seed=seed)
        description = (f"implicit feedback: every rating a positive, per positive one negative drawn uniformly "
                       f"(seed {seed}) from the rated movies the user had not rated up to that time (role "
                       f"example); genre groups as surfaces; item and user slots as the explicit table")
    first, last = day_window(events)
    manifest = Manifest(
        name="movielens1m_implicit" if implicit else "movielens1m",
        source="GroupLens MovieLens-1M",
        window_start=first,
        window_end=last,
        description=description,
    )
    return finish_dataset(out_dir, manifest, events, users, items, report)


def sample_negatives(users: np.ndarray, items: np.ndarray, times: np.ndarray, catalogue: np.ndarray,
                     seed: int) -> np.ndarray:
    """One item per (user, time) drawn uniformly from ``catalogue`` among those the user
    has not rated at or before that time (rejection sampling, redrawn until accepted)."""
    rng = np.random.default_rng(seed)
    pairs = pd.DataFrame({"user": users, "item": items, "time": times})
    first = pairs.groupby(["user", "item"], sort=True)["time"].min()  # when the user first rated each movie
    key_u, key_i = first.index.get_level_values(0).to_numpy(), first.index.get_level_values(1).to_numpy()
    width = int(catalogue.max()) + 1
    keys = key_u.astype(np.int64) * width + key_i
    rated_at = first.to_numpy()
    out = np.empty(len(users), dtype=np.int64)
    todo = np.arange(len(users))
    for rounds in range(10_000):
        if not len(todo):
            break
        if rounds == 100:  # slow to accept: is there an unrated movie at all?
            rated = np.array([(rated_at[(key_u == u)] <= t).sum() for u, t in zip(users[todo], times[todo])])
            if (rated >= len(catalogue)).any():
                i = todo[np.argmax(rated >= len(catalogue))]
                raise ValueError(f"user {users[i]} had rated every one of the {len(catalogue)} movies by "
                                 f"{times[i]}: no negative to draw")
        draw = catalogue[rng.integers(0, len(catalogue), len(todo))]
        pos = np.searchsorted(keys, users[todo].astype(np.int64) * width + draw)
        pos = np.minimum(pos, len(keys) - 1)
        taken = (keys[pos] == users[todo].astype(np.int64) * width + draw) & (rated_at[pos] <= times[todo])
        out[todo[~taken]] = draw[~taken]
        todo = todo[taken]
    if len(todo):
        raise RuntimeError(f"{len(todo)} negatives not drawn after 10,000 rounds")
    return out


def implicit_events(ratings: pd.DataFrame, surfaces, *, seed: int) -> pa.Table:
    """Every rating a positive impression, each with one sampled negative (module doc)."""
    positives = ratings.assign(rating=4)  # click 1
    users, items = ratings["user_id"].to_numpy(np.int64), ratings["item_id"].to_numpy(np.int64)
    times = ratings["timestamp"].to_numpy(np.int64)
    negative_items = sample_negatives(users, items, times, np.unique(items), seed)
    negatives = pd.DataFrame({"line": int(ratings["line"].max()) + 1 + np.arange(len(ratings)), "user_id": users,
                              "item_id": negative_items, "rating": 1, "timestamp": times})
    pos = rating_events(positives, surfaces(items))
    neg = rating_events(negatives, surfaces(negative_items))
    n = len(ratings)
    pos = _replace(pos, conversion=pa.array(np.zeros(n, np.int8)),
                   conversion_time=pa.nulls(n, pos.schema.field("conversion_time").type))
    return pa.concat_tables([pos, _replace(neg, role=pa.array(["example"] * n))])


def _replace(table: pa.Table, **columns) -> pa.Table:
    return pa.Table.from_arrays([columns.get(f.name, table.column(f.name)) for f in table.schema], schema=table.schema)


def _surfaces(genres: pd.Series) -> np.ndarray:
    """The 100K rule: the first genre group (in priority order) among the title's genres."""
    lists = genres.str.split("|")
    out = np.full(len(genres), DEFAULT_SURFACE, dtype=object)
    for name, group in reversed(SURFACE_BY_GENRE_GROUP):  # highest priority written last
        out[lists.map(lambda g, group=group: any(x in group for x in g)).to_numpy(bool)] = name
    return out


def _items(movies: pd.DataFrame) -> pa.Table:
    first_genre = movies["genres"].str.split("|").str[0]
    category = first_genre.map({g: i + 1 for i, g in enumerate(GENRES)}).fillna(0).astype(np.int64)
    year = movies["title"].str.extract(_YEAR)[0].astype("float").fillna(0).astype(np.int64)
    decade = np.where(year > 0, (year // 10 * 10).astype(str) + "s", "unknown")
    n = len(movies)
    return pa.table(
        {
            "item_id": pa.array(movies["item_id"].to_numpy(np.int64)),
            "is_ad": pa.array(np.ones(n, bool)),
            "advertiser_id": pa.array(year.to_numpy(np.int64)),
            "category_id": pa.array(category.to_numpy(np.int64)),
            "format": pa.array(movies["genres"].astype(str).to_numpy()),
            "objective": pa.array(decade),
        },
        schema=ITEMS_SCHEMA,
    ).append_column("title", pa.array(movies["title"].astype(str).to_numpy()))


def _users(raw: pd.DataFrame) -> pa.Table:
    zip_head = raw["zip"].astype(str).str[:1]
    region = zip_head.where(zip_head.str.isdigit(), "?")
    return pa.table(
        {
            "user_id": pa.array(raw["user_id"].to_numpy(np.int64)),
            "age_bucket": pa.array(raw["age"].map(AGE_CODES).to_numpy()),
            "gender": pa.array(raw["gender"].str.lower().to_numpy()),
            "country": pa.array(("US-" + region).to_numpy()),
            "device": pa.array(("occupation:" + raw["occupation"].map(dict(enumerate(OCCUPATIONS)))).to_numpy()),
        },
        schema=USERS_SCHEMA,
    )
