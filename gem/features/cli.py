"""`python -m gem features ...`: build, feast-apply, materialize."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gem.config import iso_time


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("features", help="build point-in-time sequence features and the Feast repo")
    sub = parser.add_subparsers(dest="features_command", metavar="SUBCOMMAND", required=True)

    build = sub.add_parser("build", help="training examples of a window from a contract dataset")
    build.add_argument("data", type=Path, help="contract dataset directory")
    build.add_argument("out", type=Path, help="output features directory")
    build.add_argument("--start", type=iso_time, help="window start, ISO-8601 UTC (default: the dataset's)")
    build.add_argument("--end", type=iso_time, help="window end, exclusive (default: the dataset's)")
    build.add_argument("--previous", type=Path, help="an earlier features dir or report.json, for drift")
    build.add_argument("--allow-empty", action="store_true",
                       help="build a window without any example instead of refusing it (exit 2)")
    _config_args(build)
    build.set_defaults(func=_build)

    feast_apply = sub.add_parser("feast-apply", help="write the repo's sources from a dataset, then apply")
    feast_apply.add_argument("--data", type=Path, required=True, help="contract dataset directory")
    feast_apply.add_argument("--repo", type=Path, default=None, help="Feast repo (default: feature_repo/)")
    _config_args(feast_apply)
    feast_apply.set_defaults(func=_feast_apply)

    materialize = sub.add_parser("materialize", help="load the online store up to --end")
    materialize.add_argument("--end", required=True, type=iso_time,
                             help="ISO-8601 UTC; rows with event_timestamp <= end")
    materialize.add_argument("--start", type=iso_time, help="ISO-8601 UTC (default: everything before --end)")
    materialize.add_argument("--repo", type=Path, default=None, help="Feast repo (default: feature_repo/)")
    materialize.set_defaults(func=_materialize)


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="default", help="gem/configs/features/<preset>.yaml")
    parser.add_argument("--config", type=Path, help="a YAML file overriding the preset")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")


def _load_cfg(args: argparse.Namespace):
    from gem.config import load_config
    from gem.features.config import FeaturesConfig

    return load_config(FeaturesConfig, section="features", preset=args.preset, path=args.config,
                       overrides=args.overrides)


def _build(args: argparse.Namespace) -> int:
    from gem.data.contract import ContractError
    from gem.features.build import build_features
    from gem.features.validation import DatasetRejected
    from gem.utils.memory import keep_freed_memory
    from gem.utils.outputs import OutputFolderError

    keep_freed_memory()
    try:
        manifest = build_features(args.data, args.out, _load_cfg(args), window_start=args.start,
                                  window_end=args.end, previous_report=args.previous, allow_empty=args.allow_empty)
    except (DatasetRejected, ContractError, OutputFolderError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = {"out": str(args.out), "window": manifest["window"], "counts": manifest["counts"],
               "bytes_per_example": round(manifest["bytes"]["per_example"], 1), "digest": manifest["digest"]}
    print(json.dumps(summary, indent=2))
    return 0


def _feast_apply(args: argparse.Namespace) -> int:
    from gem.features.feast_repo import apply, resolve_repo
    from gem.features.feast_sources import export

    repo = resolve_repo(args.repo)
    written = export(args.data, repo, recent_k=_load_cfg(args).recent_k)
    apply(repo)
    print(json.dumps({"repo": str(repo), "sources": {k: str(v) for k, v in written.items()}}, indent=2))
    return 0


def _materialize(args: argparse.Namespace) -> int:
    from gem.data.contract import parse_utc
    from gem.features.feast_repo import materialize, resolve_repo

    repo = resolve_repo(args.repo)
    if not (repo / "data" / "registry.db").is_file():
        print(f"{repo}: no registry yet; run `python -m gem features feast-apply --data DATA` first",
              file=sys.stderr)
        return 2
    materialize(repo, parse_utc(args.end), parse_utc(args.start) if args.start else None)
    print(json.dumps({"repo": str(repo), "materialized_until": args.end}))
    return 0
