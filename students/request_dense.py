"""A student's dense inputs at request time, computed as training computes them.

Training reads each example's dense features from its features shard
(gem.features.shards.dense_features, gem.features.counters.counter_features). A scorer
has the request's instant and the Feast online store: the user's ``history_count``
(recent behaviour view) and every entity's counts as of the last counters export
(feature_repo/counters.py: item, advertiser, category, (surface, item), user, each row
carrying the log's own counts). From those it computes the same features with the same
code, so a student that reads counters is served them, not zeros:

    dense = RequestDense(store, surface="feed", names=model.cfg.dense_features)
    per_item = dense.item_features(item_ids, item_attribute_rows, now)  # cacheable per item
    x = dense.features(user_id, history_count, per_item, now)           # (N, D) float32

The counts are the export's, so a request some time after it reads counts that are that
much older than a training example's (the point-in-time counts at its own instant).
``user_prior_ad_ctr`` and ``log_user_prior_ad_impressions`` come from the user's counts
of labelled (ad) rows; training counts the same rows, with a click counted from its
impression on (the same as the counters' when clicks are known at their impression, as
in every adapter and the simulator's default).

A feature a scorer cannot compute (``log_seconds_since_last_event``: the online store
has no last-event time) is refused when the scorer is built, never served as 0.
"""

from __future__ import annotations

import datetime as dt

import numpy as np

from gem.features.counters import (
    COUNTER_FEATURES,
    COUNTER_PREFIX,
    GLOBAL,
    HORIZONS,
    KEY_COLUMNS,
    KINDS,
    SIGNALS,
    count_column,
    counter_features,
    counter_names,
)
from gem.features.segments import US_PER_S
from gem.features.shards import DENSE_FEATURES, dense_features
from students.online import OnlineReader

REQUEST_FEATURES = ("log_history_len", "hour_of_day_sin", "hour_of_day_cos")
USER_PRIOR_FEATURES = ("user_prior_ad_ctr", "log_user_prior_ad_impressions")
SERVABLE = (*REQUEST_FEATURES, *USER_PRIOR_FEATURES, *COUNTER_FEATURES)
# training's per-example features (gem.features.shards.dense_features) this scorer computes
# with the same function; log_seconds_since_last_event is not among them (no last-event time online)
SHARD_FEATURES = tuple(n for n in DENSE_FEATURES if n in SERVABLE)
ITEM_KINDS = ("item", "advertiser", "category", "surface_item")
GLOBAL_COLUMNS = tuple(count_column(GLOBAL, h, s) for h in HORIZONS for s in SIGNALS)


def view_columns(kind: str) -> list[str]:
    return [count_column(kind, h, s) for h in HORIZONS for s in SIGNALS]


def check_servable(names: list[str]) -> None:
    unknown = [n for n in names if n not in SERVABLE]
    if unknown:
        raise ValueError(f"dense feature(s) {unknown} cannot be computed at request time (a scorer computes "
                         f"{list(REQUEST_FEATURES + USER_PRIOR_FEATURES)} and the counters cnt_*); train the "
                         f"student without them")


