"""The whole pipeline's cost as its work grows (`python -m benchmarks scale`).

    python -m benchmarks.scale_bench [--scales 1,4,16] [--features-events 10m,100m] [--data-root DIR]

1. `python -m gem pipeline run --preset small --student-days 1 --holdout-days 1` on the
   small simulator preset at 1x, 4x and 16x its events: the users are scaled (presets
   small / small_x4 / small_x16: 5k, 20k, 80k users), the items (4,000), days (8),
   windows and every model and student preset are the same. Per stage (a kfp.local
   component; fanned-out tasks summed): wall and CPU seconds, peak RSS of its largest
   task (process tree), bytes written; then per stage the log-log slope of wall and CPU
   seconds and of peak RSS against events, and the fixed part of its time (a line
   fitted to seconds = fixed + rate x events).
2. The kfp.local per-task floor: a pipeline of no-op tasks (process start, kfp's
   executor), the import time of each stage's modules in a fresh process, and what
   they are of the 1x run.
3. The features build alone (features preset `default`: N = 1,024; one process by
   default) at 10M events (preset `large`) and 100M (`events_100m`, 1.15M users), in the
   same run: first the validation ingest does (timed apart), then the builds on the
   stamped datasets, each in its own process and the sizes in turn (10M 100M 10M 100M
   10M; the median's figures): seconds per phase, CPU seconds, peak RSS of the build's
   process tree, bytes written; each 100M build over the 10M builds beside it; and one digest
   pass over each dataset (what the reuse key and the validation stamp each cost, now
   taken once per stage).

Simulated data is built under ``--data-root`` (default ``$GEM_SCALE_DATA``, else
``.local_runs/scale``), reused while its config and the code are unchanged; the
100M-event dataset takes ~2.2 GB, ``--drop-data`` removes every dataset at the end.
Writes benchmarks/results/scale.json; every section records the machine, the sizes and
the 1-minute load average before and after it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.results import built, print_table, results_dir, work_dir, write_result
from gem.utils.memory import keep_freed_memory

SCALES = {1: "small", 4: "small_x4", 16: "small_x16"}
FEATURES_EVENTS = {"1m": "events_1m", "10m": "large", "100m": "events_100m"}
# builds per size, interleaved, the median reported: the same code's 10M build has taken
# 24-39 s on this machine and its 100M build 272-321 s; a 100M build takes ~5 min
FEATURES_REPEATS = {"1m": 3, "10m": 3, "100m": 2}
PIPELINE_ARGS = ["--preset", "small", "--student-days", "1", "--holdout-days", "1"]
SLOPE_GOAL = 1.15
TASK_RSS_GOAL_GB = 8.0
NOOP_TASKS = 4


def data_root(arg: str | None) -> Path:
    return Path(arg or os.environ.get("GEM_SCALE_DATA") or work_dir("scale"))


def load() -> float:
    return round(os.getloadavg()[0], 2)


def simulated(root: Path, preset: str, workers: int = 0) -> Path:
    """The simulator preset's dataset under ``root``, reused while its config and the code
    are unchanged (benchmarks.results.built); ``workers`` > 0: that many processes (the
    data does not depend on it; each holds a chunk of users, ~2 GB at the 100M preset)."""
    from gem.config import load_config
    from gem.data.simulate import SimulatorConfig, simulate

    cfg = load_config(SimulatorConfig, section="simulator", preset=preset,
                      overrides=[f"workers={workers}"] if workers else [])
    out = root / f"sim-{preset}"
    built(out, {"simulator": asdict(cfg)}, lambda o: simulate(cfg, o, progress=False))
    return out


def count_events(data: Path) -> int:
    from gem.data.profile import daily_counts

    return int(daily_counts(data).rows.sum())


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) if Path(path).exists() else 0


# -- 1. the whole pipeline at each scale ------------------------------------------------

def pipeline_at(data: Path, workspace: Path, threads: int) -> dict:
    """One `gem pipeline run` watched task by task (benchmarks/pipeline_usage.py), each
    task's torch on ``threads`` threads (0: torch's default, one per core)."""
    from benchmarks.pipeline_usage import watch

    shutil.rmtree(workspace, ignore_errors=True)
    before = load()
    env = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    code, tasks, wall = watch([sys.executable, "-m", "gem", "pipeline", "run", "--workspace", str(workspace),
                               "--data", str(data), *PIPELINE_ARGS], env=env)
    if code:
        raise SystemExit(f"the pipeline run on {data} failed ({code}); its logs: {workspace / 'logs'}")
    outputs = {p.name: dir_bytes(p) for p in sorted(workspace.iterdir()) if p.is_dir()}
    outputs.update({p.name: p.stat().st_size for p in workspace.glob("*.db")})
    return {"wall_s": round(wall, 1), "load_average_1m": {"before": before, "after": load()}, "threads": threads,
            "tasks": len(tasks), "task_wall_s": round(sum(t.wall_s for t in tasks), 1),
            "stages": by_stage(tasks), "output_bytes": outputs}


def by_stage(tasks) -> dict:
    """Per component: tasks, summed wall / CPU seconds and bytes written, the largest
    task's peak RSS (its process tree)."""
    out: dict[str, dict] = {}
    for t in tasks:
        row = out.setdefault(t.component, {"tasks": 0, "wall_s": 0.0, "cpu_s": 0.0, "peak_rss_mb": 0.0,
                                           "write_bytes": 0})
        row["tasks"] += 1
        row["wall_s"] += t.wall_s
        row["cpu_s"] += t.cpu_s
        row["peak_rss_mb"] = max(row["peak_rss_mb"], t.peak_rss_mb)
        row["write_bytes"] += t.write_bytes
    return {name: {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}
            for name, row in sorted(out.items())}


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x); None with fewer than two usable points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx, 3) if sxx else None


