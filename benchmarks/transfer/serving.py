"""Serving latency of one student (students/serving.py, students/latency.py), measured
fairly: the cached path (item table in memory, the user's rows through OnlineReader) and
its peer, the Feast SDK path with the same item table (the user's rows through
``FeatureStore.get_online_features``), each one request at a time and under
``threads`` concurrent request threads; plus every candidate read from the online store
(no item table). Every path: ``requests`` requests (the uncached one fewer), repeated
``repeats`` times; p50/p99 are the mean over repeats with their sample std."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch


def wait_quiet(others: list[Path], timeout_s: float = 3 * 3600, poll_s: float = 5.0) -> float:
    """Wait until the other jobs of a parallel run have written their parts (they train
    on the other cores; latency measured beside them says little). Returns the seconds
    waited; gives up after ``timeout_s``."""
    t0 = time.perf_counter()
    while not all(p.is_file() for p in others) and time.perf_counter() - t0 < timeout_s:
        time.sleep(poll_s)
    return time.perf_counter() - t0


def serving_benchmark(result: dict, cfg, work: Path, quiet_after: list[Path] | None = None) -> dict:
    from gem.data.contract import parse_utc
    from gem.features.feast_repo import materialize
    from students.latency import measure, measure_concurrent, repeated
    from students.serving import Scorer

    s = cfg.serving
    res = next(iter(result["worlds"].values()))  # the headline world
    runs = res.arms.get(s.arm) or []
    run = next((r for r in runs if r.models), None)
    if run is None or "feed" not in run.models[min(run.models)]:
        return {}
    model = run.models[min(run.models)]["feed"].model
    world = res.world
    teacher = next((t for t in world.teachers if t.id == run.teacher), None)
    repo = teacher.repo if teacher else world.teachers[0].repo
    end = parse_utc(world.windows["evaluation"][1])
    t0 = time.perf_counter()
    materialize(repo, end)
    materialize_s = time.perf_counter() - t0
    vocab = world.features["teacher"]
    users, items = res.serving["users"], res.serving["items"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one request = one core

    def scorer(user_reads: str, cache: bool = True) -> Scorer:
        sc = Scorer(model, repo, vocab, surface="feed", cache_items=cache, user_reads=user_reads)
        if cache:
            sc.preload_items(items, end)
        return sc

    one = dict(candidates=s.candidates, now=end)
    waited_s = wait_quiet(quiet_after or [])
    load_before = os.getloadavg()
    try:
        t0 = time.perf_counter()
        warm = scorer("online_read")
        load_s = time.perf_counter() - t0
        paths = {
            "cached": repeated(lambda r: measure(warm, users, items, requests=s.requests, seed=r, **one),
                               s.repeats, "end_to_end"),
            "sdk_cached": repeated(lambda r: measure(scorer("sdk"), users, items, requests=s.requests, seed=r, **one),
                                   s.repeats, "end_to_end"),
            "uncached": repeated(lambda r: measure(scorer("online_read", cache=False), users, items,
                                                   requests=s.uncached_requests, seed=r, **one), s.repeats,
                                 "end_to_end"),
            f"cached_{s.threads}threads": repeated(
                lambda r: measure_concurrent(lambda: scorer("online_read"), users, items, threads=s.threads,
                                             requests=s.requests, seed=r, **one), s.repeats),
            f"sdk_cached_{s.threads}threads": repeated(
                lambda r: measure_concurrent(lambda: scorer("sdk"), users, items, threads=s.threads,
                                             requests=s.requests, seed=r, **one), s.repeats),
        }
        score_only = repeated(lambda r: measure(warm, users, items, requests=s.requests, seed=r, **one),
                              s.repeats, "score_only")
    finally:
        torch.set_num_threads(threads)
    return {"student": f"{s.arm}/feed ({run.teacher}, seed {min(run.models)})", "candidates": s.candidates,
            "requests": s.requests, "uncached_requests": s.uncached_requests, "repeats": s.repeats,
            "threads": s.threads, "torch_threads": 1, "materialize_s": materialize_s, "item_table_load_s": load_s,
            "items": len(items), "paths": paths, "score_only": score_only,
            "waited_for_other_jobs_s": round(waited_s, 1),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()]}
