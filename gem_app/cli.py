"""`python -m gem <command>`: one entry point for every stage.

Each command lives in its stage's own `cli` module, which exposes
``register(subparsers)`` adding one sub-command whose ``func(args) -> int`` runs it.

Exit codes: 0 done; 2 a user error (a bad option, setting or input, or a workspace another
run holds: one or two lines on stderr naming it and the rule, the traceback only with
``--debug`` or ``GEM_DEBUG=1``); 1 a run that failed: a failure of the machine (a full
disk, the file size limit, a locked or unreachable store) in one line naming the resource
and what to do, a bug with its traceback; anything else is the command's own (``data
validate`` documents its codes).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from gem.errors import EXIT_MACHINE, EXIT_USER_ERROR, is_user_error, machine_failure

# command -> (module defining register(), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("gem.data.cli", "simulate, convert and validate contract datasets"),
    "features": ("gem.features.cli", "build point-in-time sequence features and the Feast repo"),
    "train": ("gem.training.cli", "pretrain the GEM foundation model (single process or torchrun)"),
    "knowledge": ("gem.knowledge.cli", "generate teacher predictions and embeddings"),
    "distill": ("gem_app.distill_cli", "distill GEM into per-surface vertical models"),
    "score": ("gem_app.score_cli", "one prediction per example of a features window (explicit splits too)"),
    "serve": ("gem_app.serve_cli", "serve a registered student over HTTP"),
    "pipeline": ("gem_app.pipeline_cli", "run or compile the end-to-end pipeline"),
    "refresh": ("gem_app.refresh.cli", "run scheduled continuous-refresh cycles"),
}


class _Parser(argparse.ArgumentParser):
    """A refused option is one line naming it and the rule (argparse's usage block, often
    longer than the screen, stays in --help); exit 2 as argparse does."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m gem",
        description="GEM: ads foundation model training and transfer to vertical models.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a user error too (anywhere on the line; also GEM_DEBUG=1)")
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


def user_error_text(exc: BaseException) -> str:
    """At most two lines: the message's first line and, when there is more, the last."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    return "\n".join(lines if len(lines) <= 2 else [lines[0], lines[-1]])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    after = argv.index("--") if "--" in argv else len(argv)
    debug_anywhere = "--debug" in argv[:after]  # also after the command: `python -m gem score ... --debug`
    args = parser.parse_args([a for i, a in enumerate(argv) if not (a == "--debug" and i < after)])
    debug = debug_anywhere or os.environ.get("GEM_DEBUG", "") not in ("", "0")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's code for SIGINT, not a traceback
        if debug:
            raise
        print(f"interrupted: gem {args.command} stopped (Ctrl-C)", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        if is_user_error(exc):
            print(f"error: {user_error_text(exc)}", file=sys.stderr)
            return EXIT_USER_ERROR
        failure = machine_failure(exc, where=_output_of(args))
        if failure is None:
            raise
        print(f"error: {failure}", file=sys.stderr)
        return EXIT_MACHINE


def _output_of(args: argparse.Namespace) -> str | None:
    """Where the command writes (its --out or --workspace), to name in a machine failure."""
    for name in ("out", "workspace"):
        value = getattr(args, name, None)
        if value:
            return str(value)
    return None