def fixed_and_rate(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """y = fixed + rate * x by least squares, fixed and rate kept >= 0."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    rate = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx, 0.0) if sxx else 0.0
    fixed = my - rate * mx
    if fixed < 0:  # through the origin
        fixed, rate = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return fixed, rate


def growth(runs: dict[int, dict]) -> dict:
    """Per stage across the scales: slopes of wall, CPU and peak RSS against events,
    the fixed part of the wall time and its rate per million events, and the goals."""
    scales = sorted(runs)
    events = [runs[s]["events"] for s in scales]
    stages = sorted({name for s in scales for name in runs[s]["pipeline"]["stages"]})
    out = {}
    for name in stages:
        rows = [runs[s]["pipeline"]["stages"].get(name) for s in scales]
        if any(r is None for r in rows):
            continue
        wall, cpu = [r["wall_s"] for r in rows], [r["cpu_s"] for r in rows]
        rss = [r["peak_rss_mb"] for r in rows]
        fixed, rate = fixed_and_rate(events, wall)
        out[name] = {"slope_wall": slope(events, wall), "slope_cpu": slope(events, cpu),
                     "slope_peak_rss": slope(events, rss),
                     "peak_rss_ratio_largest_over_smallest": round(rss[-1] / max(rss[0], 1e-9), 2),
                     "fixed_wall_s": round(fixed, 1), "wall_s_per_million_events": round(rate * 1e6, 1),
                     "fixed_share_at_smallest": round(fixed / max(wall[0], 1e-9), 2)}
        out[name]["meets_slope_goal"] = (out[name]["slope_wall"] or 0) <= SLOPE_GOAL
    whole = [runs[s]["pipeline"]["wall_s"] for s in scales]
    fixed, rate = fixed_and_rate(events, whole)
    out["whole_run"] = {"slope_wall": slope(events, whole), "fixed_wall_s": round(fixed, 1),
                        "wall_s_per_million_events": round(rate * 1e6, 1)}
    return out


# -- 2. the kfp.local per-task floor ----------------------------------------------------

STAGE_IMPORTS = {  # what each task imports before its work (gem_app/components/*.py bodies, stage modules)
    "kfp_executor": "kfp.dsl.executor_main",
    "features_plan / features_shard": "gem_app.stages.features, gem.features.build",
    "features_finalize / feast_materialize": "gem_app.stages.features, gem.features.build, mlflow",
    "train / gate_teacher / knowledge / distill / gate": "gem_app.stages.train, torch, torchrec, mlflow",
    "start_run / promote / summary": "gem_app.stages.context, mlflow",
}


def import_seconds(modules: str, repeats: int = 2) -> float:
    """Best wall seconds of a fresh interpreter importing ``modules`` (start-up included)."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {modules}"], check=True)
        best = min(best, time.perf_counter() - start)
    return round(best, 2)


