"""What serving the counters costs a request: the in-process Scorer (students/serving.py,
item table preloaded, one torch thread) with the pipeline's student inputs (the
request-time features, the user's prior click rate and four counter lifts, read from the
Feast online counters views: students/request_dense.py) beside the same student
architecture on the three request-time features alone, 100 candidates a request.

`python -m benchmarks.serving_counters_bench` writes benchmarks/results/serving_counters.json
(about 1 minute on 2 cores). The world: the tests' tiny simulator (300 users, 600 items),
a features window with counters (the eval window, the teacher's vocabularies), a private
Feast repo materialized at the window's end. Both paths score the same seeded
(user, candidates) draws; their requests alternate in blocks so that load on a shared
machine reaches both alike. The figures to compare are the ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
from pathlib import Path

import torch

from benchmarks.results import print_table, write_result

CANDIDATES = 100
PIPELINE_PRESET = "pipeline"  # gem/configs/students/pipeline.yaml: its dense features are the counters path's


def build(root: Path):
    """(features dir with counters, Feast repo, users, items, now)."""
    from gem.features import build_features
    from gem.features.config import FeaturesConfig
    from gem.features.feast_repo import DEFAULT_REPO, apply, materialize
    from gem.knowledge.feast import prepare_repo
    from tests.students.fixtures import WINDOWS, tiny_world

    world = tiny_world(root / "world")
    features = root / "features"
    lo, hi = WINDOWS["eval"]
    build_features(world.data, features, FeaturesConfig(max_seq_len=16, num_buckets=1, workers=1, counters=True,
                                                        vocab_from=str(world.features["teacher"])),
                   window_start=lo, window_end=hi)
    repo = prepare_repo(root / "feast", world.data)
    apply(repo, definitions_repo=DEFAULT_REPO)
    now = dt.datetime.fromisoformat(hi).replace(tzinfo=dt.timezone.utc)
    materialize(repo, now)
    from gem.features.vocab import Vocabularies

    vocab = Vocabularies.read(world.features["teacher"]).values
    return features, repo, [int(u) for u in vocab["user_id"].to_pylist()], \
        [int(i) for i in vocab["item_id"].to_pylist()], now


def scorer(features: Path, repo: Path, dense: list[str]):
    from gem.features.loader import load_feature_spec
    from students.config import StudentModelConfig
    from students.distill import cardinalities
    from students.model import VerticalStudent
    from students.serving import Scorer

    spec = load_feature_spec(features)
    cfg = StudentModelConfig(dense_features=dense, history_len=8, mlp_hidden=[32, 16])
    torch.manual_seed(0)
    model = VerticalStudent(cfg, cardinalities(spec, cfg), len(dense), 0, len(spec.surfaces))
    return Scorer(model, repo, features, surface="feed", cache_items=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per path")
    parser.add_argument("--blocks", type=int, default=10, help="alternating blocks the requests are cut into")
    args = parser.parse_args()
    from gem.config import load_config
    from students.config import DistillConfig
    from students.latency import measure
    from students.request_dense import REQUEST_FEATURES

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="serving-counters-") as tmp:
        features, repo, users, items, now = build(Path(tmp))
        pipeline = load_config(DistillConfig, section="students", preset=PIPELINE_PRESET)
        paths = {"request_only": list(REQUEST_FEATURES), "counters": list(pipeline.student.dense_features)}
        scorers = {name: scorer(features, repo, dense) for name, dense in paths.items()}
        for s in scorers.values():
            s.preload_items(items, now)
        per_block = max(args.requests // args.blocks, 1)
        samples: dict[str, dict[str, list[float]]] = {n: {"end_to_end": [], "reads": []} for n in paths}
        for block in range(args.blocks):
            for name, s in scorers.items():
                got = measure(s, users, items, requests=per_block, candidates=CANDIDATES, now=now, seed=block,
                              warmup=2 if block else 10, raw=True)
                samples[name]["end_to_end"] += got["samples"]["end_to_end"]
                samples[name]["reads"] += got["samples"]["feature_fetch"]
    from students.latency import percentiles

    figures = {}
    for name, kinds in samples.items():
        for kind, values in kinds.items():
            for stat, value in percentiles(values).items():
                if stat != "requests":
                    figures[f"{name}_{kind}_{stat}"] = value
    figures["counters_over_request_only_p50"] = figures["counters_end_to_end_p50_ms"] / \
        figures["request_only_end_to_end_p50_ms"]
    figures["counters_over_request_only_p99"] = figures["counters_end_to_end_p99_ms"] / \
        figures["request_only_end_to_end_p99_ms"]
    figures["counters_p99_under_10ms"] = figures["counters_end_to_end_p99_ms"] < 10.0
    figures["command"] = "python -m benchmarks.serving_counters_bench"
    sizes = {"candidates": CANDIDATES, "requests_per_path": per_block * args.blocks, "blocks": args.blocks,
             "users": len(users), "items": len(items), "torch_threads": 1, "item_table": "preloaded",
             "dense_features": paths}
    write_result("serving_counters", figures, sizes)
    print_table("serving the counters (in-process Scorer, 100 candidates, ms)",
                [(k, v) for k, v in figures.items() if k.endswith(("p50_ms", "p99_ms")) or "over" in k])


if __name__ == "__main__":
    main()
