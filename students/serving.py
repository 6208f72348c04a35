"""Scoring one request (a user and N candidate items) with a vertical student, its
inputs read from the Feast online store; GEM never runs here.

    scorer = Scorer(model, repo_dir, vocab_dir, surface="feed", cache_items=True)
    scorer.preload_items(catalog, now)                 # optional: the candidate catalog
    probs = scorer.score(user_id, item_ids, now)       # (N, 2): p(click), p(click and convert)

Inputs per request: user attributes, recent behaviour (``recent_item_ids``,
``history_count``) and the teacher's user embedding for the user; item attributes and
the teacher's item embedding per candidate, all through ``OnlineReader`` (the online
store's own reads, ttl honoured); the dense features as training computes them, counters
included, from the online counters views (students/request_dense.py). Raw ids map to the
student's dense ids with the features build's vocabularies.

Items: with ``cache_items`` the scorer keeps each item's mapped ids, embedding and counts in
an in-memory table (item attributes are static; item embeddings and counts change only
when knowledge or counters are re-materialized, after which the serving process calls
``refresh_items``), so a request
reads one user row and gathers candidates by position. Without it every candidate is
read from the online store on every request. ``user_reads="sdk"`` reads the user's rows
through ``FeatureStore.get_online_features`` instead of ``OnlineReader`` (the peer; same
item table). students/latency.py measures them.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import torch

from gem.data.contract import ITEM_ATTRIBUTES, USER_ATTRIBUTES
from gem.features.feast_repo import open_store
from gem.features.vocab import Vocabularies
from students.lineage import check_serving
from students.model import StudentInputs, VerticalStudent
from students.online import OnlineReader
from students.request_dense import RequestDense, check_servable

USER_VIEWS = {"user_attributes": list(USER_ATTRIBUTES),
              "user_recent_behavior": ["recent_item_ids", "history_count"]}
ITEM_VIEWS = {"item_attributes": list(ITEM_ATTRIBUTES)}
USER_EMB, ITEM_EMB = "teacher_user_embedding", "teacher_item_embedding"


class Scorer:
    def __init__(self, model: VerticalStudent, repo_dir: str | Path, vocab_dir: str | Path, *, surface: str = "feed",
                 cache_items: bool = False, user_reads: str = "online_read") -> None:
        if user_reads not in ("online_read", "sdk"):
            raise ValueError(f"user_reads={user_reads!r} must be 'online_read' or 'sdk'")
        check_serving(model, repo_dir, vocab_dir)  # its own teacher's knowledge and vocabularies only
        check_servable(list(model.cfg.dense_features))  # before any store is opened
        self.model = model.eval()
        vocab = Vocabularies.read(Path(vocab_dir))
        self.maps = {name: {v: i + 1 for i, v in enumerate(values.to_pylist())}
                     for name, values in vocab.values.items()}
        self.keys = list(model.keys)
        self.surface = _surface_index(vocab_dir, surface)
        self.h = model.cfg.history_len
        self.dense_names = list(model.cfg.dense_features)
        self.emb_half = model.teacher_emb_dim // 2
        user_views, item_views = dict(USER_VIEWS), dict(ITEM_VIEWS)
        if self.emb_half:
            user_views[USER_EMB], item_views[ITEM_EMB] = [USER_EMB], [ITEM_EMB]
        store = open_store(repo_dir)
        self.users = OnlineReader(store, user_views, join_key="user_id")
        self.items = OnlineReader(store, item_views, join_key="item_id")
        self.dense = RequestDense(store, surface=surface, names=self.dense_names)
        # columns of the sparse input filled from the user row / from each candidate
        self.user_cols = [(j, k) for j, k in enumerate(self.keys) if k == "user_id" or k.startswith("user_")]
        self.item_cols = [(j, k) for j, k in enumerate(self.keys) if k == "item_id" or k.startswith("item_")]
        self.cache_items = cache_items
        self.user_reads = user_reads  # "sdk": the user's rows through FeatureStore.get_online_features
        self.user_refs = [f"{v}:{f}" for v, fs in user_views.items() for f in fs]
        self._item_row: dict[int, int] = {}
        self._item_ids = np.zeros((0, len(self.item_cols)), dtype=np.int64)
        self._item_emb = np.zeros((0, self.emb_half), dtype=np.float32)
        self._item_counters = np.zeros((0, len(self.dense.item_names)), dtype=np.float32)

    def _id(self, vocab: str, value) -> int:
        return self.maps[vocab].get(value, 0) if value is not None else 0

    def _read_items(self, item_ids: list[int], now: dt.datetime) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(N, item columns) dense ids, (N, E/2) teacher embeddings and (N, C) counter
        features, from the online store."""
        attrs = self.items.read("item_attributes", item_ids, now)
        ids = np.zeros((len(item_ids), len(self.item_cols)), dtype=np.int64)
        for c, (_, key) in enumerate(self.item_cols):
            if key == "item_id":
                ids[:, c] = [self._id("item_id", i) for i in item_ids]
            else:
                ids[:, c] = [self._id(key[5:], row[key[5:]]) if row else 0 for row in attrs]
        emb = np.zeros((len(item_ids), self.emb_half), dtype=np.float32)
        if self.emb_half:
            for r, row in enumerate(self.items.read(ITEM_EMB, item_ids, now)):
                if row and row[ITEM_EMB] is not None:
                    emb[r] = row[ITEM_EMB]
        return ids, emb, self.dense.item_features(item_ids, attrs, now)

    def preload_items(self, item_ids, now: dt.datetime) -> None:
        """Read items into the in-memory table (``cache_items``); already cached ones are kept."""
        missing = list(dict.fromkeys(int(i) for i in item_ids if int(i) not in self._item_row))
        if not missing:
            return
        ids, emb, counts = self._read_items(missing, now)
        start = len(self._item_row)
        self._item_row.update({i: start + r for r, i in enumerate(missing)})
        self._item_ids = np.concatenate([self._item_ids, ids])
        self._item_emb = np.concatenate([self._item_emb, emb])
        self._item_counters = np.concatenate([self._item_counters, counts])

    def refresh_items(self, now: dt.datetime) -> None:
        """Re-read every cached item (after the online store was re-materialized)."""
        cached = list(self._item_row)
        self._item_row.clear()
        self._item_ids, self._item_emb = self._item_ids[:0], self._item_emb[:0]
        self._item_counters = self._item_counters[:0]
        self.preload_items(cached, now)

    def _candidates(self, item_ids: list[int], now: dt.datetime) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.cache_items:
            return self._read_items(item_ids, now)
        self.preload_items(item_ids, now)
        rows = [self._item_row[int(i)] for i in item_ids]
        return self._item_ids[rows], self._item_emb[rows], self._item_counters[rows]

    def inputs(self, user_id: int, item_ids: list[int], now: dt.datetime) -> StudentInputs:
        n, user_id = len(item_ids), int(user_id)
        attrs, behavior, user_row = self._user(user_id, now)
        item_ids_mapped, item_emb, item_counters = self._candidates(item_ids, now)
        sparse = np.empty((n, len(self.keys)), dtype=np.int64)
        for j, key in self.user_cols:
            sparse[:, j] = self._id("user_id", user_id) if key == "user_id" else self._id(key[5:], attrs.get(key[5:]))
        sparse[:, [j for j, _ in self.item_cols]] = item_ids_mapped
        recent = [self._id("item_id", i) for i in (behavior.get("recent_item_ids") or [])][-self.h:]
        history = np.zeros((n, self.h), dtype=np.int64)
        if recent:
            history[:, self.h - len(recent):] = recent
        dense = self.dense.features(user_id, behavior.get("history_count") or 0, item_counters, now)
        emb = None
        if self.emb_half:
            value = user_row.get(USER_EMB)
            user_emb = np.asarray(value if value is not None else np.zeros(self.emb_half), dtype=np.float32)
            both = np.empty((n, 2 * self.emb_half), dtype=np.float32)
            both[:, :self.emb_half], both[:, self.emb_half:] = user_emb, item_emb
            emb = torch.from_numpy(both)
        return StudentInputs(sparse=torch.from_numpy(sparse), history=torch.from_numpy(history),
                             dense=torch.from_numpy(dense), surface=torch.full((n,), self.surface), teacher_emb=emb)

    def _user(self, user_id: int, now: dt.datetime) -> tuple[dict, dict, dict]:
        """(attributes, recent behaviour, teacher embedding row) of one user."""
        if self.user_reads == "sdk":  # one SDK call for every user view (the peer of the reader)
            row = self.users.store.get_online_features(features=self.user_refs,
                                                       entity_rows=[{"user_id": user_id}]).to_dict()
            flat = {k: v[0] for k, v in row.items()}
            attrs = {f: flat.get(f) for f in USER_VIEWS["user_attributes"]}
            return attrs, {f: flat.get(f) for f in USER_VIEWS["user_recent_behavior"]}, {USER_EMB: flat.get(USER_EMB)}
        attrs, behavior = (self.users.read(view, [user_id], now)[0] or {} for view in USER_VIEWS)
        emb = (self.users.read(USER_EMB, [user_id], now)[0] or {}) if self.emb_half else {}
        return attrs, behavior, emb

    @torch.inference_mode()
    def score(self, user_id: int, item_ids: list[int], now: dt.datetime | None = None) -> torch.Tensor:
        x = self.inputs(user_id, item_ids, now or dt.datetime.now(dt.timezone.utc))
        return torch.sigmoid(self.model(x).logits)


def _surface_index(features_dir: str | Path, surface: str) -> int:
    """Index of ``surface`` among the data's surfaces (the features manifest's spec)."""
    from gem.features.loader import load_feature_spec

    surfaces = list(load_feature_spec(features_dir).surfaces)
    if surface not in surfaces:
        raise ValueError(f"surface {surface!r} not in the data; it has {surfaces}")
    return surfaces.index(surface)
