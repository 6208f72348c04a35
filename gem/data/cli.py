"""`python -m gem data ...`: simulate, convert and validate contract datasets."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from gem.config import count, fraction, load_config, preset_names
from gem.data.contract import ContractError

# `data validate` exit codes (also in its --help and docs/data-contract.md)
EXIT_OK, EXIT_QUARANTINE, EXIT_UNREADABLE, EXIT_EMPTY, EXIT_INTERNAL = 0, 1, 2, 3, 4
VALIDATE_EPILOG = """exit codes:
  0  valid: quarantined share within --max-quarantine-fraction
  1  more rows quarantined than --max-quarantine-fraction allows (see the report)
  2  usage error, or input that cannot be read under the contract (names file and column)
  3  empty dataset: no event row, or none left after quarantine
  4  internal error in the validator (a bug: please report it with the traceback)"""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("data", help="simulate, convert and validate contract datasets",
                            description="Contract datasets: simulate, convert real data, validate.")
    data_sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    sim = data_sub.add_parser("simulate", help="write a simulated ads-event dataset")
    sim.add_argument("--out", required=True, type=Path, help="output dataset directory")
    sim.add_argument("--users", type=count(1))
    sim.add_argument("--items", type=count(1))
    sim.add_argument("--days", type=count(1))
    sim.add_argument("--seed", type=int)
    sim.add_argument("--preset", choices=preset_names("simulator"), help="named size preset")
    sim.add_argument("--config", type=Path, help="YAML file with SimulatorConfig fields")
    sim.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override any SimulatorConfig field (repeatable)")
    sim.set_defaults(func=_simulate)

    val = data_sub.add_parser("validate", help="check a dataset against the contract, quarantining bad rows",
                              epilog=VALIDATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    val.add_argument("path", type=Path, help="dataset directory (with manifest.json)")
    val.add_argument("--report-dir", type=Path, help="where quarantine.parquet and the report go "
                                                      "(default PATH/_validation)")
    val.add_argument("--out", type=Path, help="also write the processed rows as a clean dataset here")
    val.add_argument("--max-quarantine-fraction", type=fraction, default=0.0,
                     help="exit 1 when more than this share of rows is quarantined: a number in [0, 1] "
                          "(default 0)")
    val.set_defaults(func=_validate)

    conv = data_sub.add_parser("convert", help="convert a public dataset into the contract")
    conv.add_argument("source", choices=("movielens", "movielens-1m", "taobao", "ciao"))
    conv.add_argument("raw", type=Path, help="raw files: the ml-100k or ml-1m folder, UserBehavior.csv, or the "
                                             "Ciao folder (ratings.csv.gz)")
    conv.add_argument("out", type=Path, help="output dataset directory")
    conv.add_argument("--seed", type=int, default=0, help="taobao, movielens-1m --implicit: negative-sampling seed")
    conv.add_argument("--implicit", action="store_true",
                      help="movielens-1m: implicit feedback (every rating a positive, one sampled unrated movie "
                           "per positive as a negative)")
    conv.add_argument("--negatives-per-click", type=count(0), default=1, help="taobao: sampled unclicked impressions")
    conv.add_argument("--label", choices=("pv", "action"), default="pv",
                      help="taobao: pv = a page view is a click (default); action = click is cart/fav/buy within "
                           "3 days of the page view, known at that time (no synthetic negatives)")
    conv.set_defaults(func=_convert)


def _simulate(args: argparse.Namespace) -> int:
    from gem.data.simulate import SimulatorConfig, simulate

    overrides = list(args.overrides)
    for name in ("users", "items", "days", "seed"):
        if getattr(args, name) is not None:
            overrides.append(f"{name}={getattr(args, name)}")
    cfg = load_config(SimulatorConfig, section="simulator", preset=args.preset, path=args.config,
                      overrides=overrides)
    manifest = simulate(cfg, args.out)
    print(f"wrote {manifest.extra['events']:,} events for {cfg.users:,} users, {cfg.items:,} items, "
          f"{cfg.days} days to {args.out}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from gem.data.validate import validate_dataset
    from gem.utils.outputs import OutputFolderError

    try:
        report = validate_dataset(args.path, report_dir=args.report_dir, out=args.out)
    except (ContractError, OutputFolderError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    except Exception:  # noqa: BLE001 - a crash must not read as "quarantine over limit"
        traceback.print_exc()
        print(f"error: the validator failed on {args.path} (exit {EXIT_INTERNAL}: a bug, not bad data)",
              file=sys.stderr)
        return EXIT_INTERNAL
    print(report.summary())
    print(f"  report: {report.report_path}")
    if report.empty:
        print(f"FAILED: {args.path}: empty dataset: {report.input_rows.get('events', 0):,} event rows, none valid "
              f"(quarantine: {report.quarantine_path})", file=sys.stderr)
        return EXIT_EMPTY
    if report.quarantined_fraction > args.max_quarantine_fraction:
        print(f"FAILED: {report.quarantined_fraction:.4%} of rows quarantined "
              f"(allowed {args.max_quarantine_fraction:.4%})", file=sys.stderr)
        return EXIT_QUARANTINE
    return EXIT_OK


def _convert(args: argparse.Namespace) -> int:
    if args.source == "movielens":
        from gem.data.adapters.movielens import convert_movielens

        manifest = convert_movielens(args.raw, args.out)
    elif args.source == "movielens-1m":
        from gem.data.adapters.movielens1m import convert_movielens1m

        manifest = convert_movielens1m(args.raw, args.out, implicit=args.implicit, seed=args.seed)
    elif args.source == "ciao":
        from gem.data.adapters.ciao import convert_ciao

        manifest = convert_ciao(args.raw, args.out)
    else:
        from gem.data.adapters.taobao import convert_taobao

        manifest = convert_taobao(args.raw, args.out, seed=args.seed, negatives_per_click=args.negatives_per_click,
                                  label=args.label)
    summary = manifest.extra["conversion"]
    print(f"wrote {summary['events']:,} events, {summary['users']:,} users, {summary['items']:,} items to "
          f"{args.out}; quarantined raw lines: {sum(summary['quarantined'].values())}")
    return 0
