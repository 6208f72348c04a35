"""`python -m gem pipeline ...`: run gem_pipeline locally through kfp.local, or compile
both pipelines to IR YAML with cluster settings.

    python -m gem pipeline run                      # simulator data, small presets
    python -m gem pipeline run --data DIR --workspace runs/mine
    python -m gem pipeline run --data DIR --cut 2026-01-06 --cut 2026-01-07   # explicit windows
    python -m gem pipeline compile --out pipelines/compiled
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from gem.config import count, iso_time
from gem.errors import UserError

log = logging.getLogger(__name__)


def overlap_days(text: str) -> int:
    """``all`` (the teacher window's every day) or an integer >= 0."""
    from gem.protocol import ALL_TEACHER_DAYS

    if text.strip().lower() == "all":
        return ALL_TEACHER_DAYS
    try:
        return count(0)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not 'all' or an integer >= 0") from None


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("pipeline", help="run or compile the end-to-end pipeline", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="pipeline_command", metavar="ACTION", required=True)
    run = actions.add_parser("run", help="run gem_pipeline locally (kfp.local, MLflow sqlite, Feast duckdb/sqlite)")
    run.add_argument("--workspace", type=Path, default=Path("runs/main"), help="run folder (data, models, mlflow.db)")
    run.add_argument("--data", default="", help="a contract dataset (default: simulate one)")
    run.add_argument("--preset", choices=("tiny", "small"), default="small",
                     help="sizes of every stage: tiny (seconds, tests) or small (the default main job)")
    run.add_argument("--surfaces", default="", help="comma-separated surfaces (default: every surface the data has)")
    run.add_argument("--cut", action="append", default=[], metavar="ISO", type=iso_time,
                     help="twice: the teacher window ends at the first cut point, the students' at the second "
                          "(the holdout runs to the data's end); default: the last days (below)")
    run.add_argument("--student-days", type=count(0), default=0,
                     help="days of the students' window (default 0: chosen by evidence, see --evidence)")
    run.add_argument("--holdout-days", type=count(0), default=0,
                     help="days of the holdout window, the last (default 0: chosen by evidence)")
    run.add_argument("--student-overlap-days", type=overlap_days, default=None, metavar="N|all",
                     help="the students also train on the teacher window's last N days (default all: its every "
                          "day; 0: only their own window); validation and the adapter keep to the days after "
                          "the teacher's")
    run.add_argument("--evidence", action="append", default=[], metavar="KEY=VALUE",
                     help="what a window chosen by evidence must hold (gem.protocol.Evidence): examples=200, "
                          "positives=30 per surface, min_share=0, max_share=0.25 of the log per window")
    run.add_argument("--gate", action="append", default=[], metavar="KEY=VALUE",
                     help="a promotion gate setting (gem_app/promotion.py GateConfig), e.g. min_positives=50 or "
                          "max_ne=0.98; see docs/pipelines.md, Promotion gate")
    run.set_defaults(func=_run)
    comp = actions.add_parser("compile", help="compile gem_pipeline and refresh_pipeline to IR YAML")
    comp.add_argument("--out", type=Path, default=Path("pipelines/compiled"))
    comp.add_argument("--image", default="", help="project image of every component (default $GEM_IMAGE or gem:latest)")
    comp.add_argument("--mlflow-uri", default="", help="tracking server the cluster tasks log to")
    comp.add_argument("--cluster-config", default=None,
                      help="YAML of compile options (ClusterSettings fields, e.g. deploy/cluster-settings.yaml)")
    comp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="one compile option, e.g. resources.shard.cpu=250m or pretrain_launcher=trainjob:2:8")
    comp.set_defaults(func=_compile)


def _run(args: argparse.Namespace) -> int:
    from gem_app.pipelines.local import PRESETS, run_gem_pipeline

    params = dict(PRESETS[args.preset])
    params["data"] = str(Path(args.data).resolve()) if args.data else ""
    params["surfaces"] = [s for s in args.surfaces.split(",") if s]
    if args.cut and len(args.cut) != 2:
        print(f"error: --cut twice (teacher end, student end), got {args.cut}", file=sys.stderr)
        return 2
    from gem.data.contract import check_run_inputs

    check_run_inputs(params["data"], params["surfaces"])  # before any work: a ContractError exits 2
    if args.cut and params["data"]:
        from gem.protocol import cut_windows

        cut_windows(params["data"], list(args.cut))  # increasing, inside the data's window: else exit 2 here
    if args.gate:
        from gem_app.promotion import GateConfig

        try:
            settings = {**params.get("gate_settings", {}), **dict(item.split("=", 1) for item in args.gate)}
            GateConfig.from_dict(settings)  # over the preset's
        except ValueError as exc:
            print(f"error: --gate {' '.join(args.gate)}: {exc} (give KEY=VALUE)", file=sys.stderr)
            return 2
        params["gate_settings"] = settings
    if args.student_overlap_days is not None:
        params["student_overlap_days"] = args.student_overlap_days
    if args.cut:
        params["cuts"] = list(args.cut)
    else:
        params["student_days"], params["holdout_days"] = args.student_days, args.holdout_days
    if args.evidence:
        from gem.protocol import Evidence

        try:
            evidence = dict(item.split("=", 1) for item in args.evidence)
            Evidence.from_dict({**params.get("window_evidence", {}), **evidence})
        except ValueError as exc:
            print(f"error: --evidence {' '.join(args.evidence)}: {exc} (give KEY=VALUE)", file=sys.stderr)
            return 2
        params["window_evidence"] = {**params.get("window_evidence", {}), **evidence}
    if params["data"] and params["surfaces"]:  # before any work: a surface the data lacks
        from gem.data.profile import SurfaceError
        from gem_app.stages.ingest import check_surfaces

        try:
            check_surfaces(params["data"], params["surfaces"])
        except SurfaceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    workspace = Path(args.workspace).resolve()
    print(f"gem pipeline: {params['data'] or 'simulator data (' + params['sim_preset'] + ')'} -> {workspace}"
          f"  (each step's log: {workspace / 'logs'})", flush=True)
    started = time.perf_counter()
    try:
        run_gem_pipeline(args.workspace, **params)
    except UserError:  # another run holds the workspace (Busy), a step refused its input: exit 2, naming it
        raise
    except RuntimeError as exc:  # a task failed: its last lines are already on stderr
        print(f"error: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    print()
    print((workspace / "summary.md").read_text())
    print(f"pipeline finished in {seconds:.0f} s; summary: {workspace / 'summary.json'}")
    print(f"open the results:  .venv/bin/mlflow ui --backend-store-uri sqlite:///{workspace / 'mlflow.db'}")
    print(f"then the runs:     {_runs_link(workspace)}")
    (workspace / "run.json").write_text(json.dumps({"seconds": seconds, "params": params}, indent=2))
    return 0


def _runs_link(workspace: Path) -> str:
    """The pipeline experiment's runs in the UI's model-training view."""
    import mlflow

    from gem import registry, tracking

    tracking.configure(workspace, experiment=registry.EXPERIMENT)
    return tracking.ui_link(mlflow.get_experiment_by_name(registry.EXPERIMENT).experiment_id)


def _compile(args: argparse.Namespace) -> int:
    from gem_app.pipelines.compile import compile_all

    for path in compile_all(args.out, image=args.image or None, mlflow_uri=args.mlflow_uri or None,
                            cluster_config=args.cluster_config, overrides=args.overrides):
        print(f"wrote {path}")
    return 0
