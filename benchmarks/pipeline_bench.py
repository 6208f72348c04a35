"""The main job and one refresh cycle, timed by stage (`python -m benchmarks.pipeline_bench`).

1. `python -m gem pipeline run` (the `make run` job: small presets, simulator data cut
   one day short), wall time and seconds per stage (from the stages' MLflow runs);
2. one refresh cycle for the held-back day (continue the champion teacher, regenerate
   knowledge, re-distill, gate, promote), wall time and seconds per stage.
Writes benchmarks/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.results import print_table, write_result
from gem.config import load_config
from gem.data.simulate import SimulatorConfig, simulate


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", choices=("tiny", "small"), default="small")
    args = parser.parse_args()
    from gem_app.pipelines.local import PRESETS
    from gem_app.refresh.cycle import dataset_until, run_cycle

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = load_config(SimulatorConfig, section="simulator", preset=PRESETS[args.preset]["sim_preset"])
        simulate(cfg, tmp / "incoming", progress=False)
        last = dt.date.fromisoformat(cfg.start_date) + dt.timedelta(days=cfg.days - 1)
        view = dataset_until(tmp / "incoming", last - dt.timedelta(days=1), tmp / "view")
        workspace = tmp / "ws"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gem", "pipeline", "run", "--workspace", str(workspace),
                        "--data", str(view), "--preset", args.preset], check=True)
        run_seconds = time.perf_counter() - started
        main_stages = stage_seconds(workspace, "2")  # the run id is a UTC timestamp
        started = time.perf_counter()
        run_cycle([last], data=tmp / "incoming", workspace=workspace, params=dict(PRESETS[args.preset]))
        refresh_seconds = time.perf_counter() - started
        refresh_stages = stage_seconds(workspace, "refresh-")
    figures = {"make_run_seconds": run_seconds, "refresh_cycle_seconds": refresh_seconds,
               "goal_make_run_seconds": 600, "meets_goal": run_seconds < 600,
               **{f"stage_seconds.{k}": v for k, v in main_stages.items()},
               **{f"refresh_stage_seconds.{k}": v for k, v in refresh_stages.items()}}
    path = write_result("pipeline", figures, sizes={
        "preset": args.preset, "users": cfg.users, "days": cfg.days,
        "note": "make run = `python -m gem pipeline run` on days 1..D-1; refresh = one cycle for day D",
        "stage_seconds_note": "seconds of each stage's MLflow run (fanned-out stages summed); features-* covers only "
                              "the finalize step (planning and shard builds are not tracked runs); the rest of "
                              "make_run_seconds is kfp.local task start-up (each task re-imports torch/feast/mlflow) "
                              "and the untracked feature planning/shards"})
    print_table(f"pipeline ({path})", list(figures.items()))


if __name__ == "__main__":
    main()
