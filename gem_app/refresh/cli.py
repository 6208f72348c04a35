"""`python -m gem refresh`: continuous refresh of GEM and the students.

    python -m gem refresh --data runs/incoming --workspace runs/refresh          # one pass over new days
    python -m gem refresh --data runs/incoming --workspace runs/refresh --every 1d
    python -m gem refresh schedule --host https://kfp.example --package pipelines/compiled/refresh_pipeline.yaml

A pass runs one cycle per newly arrived day (``--catch-up each``) or one cycle over
all of them (``--catch-up batch``), under a lock: a second concurrent refresh refuses
to start (exit 2, naming the first's pid), and so does a second ``--every`` scheduler of
the same workspace (its lock is held for its whole life). A day folder that is not a
real day, or a day outside the manifest's window (``window_end`` not extended when the
day arrived), is refused before any work, in one line naming it and the way on. A failed
cycle leaves the state and the champions untouched. A day at or before the last
processed one that changed or arrived late is reported, and refused
(``--late-data refuse``, the default: exit 2, nothing run) or backfilled
(``--late-data backfill``: the next cycle rebuilds its windows from the current data and
continues the teacher from the earliest such day).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from gem.config import count, iso_day

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("refresh", help="run scheduled continuous-refresh cycles", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="contract dataset that keeps receiving day partitions")
    parser.add_argument("--workspace", type=Path, default=Path("runs/refresh"),
                        help="state, lock, MLflow store and one folder per cycle")
    parser.add_argument("--every", default=None, type=interval,
                        help="keep running on this interval (1d, 6h, 30m; > 0): one scheduler per workspace")
    parser.add_argument("--catch-up", choices=("each", "batch"), default="each",
                        help="missed days: one cycle per day, or one cycle over all of them")
    parser.add_argument("--first-day", default=None, type=iso_day, help="first day to refresh when no state exists")
    parser.add_argument("--late-data", choices=("refuse", "backfill"), default="refuse",
                        help="a changed or late day at or before the last processed one: refuse (default) or "
                             "backfill it")
    parser.add_argument("--preset", choices=("tiny", "small"), default="small")
    parser.add_argument("--surfaces", default="", help="comma-separated surfaces (default: all)")
    parser.add_argument("--max-cycles", type=count(0), default=0, help="with --every: stop after this many ticks")
    parser.set_defaults(func=_refresh)
    actions = parser.add_subparsers(dest="refresh_command", metavar="ACTION")
    schedule = actions.add_parser("schedule", help="create the KFP recurring run of the compiled refresh pipeline")
    schedule.add_argument("--host", required=True, help="KFP API endpoint")
    schedule.add_argument("--package", type=Path, default=Path("pipelines/compiled/refresh_pipeline.yaml"))
    schedule.add_argument("--cron", default="0 0 3 * * *", help="six-field cron (default: 03:00 daily)")
    schedule.add_argument("--workspace", default="",
                          help="the runs' workspace on the volume (default: the one the package was compiled with)")
    schedule.add_argument("--namespace", default=None, help="KFP namespace (multi-user Kubeflow: your profile's)")
    schedule.add_argument("--experiment", default="gem-refresh")
    schedule.set_defaults(func=_schedule)


def interval(text: str) -> str:
    """``--every``: a positive interval (gem_app.refresh.state.parse_interval), refused by
    argparse before any work."""
    from gem_app.refresh.state import interval as checked

    return checked(text)


def _refresh(args: argparse.Namespace) -> int:
    from gem.data.contract import check_run_inputs
    from gem.errors import UsageError
    from gem_app.pipelines.local import PRESETS
    from gem_app.refresh.cycle import run_cycle
    from gem_app.refresh.state import RefreshConfig, parse_interval, run_every, run_refresh, scheduler_lock

    if args.data is None:
        raise UsageError("--data is required: the dataset that keeps receiving day partitions")
    if args.max_cycles and not args.every:
        raise UsageError("--max-cycles counts the ticks of --every; give --every too")
    params = dict(PRESETS[args.preset])
    params["surfaces"] = [s for s in args.surfaces.split(",") if s]
    # before any work, and again before each pass: the manifest, the surfaces, every day
    # folder a real day inside the manifest's window (a user error: exit 2, one line)
    check_run_inputs(args.data, params["surfaces"])
    workspace = args.workspace.resolve()
    cfg = RefreshConfig(data=str(args.data), state_dir=str(workspace), catch_up=args.catch_up,
                        first_day=args.first_day, late_data=args.late_data).validate()

    def cycle(days, backfill=None):
        return run_cycle(days, data=args.data.resolve(), workspace=workspace, params=params, backfill=backfill)

    def one_pass() -> None:
        check_run_inputs(args.data, params["surfaces"])  # days arrive between ticks
        for result in run_refresh(cfg, cycle):
            print(json.dumps(result, indent=1))

    if not args.every:
        one_pass()  # another refresh running: Busy, a user error (exit 2) naming its pid
        return 0
    with scheduler_lock(workspace):  # one scheduler per workspace: a second is refused, naming the first
        run_every(parse_interval(args.every), one_pass, max_ticks=args.max_cycles or None)
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from gem_app.pipelines.compile import create_recurring_refresh

    if not args.package.is_file():
        print(f"error: {args.package} not found; run `make compile` first", file=sys.stderr)
        return 2
    job = create_recurring_refresh(args.host, args.package, cron=args.cron, workspace=args.workspace,
                                   namespace=args.namespace, experiment=args.experiment)
    print(f"created recurring run {job} ({args.cron}, max_concurrency=1, no_catchup)")
    return 0