def noop_task_seconds(tmp: Path) -> float:
    """Wall seconds per task of a kfp.local pipeline of NOOP_TASKS no-op tasks in a row
    (process start, kfp's executor, kfp.local's own bookkeeping), in a fresh process."""
    code = f"""
import time
from kfp import dsl, local
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root={str(tmp)!r}, raise_on_error=True)

@dsl.component(install_kfp_package=False)
def noop(x: int) -> int:
    return x + 1

@dsl.pipeline
def chain():
    t = noop(x=0)
    for _ in range({NOOP_TASKS - 1}):
        t = noop(x=t.output)

chain()  # the first run pays kfp.local's own imports
start = time.perf_counter()
chain()
print(time.perf_counter() - start)
"""
    script = tmp / "noop_pipeline.py"  # a file: kfp reads a component's source with inspect
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the no-op pipeline failed ({out.returncode}): {out.stderr[-2000:]}")
    return round(float(out.stdout.strip().splitlines()[-1]) / NOOP_TASKS, 2)


def floor(tmp: Path, smallest: dict | None) -> dict:
    before = load()
    noop = noop_task_seconds(tmp)
    imports = {name: import_seconds(mods) for name, mods in STAGE_IMPORTS.items()}
    out = {"noop_task_s": noop, "import_s": imports, "noop_tasks_in_chain": NOOP_TASKS,
           "load_average_1m": {"before": before, "after": load()}}
    if smallest:
        run = smallest["pipeline"]
        floor_s = noop * run["tasks"]
        out.update({
            "tasks_at_1x": run["tasks"], "make_run_wall_s_at_1x": run["wall_s"],
            "noop_floor_s_at_1x": round(floor_s, 1),
            "noop_floor_share_of_1x": round(floor_s / run["wall_s"], 3),
            "fixed_part_share_of_1x": round(sum(g["fixed_wall_s"] for n, g in smallest["growth"].items()
                                                if n != "whole_run") / run["wall_s"], 3),
        })
    return out


# -- 3. the features build alone --------------------------------------------------------

class TreeUsage:
    """Peak summed RSS, CPU seconds and bytes written of this process and its
    descendants (each process's last-seen counters), sampled every 0.2 s."""

    def __init__(self, interval: float = 0.2, pid: int | None = None):
        import psutil

        self.proc, self.interval = psutil.Process(pid), interval
        self.peak_rss, self._cpu, self._written = 0, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        import psutil

        total = 0
        try:
            tree = [self.proc, *self.proc.children(recursive=True)]
        except psutil.NoSuchProcess:  # a child's tree, ended: its last-seen counters stand
            return
        for p in tree:
            try:
                total += p.memory_info().rss
                times = p.cpu_times()
                self._cpu[p.pid] = times.user + times.system
                self._written[p.pid] = p.io_counters().write_bytes
            except (psutil.Error, AttributeError):
                pass
        self.peak_rss = max(self.peak_rss, total)

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._sample()
        self._cpu0, self._written0 = sum(self._cpu.values()), sum(self._written.values())
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values()) - self._cpu0

    @property
    def write_bytes(self) -> int:
        return sum(self._written.values()) - self._written0