class RequestDense:
    def __init__(self, store, *, surface: str, names: list[str]) -> None:
        check_servable(list(names))
        self.names, self.surface = list(names), surface
        counter_names = [n for n in self.names if n.startswith(COUNTER_PREFIX)]
        # counter features of the candidate (item-side kinds: cacheable per item) and of the
        # request (the user's and the log's)
        self.item_names = [n for n in counter_names if _kind(n) in ITEM_KINDS]
        self.request_names = [n for n in counter_names if n not in self.item_names]
        self.item_kinds = tuple(k for k in ITEM_KINDS if any(_kind(n) == k for n in self.item_names))
        self.user_counts_needed = bool(self.request_names) or any(n in USER_PRIOR_FEATURES for n in self.names)
        kinds = (*self.item_kinds, "user") if self.user_counts_needed else self.item_kinds
        self.readers = {kind: OnlineReader(store, {f"{kind}_counters": view_columns(kind) + list(GLOBAL_COLUMNS)},
                                           join_key=KEY_COLUMNS[kind]) for kind in kinds}
        self._globals: dict[str, float] = {}  # the log's counts, as the last row read carried them

    def _rows(self, kind: str, keys: list, now: dt.datetime) -> list[dict | None]:
        unique = list(dict.fromkeys(k for k in keys if k is not None))  # None: an item without the attribute
        found = dict(zip(unique, self.readers[kind].read(f"{kind}_counters", unique, now)))
        return [found[k] if k is not None else None for k in keys]

    def _seen(self, row: dict) -> dict[str, float]:
        values = {c: float(row.get(c) or 0) for c in GLOBAL_COLUMNS}
        self._globals = values
        return values

    def item_features(self, item_ids: list[int], attrs: list[dict | None], now: dt.datetime) -> np.ndarray:
        """float32 (N, len(item_names)): each candidate's counter features of the item-side
        kinds (0 where the online store has no row: an unseen key, as in training)."""
        n = len(item_ids)
        if not self.item_names:
            return np.zeros((n, 0), dtype=np.float32)
        keys = {"item": [int(i) for i in item_ids], "surface_item": [(self.surface, int(i)) for i in item_ids],
                "advertiser": [_raw(a, "advertiser_id") for a in attrs],
                "category": [_raw(a, "category_id") for a in attrs]}
        counts = {c: np.zeros(n) for kind in self.item_kinds for c in view_columns(kind)}
        counts.update({c: np.zeros(n) for c in GLOBAL_COLUMNS})
        for kind in self.item_kinds:
            for r, row in enumerate(self._rows(kind, keys[kind], now)):
                if row is None:
                    continue
                for c in view_columns(kind):
                    counts[c][r] = row[c] or 0
                for c, v in self._seen(row).items():  # every row of one export carries the same log counts
                    counts[c][r] = v
        return _pick(counter_features(counts, self.item_kinds), self.item_kinds, self.item_names)

    def features(self, user_id: int, history_count: int, item_features: np.ndarray, now: dt.datetime) -> np.ndarray:
        """float32 (N, D), D = the student's dense features in its order."""
        n = len(item_features)
        moment = now if now.tzinfo else now.replace(tzinfo=dt.timezone.utc)  # naive = UTC, as the log's times
        user = (self._rows("user", [int(user_id)], now)[0] or {}) if self.user_counts_needed else {}
        # the user's labelled (ad) rows so far, as the shards count them before an example
        impressions = user.get(count_column("user", "all", "impressions")) or 0
        clicks = user.get(count_column("user", "all", "clicks")) or 0
        shard = dense_features(np.array([round(moment.timestamp() * US_PER_S)]), np.array([history_count]),
                               np.zeros(1), np.array([impressions]), np.array([clicks]))[0]
        values: dict[str, float | np.ndarray] = {name: shard[DENSE_FEATURES.index(name)] for name in SHARD_FEATURES}
        values.update({name: item_features[:, j] for j, name in enumerate(self.item_names)})
        if self.request_names:  # the user's and the log's counter features, for this request's one row
            log = self._seen(user) if user else self._globals  # an unseen user: the log's counts as last read
            counts = {c: np.array([float(user.get(c) or 0)]) for c in view_columns("user")}
            counts.update({c: np.array([log.get(c, 0.0)]) for c in GLOBAL_COLUMNS})
            values.update(zip(self.request_names, _pick(counter_features(counts, ("user",)), ("user",),
                                                         self.request_names)[0]))
        dense = np.empty((n, len(self.names)), dtype=np.float32)
        for j, name in enumerate(self.names):
            dense[:, j] = values[name]
        return dense


def _kind(name: str) -> str:
    """The key kind of a counter feature name (``cnt_<kind>_<horizon>_<stat>``)."""
    return next(k for k in (*KINDS, GLOBAL) if name.startswith(f"{COUNTER_PREFIX}{k}_"))


def _pick(table: np.ndarray, kinds: tuple[str, ...], names: list[str]) -> np.ndarray:
    """The ``names`` columns of ``counter_features(counts, kinds)``."""
    computed = counter_names(kinds)
    return table[:, [computed.index(n) for n in names]].astype(np.float32)


def _raw(attrs: dict | None, key: str):
    value = (attrs or {}).get(key)
    return int(value) if value is not None else None
