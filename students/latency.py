"""Serving latency of a Scorer: one request = the online reads of one user and N
candidates, then the student's forward, timed end to end.

    measure(scorer, users, items, requests=2000, candidates=100, now=t)          # one thread
    measure_concurrent(make_scorer, users, items, threads=4, requests=2000, ...)  # 4 request threads

Requests are seeded (user, candidates) draws, the same for every path measured. Like a
serving process after start-up, the objects built so far are frozen out of the garbage
collector's generations (``gc.freeze``) so a request never pays for scanning them. Under
``measure_concurrent`` each thread owns its scorer (its own Feast store and sqlite
connection, as a worker would) and the threads take requests from one shared queue; the
latency of a request is measured from when its thread takes it.
"""

from __future__ import annotations

import datetime as dt
import gc
import queue
import threading
import time
from typing import Callable

import numpy as np
import torch


def percentiles(samples: list[float]) -> dict[str, float]:
    ms = np.asarray(samples) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "requests": len(samples)}


def requests_for(users: list[int], items: list[int], count: int, candidates: int,
                 seed: int) -> list[tuple[int, list[int]]]:
    """Seeded (user, candidates) requests, the same for every path measured."""
    rng = np.random.default_rng(seed)
    return [(int(rng.choice(users)), [int(i) for i in rng.choice(items, candidates, replace=len(items) < candidates)])
            for _ in range(count)]


def _one(scorer, user: int, cands: list[int], now: dt.datetime) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    x = scorer.inputs(user, cands, now)
    t1 = time.perf_counter()
    with torch.inference_mode():
        torch.sigmoid(scorer.model(x).logits)
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0, t2 - t1


def measure(scorer, users: list[int], items: list[int], *, requests: int, candidates: int,
            now: dt.datetime, seed: int = 0, warmup: int = 10, raw: bool = False) -> dict:
    """p50/p99 of end-to-end requests (online reads + scoring), of the reads and of the
    scoring alone, one request at a time; with ``raw`` also every request's seconds
    (``samples``), for pooling several runs."""
    reqs = requests_for(users, items, requests + warmup, candidates, seed)
    end_to_end, fetch, score_only = [], [], []
    gc.collect()
    gc.freeze()
    try:
        for k, (user, cands) in enumerate(reqs):
            total, read, score = _one(scorer, user, cands, now)
            if k >= warmup:
                end_to_end.append(total)
                fetch.append(read)
                score_only.append(score)
    finally:
        gc.unfreeze()
    out = {"end_to_end": percentiles(end_to_end), "feature_fetch": percentiles(fetch),
           "score_only": percentiles(score_only)}
    if raw:
        out["samples"] = {"end_to_end": end_to_end, "feature_fetch": fetch}
    return out


def measure_concurrent(make_scorer: Callable[[], object], users: list[int], items: list[int], *, threads: int,
                       requests: int, candidates: int, now: dt.datetime, seed: int = 0, warmup: int = 10) -> dict:
    """p50/p99 of ``requests`` end-to-end requests served by ``threads`` threads at once
    (each with its own scorer from ``make_scorer``, warmed up first), and the throughput."""
    scorers = [make_scorer() for _ in range(threads)]
    for scorer in scorers:
        for user, cands in requests_for(users, items, warmup, candidates, seed + 1):
            _one(scorer, user, cands, now)
    work: queue.Queue = queue.Queue()
    for req in requests_for(users, items, requests, candidates, seed):
        work.put(req)
    samples: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads + 1)

    def serve(k: int) -> None:
        start.wait()
        try:
            while True:
                try:
                    user, cands = work.get_nowait()
                except queue.Empty:
                    return
                samples[k].append(_one(scorers[k], user, cands, now)[0])
        except BaseException as e:  # noqa: BLE001 - surfaced below, after the other threads stop
            errors.append(e)

    workers = [threading.Thread(target=serve, args=(k,), daemon=True) for k in range(threads)]
    for w in workers:
        w.start()
    gc.collect()
    gc.freeze()
    try:
        start.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
    finally:
        gc.unfreeze()
    if errors:
        raise errors[0]
    flat = [x for part in samples for x in part]
    return {**percentiles(flat), "threads": threads, "throughput_rps": len(flat) / wall,
            "per_thread_requests": [len(part) for part in samples]}


def repeated(fn: Callable[[int], dict], repeats: int, key: str | None = None) -> dict:
    """``fn(repeat)`` ``repeats`` times; p50/p99 of each repeat and their mean and sample
    std (ddof=1). ``key`` picks a sub-dict of the result (e.g. "end_to_end")."""
    from students.stats import sample_std

    runs = []
    for r in range(repeats):
        out = fn(r)
        runs.append(out[key] if key else out)
    summary = {"repeats": runs}
    for stat in ("p50_ms", "p99_ms"):
        values = [run[stat] for run in runs]
        summary[stat] = float(np.mean(values))
        summary[f"{stat}_std"] = sample_std(values)
    return summary
