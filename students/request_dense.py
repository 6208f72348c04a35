"""A student's dense inputs at request time, computed as training computes them.

Training reads each example's dense features from its features shard
(gem.features.shards.dense_features, gem.features.counters.counter_features). A scorer
has the request's instant and the Feast online store: the user's ``history_count``
(recent behaviour view) and every entity's counts as of the last counters export
(feature_repo/counters.py: item, advertiser, category, (surface, item), user, each row
carrying the log's own counts). From those it computes the same features with the same
code, so a student that reads counters is served them, not zeros:

    dense = RequestDense(store, surface="feed", names=model.cfg.dense_features)
    item_counts = dense.item_counts(item_ids, item_attribute_rows, now)   # cacheable per item
    x = dense.features(user_id, history_count, item_counts, now)          # (N, D) float32

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
import math

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
)
from students.online import OnlineReader

REQUEST_FEATURES = ("log_history_len", "hour_of_day_sin", "hour_of_day_cos")
USER_PRIOR_FEATURES = ("user_prior_ad_ctr", "log_user_prior_ad_impressions")
SERVABLE = (*REQUEST_FEATURES, *USER_PRIOR_FEATURES, *COUNTER_FEATURES)
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
        self.counters = any(n.startswith(COUNTER_PREFIX) for n in self.names)
        self.user_counts_needed = self.counters or any(n in USER_PRIOR_FEATURES for n in self.names)
        # item-side kinds are read only when some counter feature is (every cnt_ feature
        # is computed from all kinds at once; the arrays are small)
        self.item_kinds = ITEM_KINDS if self.counters else ()
        self.readers = {kind: OnlineReader(store, {f"{kind}_counters": view_columns(kind) + list(GLOBAL_COLUMNS)},
                                           join_key=KEY_COLUMNS[kind])
                        for kind in ((*self.item_kinds, "user") if self.user_counts_needed else ())}
        # item-side columns: each item kind's counts, then the log's (from the item's row)
        self.item_columns = [c for kind in self.item_kinds for c in view_columns(kind)] + list(GLOBAL_COLUMNS)

    def _rows(self, kind: str, keys: list, now: dt.datetime) -> list[dict | None]:
        unique = list(dict.fromkeys(k for k in keys if k is not None))  # None: an item without the attribute
        found = dict(zip(unique, self.readers[kind].read(f"{kind}_counters", unique, now)))
        return [found[k] if k is not None else None for k in keys]

    def item_counts(self, item_ids: list[int], attrs: list[dict | None], now: dt.datetime) -> np.ndarray:
        """float64 (N, len(item_columns)): each candidate's counts of every item-side kind
        and the log's (0 where the online store has no row: an unseen key, as in training)."""
        out = np.zeros((len(item_ids), len(self.item_columns)), dtype=np.float64)
        if not self.item_kinds:
            return out
        keys = {"item": [int(i) for i in item_ids], "surface_item": [(self.surface, int(i)) for i in item_ids],
                "advertiser": [_raw(a, "advertiser_id") for a in attrs],
                "category": [_raw(a, "category_id") for a in attrs]}
        column = {c: j for j, c in enumerate(self.item_columns)}
        has_global = np.zeros(len(item_ids), dtype=bool)
        for kind in self.item_kinds:
            for r, row in enumerate(self._rows(kind, keys[kind], now)):
                if row is None:
                    continue
                for c in view_columns(kind):
                    out[r, column[c]] = row[c] or 0
                if not has_global[r]:
                    out[r, [column[c] for c in GLOBAL_COLUMNS]] = [row[c] or 0 for c in GLOBAL_COLUMNS]
                    has_global[r] = True
        return out

    def features(self, user_id: int, history_count: int, item_counts: np.ndarray, now: dt.datetime) -> np.ndarray:
        """float32 (N, D), D = the student's dense features in its order."""
        n = len(item_counts)
        moment = now if now.tzinfo else now.replace(tzinfo=dt.timezone.utc)  # naive = UTC, as the log's times
        angle = 2 * math.pi * (moment.timestamp() % 86_400) / 86_400
        values: dict[str, float | np.ndarray] = {"log_history_len": math.log1p(history_count),
                                                 "hour_of_day_sin": math.sin(angle),
                                                 "hour_of_day_cos": math.cos(angle)}
        if self.user_counts_needed:
            user = self._rows("user", [int(user_id)], now)[0] or {}
            impressions = user.get(count_column("user", "all", "impressions")) or 0
            clicks = user.get(count_column("user", "all", "clicks")) or 0
            values["user_prior_ad_ctr"] = (clicks + 1.0) / (impressions + 50.0)  # gem.features.shards
            values["log_user_prior_ad_impressions"] = math.log1p(impressions)
            if self.counters:
                values.update(self._counter_features(user, item_counts))
        dense = np.empty((n, len(self.names)), dtype=np.float32)
        for j, name in enumerate(self.names):
            dense[:, j] = values[name]
        return dense

    def _counter_features(self, user: dict, item_counts: np.ndarray) -> dict[str, np.ndarray]:
        n = len(item_counts)
        counts = {c: item_counts[:, j] for j, c in enumerate(self.item_columns)}
        for c in view_columns("user"):
            counts[c] = np.full(n, user.get(c) or 0, dtype=np.float64)
        if user:  # a candidate without any counts row reads the log's counts from the user's
            missing = ~item_counts[:, [self.item_columns.index(c) for c in GLOBAL_COLUMNS]].any(axis=1)
            for c in GLOBAL_COLUMNS:
                counts[c] = np.where(missing, user.get(c) or 0, counts[c])
        for kind in KINDS:
            for c in view_columns(kind):
                counts.setdefault(c, np.zeros(n))
        table = counter_features(counts)
        return {name: table[:, j] for j, name in enumerate(COUNTER_FEATURES)}


def _raw(attrs: dict | None, key: str):
    value = (attrs or {}).get(key)
    return int(value) if value is not None else None