def validated_for_build(data: Path, out: Path) -> tuple[Path, dict]:
    """``data`` validated as ingest does it, into a stamped copy beside ``out`` that the
    builds read (timed; the caller removes it), and the figures of that pass."""
    from gem.data.validate import validate_dataset
    from gem.utils.digest import tree_digest

    events, data_bytes = count_events(data), dir_bytes(data)
    before = load()
    clean = out.with_name(f"{out.name}-clean")
    with TreeUsage() as validation:
        start = time.perf_counter()
        validate_dataset(data, report_dir=clean.with_name(f"{clean.name}-report"), out=clean)
        validate_s = time.perf_counter() - start
    start = time.perf_counter()
    tree_digest(clean)
    digest_s = time.perf_counter() - start
    return clean, {"validate_s": round(validate_s, 1), "validate_cpu_s": round(validation.cpu_s, 1),
                   "validate_peak_rss_gb": round(validation.peak_rss / 2**30, 2), "events": events,
                   "data_bytes": data_bytes, "digest_pass_s": round(digest_s, 1),
                   "digest_gb_per_s": round(data_bytes / 2**30 / max(digest_s, 1e-9), 2), "load_before": before}


def build_summary(validation: dict, builds: list[dict]) -> dict:
    """The median build's phases (of an even count, the slower middle one), every build's time."""
    median = sorted(builds, key=lambda b: b["build_s"])[len(builds) // 2]
    figures = {k: v for k, v in validation.items() if k != "load_before"}
    return {**figures, **median, "build_s_runs": [b["build_s"] for b in builds],
            "peak_rss_gb": max(b["peak_rss_gb"] for b in builds),
            "events_per_s": round(validation["events"] / median["build_s"]),
            "load_average_1m": {"before": validation["load_before"], "after": load()}}


def interleaved(repeats: dict[str, int]) -> list[str]:
    """Sizes in turn until each has its builds ({10m: 3, 100m: 2}: 10m 100m 10m 100m 10m),
    so a drift in the shared machine's speed falls on both sizes alike."""
    left, order = dict(repeats), []
    while any(left.values()):
        for name in repeats:
            if left[name]:
                order.append(name)
                left[name] -= 1
    return order


def neighbour_ratios(order: list[str], builds: dict[str, list[dict]], big: str, small: str) -> list[float]:
    """Each ``big`` build's time over the mean of the ``small`` builds just before and after it."""
    seen, times = {n: 0 for n in builds}, []
    for name in order:
        times.append((name, builds[name][seen[name]]["build_s"]))
        seen[name] += 1
    ratios = []
    for i, (name, t) in enumerate(times):
        if name == big:
            near = [times[j][1] for j in (i - 1, i + 1) if 0 <= j < len(times) and times[j][0] == small]
            if near:
                ratios.append(round(t / (sum(near) / len(near)), 2))
    return ratios


def build_in_a_fresh_process(data: Path, out: Path, workers: int) -> dict:
    """build_once in a new interpreter, as `gem features build` runs: no imports warmed
    and no memory left by an earlier build or validation in this process (a build of the
    same 100M data ran 15% slower after them), and peak RSS is the build's alone.
    ``process_s``: the child's wall time, interpreter start and imports included."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.scale_bench", "--build-once", str(data), str(out),
                           "--features-workers", str(workers)], stdout=subprocess.PIPE, text=True, check=True)
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": round(time.perf_counter() - start, 1)}


def build_once(data: Path, out: Path, cfg) -> dict:
    """One features build of ``data`` into ``out`` (removed after), its phases timed."""
    from gem.features.build import _workers, finalize_build, prepare_build
    from gem.features.jobs import shard_job
    from gem.features.shards import list_shards
    from gem.utils.pool import process_pool

    shutil.rmtree(out, ignore_errors=True)
    with TreeUsage() as usage:
        start = time.perf_counter()
        plan = prepare_build(data, out, cfg)
        prepared = time.perf_counter()
        keys = list_shards(plan)
        with process_pool(_workers(cfg, len(keys))) as pool:
            list(pool.map(shard_job, [(plan, k) for k in keys]))
        shards_done = time.perf_counter()
        manifest = finalize_build(plan, cfg)
        end = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    return {"examples": manifest["counts"]["examples"], "shards": len(keys), "build_s": round(end - start, 1),
            "prepare_s": round(prepared - start, 1), "shards_s": round(shards_done - prepared, 1),
            "finalize_s": round(end - shards_done, 1), "cpu_s": round(usage.cpu_s, 1),
            "peak_rss_gb": round(usage.peak_rss / 2**30, 2), "write_bytes": usage.write_bytes,
            "output_bytes": manifest["bytes"]["total"]}


def features_section(root: Path, names: list[str], tmp: Path, workers: int) -> dict:
    data = {name: simulated(root, FEATURES_EVENTS[name], workers) for name in names}
    figures = features_builds(data, tmp, workers, {name: FEATURES_REPEATS[name] for name in names})
    return {**figures, "simulator_presets": {n: FEATURES_EVENTS[n] for n in names}}


def features_builds(data: dict[str, Path], tmp: Path, workers: int, repeats: dict[str, int]) -> dict:
    """Each dataset validated once, then its builds taking turns with the others' (each
    build in its own process); per dataset the median build's figures."""
    names = list(data)
    outs = {name: tmp / f"features-{name}" for name in names}
    validated = {name: validated_for_build(data[name], outs[name]) for name in names}
    order = interleaved(repeats)
    builds: dict[str, list[dict]] = {name: [] for name in names}
    for name in order:
        builds[name].append(build_in_a_fresh_process(validated[name][0], outs[name], workers))
    for clean, _ in validated.values():
        shutil.rmtree(clean, ignore_errors=True)
    runs = {name: build_summary(validated[name][1], builds[name]) for name in names}
    print_table("features build alone: median build s (runs)",
                [(n, f"{r['build_s']} {r['build_s_runs']}") for n, r in runs.items()])
    out: dict = {"runs": runs, "features_preset": "default", "max_seq_len": 1024, "workers": workers,
                 "build_order": order}
    if "10m" in runs and "100m" in runs:
        small, big = runs["10m"], runs["100m"]
        ratio = big["build_s"] / small["build_s"]
        out.update({"time_ratio_100m_over_10m": round(ratio, 2),
                    "time_ratio_each_100m_build_over_its_neighbour_10m_builds": neighbour_ratios(
                        order, builds, "100m", "10m"),
                    "events_ratio_100m_over_10m": round(big["events"] / small["events"], 2),
                    "slope_build_s": slope([small["events"], big["events"]], [small["build_s"], big["build_s"]]),
                    "goals": {"peak_rss_100m_under_16gb": big["peak_rss_gb"] < 16,
                              "time_100m_within_10x_of_10m": ratio <= 10}})
    return out


