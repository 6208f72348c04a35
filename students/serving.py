"""Scoring one request (a user and N candidate items) with a vertical student, its
inputs read from the Feast online store; GEM never runs here.

    scorer = Scorer(model, repo_dir, vocab_dir, surface="feed", cache_items=True)
    scorer.preload_items(catalog, now)                 # optional: the candidate catalog
    probs = scorer.score(user_id, item_ids, now)       # (N, 2): p(click), p(click and convert)

Inputs per request: user attributes, recent behaviour (``recent_item_ids``,
``history_count``) and the teacher's user embedding for the user; item attributes and
the teacher's item embedding per candidate, all through ``OnlineReader`` (the online
store's own reads, ttl honoured). Raw ids map to the student's dense ids with the
features build's vocabularies.

Items: with ``cache_items`` the scorer keeps each item's mapped ids and embedding in an
in-memory table (item attributes are static; item embeddings change only when knowledge
is re-registered, after which the serving process calls ``refresh_items``), so a request
reads one user row and gathers candidates by position. Without it every candidate is
read from the online store on every request. The benchmark reports both.
"""

from __future__ import annotations

import datetime as dt
import gc
import math
import time
from pathlib import Path

import numpy as np
import torch

from gem.data.contract import ITEM_ATTRIBUTES, USER_ATTRIBUTES
from gem.features.feast_repo import open_store
from gem.features.vocab import Vocabularies
from students.model import StudentInputs, VerticalStudent
from students.online import OnlineReader

USER_VIEWS = {"user_attributes": list(USER_ATTRIBUTES),
              "user_recent_behavior": ["recent_item_ids", "history_count"]}
ITEM_VIEWS = {"item_attributes": list(ITEM_ATTRIBUTES)}
USER_EMB, ITEM_EMB = "teacher_user_embedding", "teacher_item_embedding"


class Scorer:
    def __init__(self, model: VerticalStudent, repo_dir: str | Path, vocab_dir: str | Path, *, surface: str = "feed",
                 cache_items: bool = False) -> None:
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
        # columns of the sparse input filled from the user row / from each candidate
        self.user_cols = [(j, k) for j, k in enumerate(self.keys) if k == "user_id" or k.startswith("user_")]
        self.item_cols = [(j, k) for j, k in enumerate(self.keys) if k == "item_id" or k.startswith("item_")]
        self.cache_items = cache_items
        self._item_row: dict[int, int] = {}
        self._item_ids = np.zeros((0, len(self.item_cols)), dtype=np.int64)
        self._item_emb = np.zeros((0, self.emb_half), dtype=np.float32)

    def _id(self, vocab: str, value) -> int:
        return self.maps[vocab].get(value, 0) if value is not None else 0

    def _read_items(self, item_ids: list[int], now: dt.datetime) -> tuple[np.ndarray, np.ndarray]:
        """(N, item columns) dense ids and (N, E/2) teacher embeddings, from the online store."""
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
        return ids, emb

    def preload_items(self, item_ids, now: dt.datetime) -> None:
        """Read items into the in-memory table (``cache_items``); already cached ones are kept."""
        missing = list(dict.fromkeys(int(i) for i in item_ids if int(i) not in self._item_row))
        if not missing:
            return
        ids, emb = self._read_items(missing, now)
        start = len(self._item_row)
        self._item_row.update({i: start + r for r, i in enumerate(missing)})
        self._item_ids = np.concatenate([self._item_ids, ids])
        self._item_emb = np.concatenate([self._item_emb, emb])

    def refresh_items(self, now: dt.datetime) -> None:
        """Re-read every cached item (after the online store was re-materialized)."""
        cached = list(self._item_row)
        self._item_row.clear()
        self._item_ids, self._item_emb = self._item_ids[:0], self._item_emb[:0]
        self.preload_items(cached, now)

    def _candidates(self, item_ids: list[int], now: dt.datetime) -> tuple[np.ndarray, np.ndarray]:
        if not self.cache_items:
            return self._read_items(item_ids, now)
        self.preload_items(item_ids, now)
        rows = [self._item_row[int(i)] for i in item_ids]
        return self._item_ids[rows], self._item_emb[rows]

    def inputs(self, user_id: int, item_ids: list[int], now: dt.datetime) -> StudentInputs:
        n, user_id = len(item_ids), int(user_id)
        attrs, behavior = (self.users.read(view, [user_id], now)[0] or {} for view in USER_VIEWS)
        item_ids_mapped, item_emb = self._candidates(item_ids, now)
        sparse = np.empty((n, len(self.keys)), dtype=np.int64)
        for j, key in self.user_cols:
            sparse[:, j] = self._id("user_id", user_id) if key == "user_id" else self._id(key[5:], attrs.get(key[5:]))
        sparse[:, [j for j, _ in self.item_cols]] = item_ids_mapped
        recent = [self._id("item_id", i) for i in (behavior.get("recent_item_ids") or [])][-self.h:]
        history = np.zeros((n, self.h), dtype=np.int64)
        if recent:
            history[:, self.h - len(recent):] = recent
        count = behavior.get("history_count") or 0
        hour = now.hour + now.minute / 60 + now.second / 3600
        values = {"log_history_len": math.log1p(count), "hour_of_day_sin": math.sin(2 * math.pi * hour / 24),
                  "hour_of_day_cos": math.cos(2 * math.pi * hour / 24)}
        dense = np.tile(np.array([values.get(k, 0.0) for k in self.dense_names], dtype=np.float32), (n, 1))
        emb = None
        if self.emb_half:
            row = self.users.read(USER_EMB, [user_id], now)[0]
            user_emb = np.asarray(row[USER_EMB] if row and row[USER_EMB] is not None else np.zeros(self.emb_half),
                                  dtype=np.float32)
            both = np.empty((n, 2 * self.emb_half), dtype=np.float32)
            both[:, :self.emb_half], both[:, self.emb_half:] = user_emb, item_emb
            emb = torch.from_numpy(both)
        return StudentInputs(sparse=torch.from_numpy(sparse), history=torch.from_numpy(history),
                             dense=torch.from_numpy(dense), surface=torch.full((n,), self.surface), teacher_emb=emb)

    @torch.inference_mode()
    def score(self, user_id: int, item_ids: list[int], now: dt.datetime | None = None) -> torch.Tensor:
        x = self.inputs(user_id, item_ids, now or dt.datetime.now(dt.timezone.utc))
        return torch.sigmoid(self.model(x).logits)


