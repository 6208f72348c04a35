"""The main job and one refresh cycle, timed by stage (`python -m benchmarks.pipeline_bench`).

1. `python -m gem pipeline run` (the `make run` job: small presets, simulator data cut
   one day short), wall time and seconds per stage (from the stages' MLflow runs), and
   what every task used (CPU, peak memory: benchmarks/pipeline_usage.py) against what the
   compiled pipelines request at their default settings (`usage.*`, `requests.*`);
2. one refresh cycle for the held-back day (continue the champion teacher, regenerate
   knowledge, re-distill, gate, promote), wall time and seconds per stage
   (`--no-refresh` skips it);
3. with `--two-nodes`: the two-"node" TrainJob test (tests/app/cluster), its agreement
   with one process (`two_nodes.*`).
Writes benchmarks/results/pipeline.json (figures of skipped parts are kept from the
previous file).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.results import print_table, write_result
from gem.config import load_config
from gem.data.simulate import SimulatorConfig, simulate
from gem_app.pipelines.local import PRESETS


def stage_seconds(workspace: Path, run_prefix: str) -> dict[str, float]:
    """Seconds per stage of the pipeline run whose id starts with ``run_prefix`` (stage
    runs nested under its parent; fanned-out stages are summed)."""
    import mlflow

    from gem import tracking
    from gem.registry import EXPERIMENT

    tracking.configure(workspace, experiment=EXPERIMENT)
    runs = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list",
                              filter_string=f"tags.`{tracking.TAG_PIPELINE_RUN}` LIKE '{run_prefix}%'")
    totals: dict[str, float] = defaultdict(float)
    for run in runs:
        stage = run.data.tags.get(tracking.TAG_STAGE)
        if stage and run.info.end_time:
            key = stage.split("-")[0] if stage.startswith(("distill", "gate", "promote")) else stage
            totals[key] += (run.info.end_time - run.info.start_time) / 1000
    return dict(sorted(totals.items()))


def usage_figures(tasks) -> dict:
    """Requested (compiled defaults) against used, per component and in total."""
    from benchmarks.pipeline_usage import compare, requested

    table = compare(tasks, requested())
    out = {f"usage.total.{k}": v for k, v in table["total"].items()}
    for name, row in table["per_component"].items():
        out.update({f"usage.{name}.{k}": v for k, v in row.items()})
    return out


def two_node_figures() -> dict:
    """Run the two-node TrainJob test and read the figures it writes."""
    import json

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "two_nodes.json"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/app/cluster/test_trainjob_nodes.py"], check=True,
                       env={**os.environ, "GEM_TWO_NODE_REPORT": str(report)})
        figures = json.loads(report.read_text())
    figures["pytest_seconds"] = time.perf_counter() - started
    return {f"two_nodes.{k}": v for k, v in figures.items() if not isinstance(v, dict)}


def previous_figures() -> dict:
    import json

    from benchmarks.results import results_dir

    path = results_dir() / "pipeline.json"
    if not path.is_file():
        return {}
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in ("machine", "sizes", "written_at")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", choices=("tiny", "small"), default="small")
    parser.add_argument("--no-refresh", action="store_true", help="skip the refresh cycle")
    parser.add_argument("--two-nodes", action="store_true", help="also run the two-node TrainJob test")
    parser.add_argument("--usage-from", type=Path, default=None,
                        help="a `python -m benchmarks.pipeline_usage` file of an earlier make run: recompute the "
                             "requests-vs-use figures (e.g. after changing the defaults) without running it again")
    args = parser.parse_args()
    if args.usage_from:
        from benchmarks.pipeline_usage import load_tasks

        figures = {k: v for k, v in previous_figures().items() if not k.startswith("usage.")}
        figures.update(usage_figures(load_tasks(args.usage_from)))
        if args.two_nodes:
            figures.update(two_node_figures())
        cfg = load_config(SimulatorConfig, section="simulator", preset=PRESETS[args.preset]["sim_preset"])
        return _write(figures, args, cfg)
    from benchmarks.pipeline_usage import summarize, watch
    from gem_app.refresh.cycle import dataset_until, run_cycle

    figures = previous_figures()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = load_config(SimulatorConfig, section="simulator", preset=PRESETS[args.preset]["sim_preset"])
        simulate(cfg, tmp / "incoming", progress=False)
        last = dt.date.fromisoformat(cfg.start_date) + dt.timedelta(days=cfg.days - 1)
        view = dataset_until(tmp / "incoming", last - dt.timedelta(days=1), tmp / "view")
        workspace = tmp / "ws"
        load = os.getloadavg()[0]
        code, tasks, run_seconds = watch([sys.executable, "-m", "gem", "pipeline", "run", "--workspace",
                                          str(workspace), "--data", str(view), "--preset", args.preset])
        if code:
            raise SystemExit(f"the pipeline run failed ({code})")
        figures = {k: v for k, v in figures.items() if not k.startswith(("usage.", "task_cpu_seconds."))}
        figures.update({"make_run_seconds": run_seconds, "goal_make_run_seconds": 600, "meets_goal": run_seconds < 600,
                        "make_run_load_average": load,
                        **{f"stage_seconds.{k}": v for k, v in stage_seconds(workspace, "2").items()},
                        **{f"task_cpu_seconds.{k}": v["cpu_s"] for k, v in summarize(tasks).items()},
                        **usage_figures(tasks)})
        if not args.no_refresh:
            started = time.perf_counter()
            run_cycle([last], data=tmp / "incoming", workspace=workspace, params=dict(PRESETS[args.preset]))
            figures["refresh_cycle_seconds"] = time.perf_counter() - started
            figures.update({f"refresh_stage_seconds.{k}": v for k, v in stage_seconds(workspace, "refresh-").items()})
    if args.two_nodes:
        figures.update(two_node_figures())
    _write(figures, args, cfg)


def _write(figures: dict, args, cfg) -> None:
    path = write_result("pipeline", figures, sizes={
        "preset": args.preset, "users": cfg.users, "days": cfg.days,
        "note": "make run = `python -m gem pipeline run` on days 1..D-1; refresh = one cycle for day D",
        "stage_seconds_note": "seconds of each stage's MLflow run (fanned-out stages summed); features-* covers only "
                              "the finalize step (planning and shard builds are not tracked runs); the rest of "
                              "make_run_seconds is kfp.local task start-up (each task re-imports torch/feast/mlflow) "
                              "and the untracked feature planning/shards",
        "usage_note": "usage.<component>: the largest task of that component in make run (avg_cores = CPU seconds / "
                      "wall seconds; peak_cores over any 1 s; peak_rss_mb = the task's process tree, summed RSS) and "
                      "its request at the compiled defaults (train: the launching task plus the TrainJob's node, "
                      "which together do what the local train task did); usage.total: summed over every task of "
                      "the run (fan-out included); goal: requests <= 2 x use. CPU use reads low on a loaded "
                      "machine (make_run_load_average): each task then gets less than a core",
        "two_nodes_note": "tests/app/cluster/test_trainjob_nodes.py: 2 nodes x 1 process (gloo, row-wise sharded "
                          "sequence tables), node 1 killed after the first checkpoint, both restarted; the model "
                          "against the same command in one process"})
    print_table(f"pipeline ({path})", [(k, v) for k, v in figures.items() if not k.startswith("usage.")
                                       or k.startswith("usage.total.")])


if __name__ == "__main__":
    main()
