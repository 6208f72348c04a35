"""Knowledge-generation throughput: teacher examples/s over a features window on this
machine (2 cores), end to end (loader + teacher forward + Parquet), per preset.

`python -m benchmarks.knowledge_bench [--model-preset small] [--users N]` writes
benchmarks/results/knowledge.json. The teacher is untrained (throughput does not
depend on the weights); the window is a simulator dataset's features build.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.results import print_table, write_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-presets", default="tiny,small")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--days", type=int, default=2)
    parser.add_argument("--max-seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from gem.data.simulate import SimulatorConfig, simulate
    from gem.features import build_features
    from gem.features.config import FeaturesConfig
    from gem.features.loader import load_feature_spec
    from gem.knowledge.config import KnowledgeConfig
    from gem.knowledge.generate import generate_knowledge
    from gem.knowledge.teacher import Teacher
    from gem.model import build_model, forward_flops_per_example, load_model_config

    figures: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        simulate(SimulatorConfig(users=args.users, items=2000, days=args.days, seed=0, workers=1), root / "data",
                 progress=False)
        build_features(root / "data", root / "features",
                       FeaturesConfig(max_seq_len=args.max_seq_len, num_buckets=2, workers=1))
        spec = load_feature_spec(root / "features")
        for preset in args.model_presets.split(","):
            torch.manual_seed(0)
            model = build_model(load_model_config(preset, ["attention_backend=padded"]), spec).eval()
            teacher = Teacher(model, f"untrained:{preset}", f"untrained:{preset}")
            with torch.no_grad():  # warm-up: one batch through the teacher
                from gem.data.batch import synthetic_batch

                model(synthetic_batch(spec, 64, seed=0, mean_len=float(args.max_seq_len) / 2), all_surfaces=True)
            start = time.perf_counter()
            manifest = generate_knowledge(teacher, root / "features", root / f"k_{preset}",
                                          KnowledgeConfig(batch_size=args.batch_size))
            seconds = time.perf_counter() - start
            n = manifest["counts"]["examples"]
            figures[preset] = {"examples": n, "seconds_end_to_end": seconds, "examples_per_s_end_to_end": n / seconds,
                               "examples_per_s_loader_and_teacher": manifest["examples_per_s"],
                               "teacher_flops_per_example": forward_flops_per_example(
                                   model, mean_len=float(args.max_seq_len) / 2)}
    path = write_result("knowledge", figures, sizes={"users": args.users, "days": args.days,
                                                     "max_seq_len": args.max_seq_len, "batch_size": args.batch_size,
                                                     "threads": args.threads})
    print_table(f"knowledge generation ({path})",
                [(f"{p} examples/s (end to end)", f["examples_per_s_end_to_end"]) for p, f in figures.items()])


if __name__ == "__main__":
    main()
