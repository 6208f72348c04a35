"""`python -m gem distill`: per-surface students from a frozen GEM's knowledge, through
the same stage function the pipeline runs (gem_app/stages/distill.py).

    python -m gem distill --train features/student --eval features/holdout \\
        --repo feast_repo/ --teacher models:/gem_teacher@champion --out runs/students \\
        --set transfer.adapter.weight=0.5 --set transfer.representation.enabled=true

Reads the teacher's knowledge point-in-time from the Feast repo (registered with
``gem knowledge``), trains the transfer student and the no-teacher student of each
surface, scores both on ``--eval``, and registers the transfer student as a new version
of ``student_<surface>`` tagged with its teacher. The stale-teacher transfer experiment
is a benchmark: ``python -m benchmarks transfer``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("distill", help="distill GEM into per-surface vertical models",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True, type=Path, help="features directory of the student window")
    parser.add_argument("--eval", required=True, type=Path, help="features directory the students are scored on")
    parser.add_argument("--repo", required=True, type=Path, help="Feast repo holding the teacher's knowledge")
    parser.add_argument("--teacher", required=True, help="teacher URI: models:/gem_teacher@champion, runs:/..., folder")
    parser.add_argument("--out", required=True, type=Path, help="output folder (one <surface>.json each, mlflow.db)")
    parser.add_argument("--surfaces", default="", help="comma-separated surfaces (default: every surface of --train)")
    parser.add_argument("--preset", default="default", help="gem/configs/students/<preset>.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from gem.data.contract import check_run_inputs
    from gem.errors import UsageError
    from gem.features.loader import read_manifest
    from gem_app.stages.context import RunContext
    from gem_app.stages.distill import distill, distill_plan
    from students.protocol import check_windows

    train, evaluation = read_manifest(args.train), read_manifest(args.eval)  # both finished windows
    available = train["dataset"]["surfaces"]
    wanted = [s for s in args.surfaces.split(",") if s] or available
    check_run_inputs(None, wanted)  # names that become files and MLflow names: safe, before any work
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        raise UsageError(f"--surfaces: {unknown} not in {args.train}; it has {sorted(available)}")
    try:
        check_windows({name: (m["window"]["start"], m["window"]["end"]) for name, m in
                       (("--train", train), ("--eval", evaluation))})
    except ValueError as exc:
        raise UsageError(f"{exc}: the students would be scored on examples they trained on; give an --eval "
                         "window after the --train one") from None
    jobs = distill_plan("", wanted, available)
    run_id = dt.datetime.now(dt.timezone.utc).strftime("distill-%Y%m%dT%H%M%S%f")
    ctx = RunContext(pipeline_run_id=run_id, tracking_root=str(args.out.resolve()))
    summary = {}
    for job in jobs:
        result = distill(job["surface"], str(args.train), str(args.eval), str(args.repo), args.teacher,
                         str(args.out), ctx, preset=args.preset, overrides=args.overrides)
        summary[result.surface] = {"version": result.version, "metrics": result.metrics, "lift": result.lift}
    print(json.dumps(summary, indent=2, default=str))
    return 0

