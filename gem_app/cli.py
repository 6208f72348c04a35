"""`python -m gem <command>`: one entry point for every stage.

Each command lives in its stage's own `cli` module, which exposes
``register(subparsers)`` adding one sub-command whose ``func(args) -> int`` runs it.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# command -> (module defining register(), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("gem.data.cli", "simulate, convert and validate contract datasets"),
    "features": ("gem.features.cli", "build point-in-time sequence features and the Feast repo"),
    "train": ("gem.training.cli", "pretrain the GEM foundation model (single process or torchrun)"),
    "knowledge": ("gem.knowledge.cli", "generate teacher predictions and embeddings"),
    "distill": ("gem_app.distill_cli", "distill GEM into per-surface vertical models"),
    "score": ("gem_app.score_cli", "one prediction per example of a features window (explicit splits too)"),
    "pipeline": ("gem_app.pipeline_cli", "run or compile the end-to-end pipeline"),
    "refresh": ("gem_app.refresh.cli", "run scheduled continuous-refresh cycles"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gem",
        description="GEM: ads foundation model training and transfer to vertical models.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name):
                raise
            _register_unavailable(sub, name, help_text)
            continue
        module.register(sub)
    return parser


def _register_unavailable(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(name, help=f"{help_text} (not built yet)", description=help_text)

    def unavailable(_args: argparse.Namespace) -> int:
        print(f"`{name}` is not built yet in this checkout.", file=sys.stderr)
        return 2

    parser.set_defaults(func=unavailable)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    return int(args.func(args) or 0)
