"""`python -m gem train`: pretrain GEM, in one process or under torchrun.

    python -m gem train --features DIR --out runs/x --preset tiny --set model.num_layers=3
    torchrun --nproc_per_node=2 -m gem train --features DIR --out runs/x --preset tiny
    python -m gem train --features DIR --out runs/x --resume      # continue a killed run
    python -m gem train --features DIR --out runs/x --cut 2026-01-06 --cut 2026-01-07
    python -m gem train --features DIR --out runs/x --split-file ids.parquet [--eval-part test]

An explicit split (time cut points, or a Parquet/CSV file of example_id, part): the run
trains only on the examples of part "train" and evaluates each epoch on part
"validation" (or "test" when the split has no validation part; --eval-part chooses) of
--eval-features, by default the training window itself.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from gem.config import iso_time
from gem.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="pretrain the GEM foundation model (single process or torchrun)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", required=True,
                        help="features directory (gem features build) or synthetic://N for generated data")
    parser.add_argument("--eval-features", default=None, help="features directory evaluated after each epoch")
    parser.add_argument("--out", required=True, help="run directory: checkpoints, model, mlflow.db")
    parser.add_argument("--preset", default="tiny", help="train preset in gem/configs/train (tiny|small|base|large)")
    parser.add_argument("--config", default=None, help="a YAML file of TrainConfig values")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a TrainConfig value, or a ModelConfig one as model.KEY=VALUE")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--init-from", default=None,
                        help="start from another model's weights (run folder or models:/ URI), e.g. the champion")
    parser.add_argument("--cut", action="append", default=[], metavar="ISO", type=iso_time,
                        help="time cut point of an explicit split (once: train/test, twice: train/validation/test)")
    parser.add_argument("--split-file", default=None, help="Parquet/CSV with example_id, part (train/validation/test)")
    parser.add_argument("--eval-part", default="", choices=("", "validation", "test"),
                        help="part of the split evaluated (default: validation when the split has one, else test)")
    parser.set_defaults(func=run)


class _QuietFbgemm(logging.Filter):
    """fbgemm logs every table's full argument list at INFO on the root logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "root" and record.levelno <= logging.INFO)


def run(args: argparse.Namespace) -> int:
    from gem.training.config import load_train_config

    cfg, model_cfg = load_train_config(args.preset, args.overrides, args.config)  # refused before any work
    if args.cut and args.split_file:
        raise UsageError("give --cut or --split-file, not both")
    if args.eval_part and not (args.cut or args.split_file):
        raise UsageError("--eval-part needs --cut or --split-file")
    from gem.training.tracking import prestart_worker

    prestart_worker()  # MLflow's imports in a worker process while this one imports torch
    for handler in logging.getLogger().handlers:
        handler.addFilter(_QuietFbgemm())
    from gem.protocol import Split

    split = Split.from_options(args.cut, args.split_file)
    check_inputs(args, split)  # before the model, the MLflow run, the sharding plan
    if cfg.engine == "lightning":
        from gem.training.lightning_module import train_lightning

        result = train_lightning(args.features, args.out, cfg, model_cfg, eval_features=args.eval_features,
                                 split=split, eval_part=args.eval_part)
    else:
        from gem.training.trainer import train

        result = train(args.features, args.out, cfg, model_cfg, resume=args.resume,
                       eval_features=args.eval_features, init_from=args.init_from, split=split,
                       eval_part=args.eval_part)
    summary = {"steps": result.steps, "run_id": result.run_id, **result.perf,
               **{k: v for k, v in result.eval_metrics.items() if "/all/" in k}}
    print(json.dumps(summary, indent=1, sort_keys=True, default=str))
    return 0


def check_inputs(args: argparse.Namespace, split) -> None:
    """The run's inputs, refused (exit 2) before any work: each features window a
    finished build, a local --init-from there, and each part of an explicit split the run
    reads holding examples (the selection is cached: training reads it again for free)."""
    from gem.training.data import SYNTHETIC_PREFIX

    if args.init_from and ":/" not in args.init_from and not Path(args.init_from).exists():
        raise UsageError(f"--init-from {args.init_from}: no such folder, and not a runs:/ or models:/ URI")
    if args.features.startswith(SYNTHETIC_PREFIX):
        return
    from gem.features.loader import FeatureLoader, read_manifest

    read_manifest(args.features)
    if args.eval_features:
        read_manifest(args.eval_features)
    if split is None:
        return
    for features, part in ((args.features, "train"), (args.eval_features or args.features,
                                                       split.evaluated_part(args.eval_part))):
        loader = FeatureLoader(features, batch_size=1, split=split, part=part)
        if not loader.num_examples:
            raise split.empty_part(part, features, loader.manifest.get("window"))