def feast_alone(data: Path, out: Path) -> dict:
    """The feast_materialize stage's two halves as a user runs them, each in its own
    process (`gem features feast-apply`, then `gem features materialize` up to the
    window's end) on the validated ``data``: seconds, CPU seconds, peak RSS of each."""
    from gem.data.contract import DatasetHandle
    from gem.data.validate import validate_dataset
    from gem.features.feast_repo import DEFAULT_REPO

    clean, repo = out / "clean", out / "repo"
    validate_dataset(data, report_dir=out / "report", out=clean)
    shutil.copytree(DEFAULT_REPO, repo, ignore=shutil.ignore_patterns("data", "__pycache__"))  # as a clone has it
    end = DatasetHandle.open(clean).manifest.window_end
    before, figures = load(), {"events": count_events(clean)}
    steps = {"feast_apply": ["feast-apply", "--data", str(clean)], "materialize": ["materialize", "--end", end]}
    for step, args in steps.items():
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "gem", "features", *args, "--repo", str(repo)],
                                 stdout=subprocess.DEVNULL)
        with TreeUsage(pid=child.pid) as usage:
            if child.wait() != 0:
                raise RuntimeError(f"gem features {args[0]} failed on {clean} (exit {child.returncode})")
        figures[step] = {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(usage.cpu_s, 1),
                         "peak_rss_mb": round(usage.peak_rss / 2**20)}
    shutil.rmtree(out, ignore_errors=True)
    return {**figures, "load_average_1m": {"before": before, "after": load()}}


