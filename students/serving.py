"""Scoring one request (a user and N candidate items) with a vertical student, its
inputs read from the Feast online store; GEM never runs here.

    scorer = Scorer(model, repo_dir, vocab_dir, surface="feed")
    probs = scorer.score(user_id, item_ids, now)      # (N, 2): p(click), p(click and convert)

Inputs per request: user attributes, recent behaviour (``recent_item_ids``,
``history_count``) and the teacher's user embedding for the user; item attributes and
the teacher's item embedding per candidate. Raw ids map to the student's dense ids with
the features build's vocabularies. ``cache_items`` keeps item rows in memory (item
attributes are static; item embeddings change only when knowledge is re-registered).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from pathlib import Path

import numpy as np
import torch

from gem.data.contract import ITEM_ATTRIBUTES, SURFACES, USER_ATTRIBUTES
from gem.features.feast_repo import open_store
from gem.features.vocab import Vocabularies
from students.model import StudentInputs, VerticalStudent

USER_FEATURES = [f"user_attributes:{a}" for a in USER_ATTRIBUTES] + [
    "user_recent_behavior:recent_item_ids", "user_recent_behavior:history_count"]
ITEM_FEATURES = [f"item_attributes:{a}" for a in ITEM_ATTRIBUTES]
USER_EMB, ITEM_EMB = "teacher_user_embedding:teacher_user_embedding", "teacher_item_embedding:teacher_item_embedding"


class Scorer:
    def __init__(self, model: VerticalStudent, repo_dir: str | Path, vocab_dir: str | Path, *, surface: str = "feed",
                 cache_items: bool = False) -> None:
        self.model = model.eval()
        self.store = open_store(repo_dir)
        vocab = Vocabularies.read(Path(vocab_dir))
        self.maps = {name: {v: i + 1 for i, v in enumerate(values.to_pylist())} for name, values in vocab.values.items()}
        self.keys = list(model.keys)
        self.surface = SURFACES.index(surface)
        self.h = model.cfg.history_len
        self.dense_names = list(model.cfg.dense_features)
        self.use_emb = model.teacher_emb_dim > 0
        self.user_features = USER_FEATURES + ([USER_EMB] if self.use_emb else [])
        self.item_features = ITEM_FEATURES + ([ITEM_EMB] if self.use_emb else [])
        self.cache_items = cache_items
        self._item_cache: dict[int, tuple[dict, list | None]] = {}

    def _id(self, vocab: str, value) -> int:
        return self.maps[vocab].get(value, 0) if value is not None else 0

    def _items(self, item_ids: list[int]) -> tuple[list[dict], list]:
        missing = [i for i in item_ids if i not in self._item_cache] if self.cache_items else list(item_ids)
        if missing:
            got = self.store.get_online_features(features=self.item_features,
                                                 entity_rows=[{"item_id": int(i)} for i in missing]).to_dict()
            rows = [{a: got[a][j] for a in ITEM_ATTRIBUTES} for j in range(len(missing))]
            embs = got.get("teacher_item_embedding", [None] * len(missing))
            fresh = {i: (r, e) for i, r, e in zip(missing, rows, embs)}
            if not self.cache_items:
                return [fresh[i][0] for i in item_ids], [fresh[i][1] for i in item_ids]
            self._item_cache.update(fresh)
        return [self._item_cache[i][0] for i in item_ids], [self._item_cache[i][1] for i in item_ids]

    def inputs(self, user_id: int, item_ids: list[int], now: dt.datetime) -> StudentInputs:
        n = len(item_ids)
        user = self.store.get_online_features(features=self.user_features,
                                              entity_rows=[{"user_id": int(user_id)}]).to_dict()
        item_rows, item_embs = self._items(item_ids)
        sparse = np.zeros((n, len(self.keys)), dtype=np.int64)
        for j, key in enumerate(self.keys):
            if key == "user_id":
                sparse[:, j] = self._id("user_id", int(user_id))
            elif key == "item_id":
                sparse[:, j] = [self._id("item_id", int(i)) for i in item_ids]
            elif key.startswith("user_"):
                sparse[:, j] = self._id(key[5:], user[key[5:]][0])
            elif key.startswith("item_"):
                sparse[:, j] = [self._id(key[5:], r[key[5:]]) for r in item_rows]
        recent = [self._id("item_id", i) for i in (user["recent_item_ids"][0] or [])][-self.h:]
        history = np.zeros((n, self.h), dtype=np.int64)
        if recent:
            history[:, self.h - len(recent):] = recent
        count = user["history_count"][0] or 0
        hour = now.hour + now.minute / 60 + now.second / 3600
        values = {"log_history_len": math.log1p(count), "hour_of_day_sin": math.sin(2 * math.pi * hour / 24),
                  "hour_of_day_cos": math.cos(2 * math.pi * hour / 24)}
        dense = np.tile(np.array([values.get(k, 0.0) for k in self.dense_names], dtype=np.float32), (n, 1))
        emb = None
        if self.use_emb:
            half = self.model.teacher_emb_dim // 2
            u = np.asarray(user["teacher_user_embedding"][0] or np.zeros(half), dtype=np.float32)
            items = np.stack([np.asarray(e if e is not None else np.zeros(half), dtype=np.float32) for e in item_embs])
            emb = torch.from_numpy(np.concatenate([np.tile(u, (n, 1)), items], axis=1))
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


def measure(scorer: Scorer, users: list[int], items: list[int], *, requests: int, candidates: int,
            now: dt.datetime, seed: int = 0, warmup: int = 10) -> dict:
    """p50/p99 of end-to-end requests (Feast reads + scoring) and of scoring alone."""
    rng = np.random.default_rng(seed)
    reqs = [(int(rng.choice(users)), [int(i) for i in rng.choice(items, candidates, replace=len(items) < candidates)])
            for _ in range(requests + warmup)]
    end_to_end, fetch, score_only = [], [], []
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
    return {"end_to_end": _percentiles(end_to_end), "feature_fetch": _percentiles(fetch),
            "score_only": _percentiles(score_only)}


def latency_benchmark(result: dict, cfg, work: Path, *, requests: int, candidates: int) -> dict:
    """Materialize the dataset's Feast repo up to the eval window end, then measure the
    serving student of ``result`` (see experiment.run_dataset)."""
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
        for cached in (False, True):
            scorer = Scorer(model, result["repo"], vocab, surface="feed", cache_items=cached)
            label = "cached_items" if cached else "feast_items"
            out[label] = measure(scorer, users, items, requests=requests, candidates=candidates, now=end)
        out["end_to_end"] = out["feast_items"]["end_to_end"]
        out["end_to_end_cached_items"] = out["cached_items"]["end_to_end"]
        out["score_only"] = out["feast_items"]["score_only"]
    finally:
        torch.set_num_threads(threads)
    return out