def _percentiles(samples: list[float]) -> dict[str, float]:
    ms = np.asarray(samples) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "requests": len(samples)}


def _requests(users: list[int], items: list[int], count: int, candidates: int,
              seed: int) -> list[tuple[int, list[int]]]:
    """Seeded (user, candidates) requests, the same for every path measured."""
    rng = np.random.default_rng(seed)
    return [(int(rng.choice(users)), [int(i) for i in rng.choice(items, candidates, replace=len(items) < candidates)])
            for _ in range(count)]


def measure(scorer: Scorer, users: list[int], items: list[int], *, requests: int, candidates: int,
            now: dt.datetime, seed: int = 0, warmup: int = 10) -> dict:
    """p50/p99 of end-to-end requests (online reads + scoring) and of scoring alone.

    Like a serving process after start-up, the objects built so far are frozen out of the
    garbage collector's generations (``gc.freeze``) so a request never pays for scanning
    them."""
    reqs = _requests(users, items, requests + warmup, candidates, seed)
    end_to_end, fetch, score_only = [], [], []
    gc.collect()
    gc.freeze()
    try:
        for k, (user, cands) in enumerate(reqs):
            t0 = time.perf_counter()
            x = scorer.inputs(user, cands, now)
            t1 = time.perf_counter()
            with torch.inference_mode():
                torch.sigmoid(scorer.model(x).logits)
            t2 = time.perf_counter()
            if k >= warmup:
                end_to_end.append(t2 - t0)
                fetch.append(t1 - t0)
                score_only.append(t2 - t1)
    finally:
        gc.unfreeze()
    return {"end_to_end": _percentiles(end_to_end), "feature_fetch": _percentiles(fetch),
            "score_only": _percentiles(score_only)}


def sdk_fetch(scorer: Scorer, users: list[int], items: list[int], *, requests: int, candidates: int,
              now: dt.datetime, seed: int = 0, warmup: int = 10) -> dict:
    """The peer: the same reads as one uncached request through ``FeatureStore.get_online_features``
    (one call for the user, one for the candidates), without building model inputs."""
    store = scorer.users.store
    user_refs = [f"{v}:{f}" for v, fs in scorer.users.features.items() for f in fs]
    item_refs = [f"{v}:{f}" for v, fs in scorer.items.features.items() for f in fs]
    samples = []
    for k, (user, cands) in enumerate(_requests(users, items, requests + warmup, candidates, seed)):
        t0 = time.perf_counter()
        store.get_online_features(features=user_refs, entity_rows=[{"user_id": user}]).to_dict()
        store.get_online_features(features=item_refs, entity_rows=[{"item_id": i} for i in cands]).to_dict()
        if k >= warmup:
            samples.append(time.perf_counter() - t0)
    return _percentiles(samples)


def latency_benchmark(result: dict, cfg, work: Path, *, requests: int, candidates: int) -> dict:
    """Materialize the dataset's Feast repo up to the eval window end, then measure the
    serving student of ``result`` (see experiment.run_dataset): candidates read from the
    online store per request, and from the in-memory item table preloaded with the
    catalog; plus the Feast SDK's reads of the same features as the peer."""
    from gem.data.contract import parse_utc
    from gem.features.feast_repo import materialize

    model = result.get("serving_student")
    if model is None:
        return {}
    end = parse_utc(result["windows"]["eval"][1])
    t0 = time.perf_counter()
    materialize(result["repo"], end)
    materialize_s = time.perf_counter() - t0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one request = one core; the other serves the next request
    try:
        out = {"materialize_s": materialize_s, "candidates": candidates, "torch_threads": 1,
               "student": result.get("serving_student_name", "")}
        vocab = Path(result["features"]["teacher"])
        users, items = result["serving_users"], result["serving_items"]
        kw = dict(requests=requests, candidates=candidates, now=end)
        online = Scorer(model, result["repo"], vocab, surface="feed", cache_items=False)
        out["online_items"] = measure(online, users, items, **kw)
        out["feast_sdk_fetch"] = sdk_fetch(online, users, items, **kw)
        cached = Scorer(model, result["repo"], vocab, surface="feed", cache_items=True)
        t0 = time.perf_counter()
        cached.preload_items(items, end)
        out["item_table"] = {"items": len(items), "load_s": time.perf_counter() - t0}
        out["cached_items"] = measure(cached, users, items, **kw)
        out["end_to_end"] = out["cached_items"]["end_to_end"]
        out["score_only"] = out["cached_items"]["score_only"]
    finally:
        torch.set_num_threads(threads)
    return out


def _surface_index(features_dir: str | Path, surface: str) -> int:
    """Index of ``surface`` among the data's surfaces (the features manifest's spec)."""
    from gem.features.loader import load_feature_spec

    surfaces = list(load_feature_spec(features_dir).surfaces)
    if surface not in surfaces:
        raise ValueError(f"surface {surface!r} not in the data; it has {surfaces}")
    return surfaces.index(surface)