def feast_section(root: Path, scales: list[int], tmp: Path) -> dict:
    runs = {scale: feast_alone(simulated(root, SCALES[scale]), tmp / f"feast-x{scale}") for scale in scales}
    out: dict = {"runs": {f"x{k}": v for k, v in runs.items()}}
    if len(runs) > 1:
        events = [r["events"] for r in runs.values()]
        out["slopes"] = {f"{step}_{what}": slope(events, [r[step][what] for r in runs.values()])
                         for step in ("feast_apply", "materialize") for what in ("wall_s", "peak_rss_mb")}
    shown = {k: {step: f"{r[step]['wall_s']} s {r[step]['peak_rss_mb']} MiB" for step in ("feast_apply", "materialize")}
             for k, r in runs.items()}
    print_table("feast apply, materialize alone", [(f"x{k}", f"{v['feast_apply']}, {v['materialize']}")
                                                    for k, v in shown.items()])
    return out


# -- the run ----------------------------------------------------------------------------

SIZES = {
    "pipeline": "python -m gem pipeline run " + " ".join(PIPELINE_ARGS) + " on the simulator presets "
                + ", ".join(f"x{s}: {p}" for s, p in SCALES.items())
                + " (users scaled; items 4,000, 8 days, windows, model and student presets fixed)",
    "features": "gem.features.build at features preset default (max_seq_len 1,024) on "
                + ", ".join(f"{n}: {p}" for n, p in FEATURES_EVENTS.items()),
    "load_note": "2-core machine shared with other jobs: each section records the 1-minute load average "
                 "before and after; > 2 means contention"}


def pipeline_figures(runs: dict[int, dict]) -> dict:
    """The runs so far, and with two or more their growth and the goals."""
    runs = dict(sorted(runs.items()))
    pipeline: dict = {"runs": {f"x{s}": r for s, r in runs.items()}}
    if len(runs) > 1:
        pipeline["growth"] = growth(runs)
        largest = runs[max(runs)]["pipeline"]["stages"]
        worst = max(largest.items(), key=lambda kv: kv[1]["peak_rss_mb"])
        pipeline["goals"] = {
            "every_stage_slope_at_most_1_15": all(g.get("meets_slope_goal", True)
                                                  for g in pipeline["growth"].values()),
            "largest_task_peak_rss_gb_at_largest_scale": round(worst[1]["peak_rss_mb"] / 1024, 2),
            "largest_task_at_largest_scale": worst[0],
            "task_peak_rss_under_8gb": worst[1]["peak_rss_mb"] / 1024 < TASK_RSS_GOAL_GB}
    return pipeline


