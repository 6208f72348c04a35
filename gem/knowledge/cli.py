"""`python -m gem knowledge ...`: generate teacher knowledge, register it in Feast.

    python -m gem knowledge generate --model models:/gem-teacher@prod --data features/ --out knowledge/
    python -m gem knowledge register --knowledge knowledge/ [--repo feature_repo/] [--materialize END]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gem.config import iso_time


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("knowledge", help="generate teacher predictions and embeddings",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="knowledge_command", metavar="SUBCOMMAND", required=True)

    gen = sub.add_parser("generate", help="run a frozen GEM over a features window; write Parquet")
    gen.add_argument("--model", required=True,
                     help="teacher: a run/model folder, runs:/<id>/model or models:/<name>[/<version>|@<alias>]")
    gen.add_argument("--data", required=True, type=Path, help="features directory (the window)")
    gen.add_argument("--out", required=True, type=Path,
                     help="output knowledge folder: new, empty or an earlier knowledge output (replaced "
                          "atomically); any other folder is refused")
    gen.add_argument("--start", type=iso_time, help="only shards whose day is >= start (ISO-8601 UTC)")
    gen.add_argument("--end", type=iso_time, help="only shards whose day starts before end")
    gen.add_argument("--tracking-uri", default=None, help="MLflow tracking URI for runs:/ and models:/ URIs")
    gen.add_argument("--preset", default="default", help="gem/configs/knowledge/<preset>.yaml")
    gen.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    gen.set_defaults(func=_generate)

    reg = sub.add_parser("register", help="write knowledge folders as the Feast teacher_* sources and apply")
    reg.add_argument("--knowledge", required=True, type=Path, nargs="+", help="knowledge folder(s)")
    reg.add_argument("--repo", type=Path, default=None, help="Feast repo directory (default: feature_repo/)")
    reg.add_argument("--materialize", default=None, metavar="END", type=iso_time,
                     help="then load the online store up to END")
    reg.set_defaults(func=_register)


def _generate(args: argparse.Namespace) -> int:
    from gem.config import load_config
    from gem.knowledge.config import KnowledgeConfig
    from gem.knowledge.generate import generate_knowledge

    cfg = load_config(KnowledgeConfig, section="knowledge", preset=args.preset, overrides=args.overrides)
    manifest = generate_knowledge(args.model, args.data, args.out, cfg, start=args.start, end=args.end,
                                  tracking_uri=args.tracking_uri)
    print(json.dumps({k: manifest[k] for k in ("teacher_version", "window", "counts", "examples_per_s")}, indent=2))
    return 0


def _register(args: argparse.Namespace) -> int:
    from gem.data.contract import parse_utc
    from gem.features.feast_repo import materialize, resolve_repo
    from gem.knowledge.feast import register_knowledge

    repo = resolve_repo(args.repo)
    register_knowledge(repo, list(args.knowledge))
    if args.materialize:
        materialize(repo, parse_utc(args.materialize))
    print(json.dumps({"repo": str(repo), "knowledge": [str(k) for k in args.knowledge],
                      "materialized_until": args.materialize}))
    return 0