def previous() -> dict:
    path = results_dir() / "scale.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", default="1,4,16", help="comma-separated multiples of the small preset ('' skips)")
    parser.add_argument("--features-events", default="10m,100m",
                        help=f"features build alone at these sizes, of {sorted(FEATURES_EVENTS)} ('' skips)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every pipeline task (OMP_NUM_THREADS; 0: one per core). Default 1: "
                             "on this shared 2-core machine two threads under a load of 8 trained 2x slower than one")
    parser.add_argument("--features-workers", type=int, default=1,
                        help="processes of the features build alone and of its simulation (0: one per core); "
                             "default 1: one process, so memory and time do not depend on the machine's other jobs")
    parser.add_argument("--feast-scales", default="1,4,16",
                        help="Feast export+apply and materialize alone, each in its own process, at these multiples "
                             "('' skips)")
    parser.add_argument("--no-floor", action="store_true", help="skip the kfp.local floor section")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--drop-data", action="store_true", help="delete the simulated datasets at the end")
    parser.add_argument("--build-once", nargs=2, metavar=("DATA", "OUT"),
                        help="internal: one timed features build, its figures printed as JSON")
    args = parser.parse_args(argv)
    keep_freed_memory()  # as `gem features build` sets it (gem.utils.memory)
    if args.build_once:
        from gem.config import load_config
        from gem.features.config import FeaturesConfig

        cfg = load_config(FeaturesConfig, section="features", preset="default",
                          overrides=[f"workers={args.features_workers}"])
        print(json.dumps(build_once(Path(args.build_once[0]), Path(args.build_once[1]), cfg)))
        return 0
    root = data_root(args.data_root)
    root.mkdir(parents=True, exist_ok=True)
    scales = [int(s) for s in args.scales.split(",") if s]
    feast_scales = [int(s) for s in args.feast_scales.split(",") if s]
    unknown = [s for s in scales + feast_scales if s not in SCALES]
    unknown += [n for n in args.features_events.split(",") if n and n not in FEATURES_EVENTS]
    if unknown:
        parser.error(f"unknown scale(s) or size(s) {unknown}: scales {sorted(SCALES)}, sizes {sorted(FEATURES_EVENTS)}")
    figures = {k: v for k, v in previous().items() if k not in ("machine", "sizes", "written_at")}
    started = time.perf_counter()

    def save() -> Path:  # after every part: a later part's failure keeps what was measured
        figures["bench_wall_s"] = round(time.perf_counter() - started, 1)
        return write_result("scale", figures, sizes=SIZES)

    tmp = Path(tempfile.mkdtemp(prefix="scale-bench-", dir=root))
    try:
        if scales:
            # runs of other scales kept from the previous file (each records its time and load)
            runs = {int(k[1:]): v for k, v in figures.get("pipeline", {}).get("runs", {}).items()}
            for scale in scales:
                data = simulated(root, SCALES[scale])
                runs[scale] = {"simulator_preset": SCALES[scale], "events": count_events(data),
                               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "pipeline": pipeline_at(data, tmp / f"ws-x{scale}", args.threads)}
                shutil.rmtree(tmp / f"ws-x{scale}", ignore_errors=True)
                print_table(f"scale x{scale}: {runs[scale]['events']:,} events, {runs[scale]['pipeline']['wall_s']} s",
                            [(k, v["wall_s"]) for k, v in runs[scale]["pipeline"]["stages"].items()])
                figures["pipeline"] = pipeline_figures(runs)
                save()
        if not args.no_floor:
            smallest = None
            if figures.get("pipeline", {}).get("growth") and "x1" in figures["pipeline"]["runs"]:
                smallest = {**figures["pipeline"]["runs"]["x1"], "growth": figures["pipeline"]["growth"]}
            figures["floor"] = floor(tmp, smallest)
            save()
        if feast_scales:
            figures["feast_materialize_alone"] = feast_section(root, feast_scales, tmp)
            save()
        names = [n for n in args.features_events.split(",") if n]
        if names:
            figures["features"] = features_section(root, names, tmp, args.features_workers)
            save()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if args.drop_data:
            for path in root.glob("sim-*"):
                shutil.rmtree(path, ignore_errors=True)
            for path in root.glob(".sim-*.built.json"):
                path.unlink()
    path = save()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
