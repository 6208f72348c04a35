"""The transfer benchmark: GEM teachers into per-surface students on the simulator (with
drift), MovieLens-100k and Taobao, every arm under one protocol, lifts with paired
bootstrap intervals, the staleness sweep, and the serving latency of a student.

`python -m benchmarks.transfer.bench [--preset bench] [--work DIR] [--set KEY=VALUE]`
(or `python -m benchmarks transfer`) writes benchmarks/results/transfer.json (see
benchmarks/transfer/report.py) and logs the whole experiment to one MLflow experiment.
Datasets whose raw files are missing are skipped (listed under ``skipped``).
``--preset tiny`` is the smoke run (one small simulator world, two arms).
``--section NAME`` writes the run under that key of the result file instead, keeping the
rest of it (``--preset ciao --section ciao``: transfer.json's ``ciao`` section), and
refreshes the file's ``goals`` (benchmarks/transfer/goals.py).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from benchmarks.results import print_table, shared_data, write_result

REAL = {"movielens": "movielens-100k", "taobao": "taobao-userbehavior", "ciao": "ciao"}


def _groups(names: list[str], jobs: int) -> list[list[str]]:
    """The first dataset alone (the simulator: the most work, and the serving run), the
    others round-robin over the remaining jobs."""
    jobs = max(1, min(jobs, len(names)))
    if jobs == 1:
        return [names]
    groups = [[names[0]]] + [[] for _ in range(jobs - 1)]
    for i, name in enumerate(names[1:]):
        groups[1 + i % (jobs - 1)].append(name)
    return groups


def _parallel(args, cfg, work: Path) -> dict:
    """Datasets in ``--jobs`` processes (one torch thread each) under one parent run."""
    import json
    import os
    import subprocess
    import sys
    import time

    import mlflow

    from benchmarks.transfer.experiment import finish, start_parent

    started = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    tracking_uri, parent_id = start_parent(cfg, work)
    groups = _groups([d.name for d in cfg.datasets], args.jobs)
    procs = []
    part_files = [work / f"part-{i}.json" for i in range(len(groups))]
    for part in part_files:
        part.unlink(missing_ok=True)
    # the serving job (the first) measures latency only once the other jobs are done
    others_done = [x for part in part_files[1:] for x in ("--quiet-after", str(part))]
    for i, (group, part) in enumerate(zip(groups, part_files)):
        cmd = [sys.executable, "-m", "benchmarks.transfer.bench", "--preset", args.preset, "--work", str(work),
               "--datasets", ",".join(group), "--parent-run", parent_id, "--part", str(part),
               *[x for o in args.overrides for x in ("--set", o)], *(["--no-latency"] if args.no_latency or i else []),
               *([] if i else others_done)]
        procs.append((part, subprocess.Popen(cmd, env={**os.environ, "GEM_TRANSFER_JOB": "+".join(group)})))
    failed = [" ".join(p.args[-8:]) for _, p in procs if p.wait() != 0]
    if failed:
        mlflow.MlflowClient(tracking_uri).set_terminated(parent_id, "FAILED")
        raise SystemExit(f"transfer: {len(failed)} job(s) failed: {failed}")
    parts = [json.loads(part.read_text()) for part, _ in procs]
    return finish(parent_id, parts, cfg, time.perf_counter() - started)


def write_section(result: str, section: str, payload: dict, sizes: dict) -> Path:
    """``payload`` (with the machine, sizes and time) as ``section`` of ``<result>.json``,
    the file's other keys as they were; ``goals`` recomputed from its simulator and Ciao figures."""
    import json
    import time

    from benchmarks.results import machine_info, results_dir
    from benchmarks.transfer.goals import restated
    from gem.utils.atomic import write_json

    path = results_dir() / f"{result}.json"
    whole = json.loads(path.read_text()) if path.is_file() else {}
    whole[section] = {**payload, "machine": machine_info(), "sizes": sizes,
                      "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    ciao = next((v["datasets"]["ciao"] for v in whole.values() if isinstance(v, dict) and "ciao" in
                 (v.get("datasets") or {})), None)
    whole["goals"] = restated((whole.get("datasets") or {}).get("simulator"), ciao)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(whole, path)
    return path


def main() -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--work", type=Path, default=None,
                        help="keep data, features, teachers here (data and features reused by content)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--no-latency", action="store_true", help="skip the serving benchmark")
    parser.add_argument("--result", default="transfer", help="result name (benchmarks/results/<name>.json)")
    parser.add_argument("--section", default="",
                        help="write the run under this key of the result file, keeping its other keys")
    parser.add_argument("--datasets", default="", help="comma-separated dataset names (default: every one)")
    parser.add_argument("--jobs", type=int, default=2, help="datasets in this many processes (one thread each)")
    parser.add_argument("--parent-run", default="", help=argparse.SUPPRESS)  # a job of --jobs: its parent run
    parser.add_argument("--part", type=Path, default=None, help=argparse.SUPPRESS)  # ... and where its part goes
    parser.add_argument("--quiet-after", type=Path, action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    job = os.environ.get("GEM_TRANSFER_JOB", "")
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {job + ' ' if job else ''}%(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("benchmarks").setLevel(logging.INFO)  # the experiment's progress; the libraries' at WARNING
    for name in ("gem.features", "torchrec", "mlflow"):  # per-window data notes and planner notices, repeated
        logging.getLogger(name).setLevel(logging.ERROR)

    from benchmarks.transfer.experiment import load_experiment_config, run_datasets, run_experiment

    cfg = load_experiment_config(args.preset, args.overrides)
    shared = shared_data()
    skipped = [d.name for d in cfg.datasets
               if d.source in REAL and not d.raw and not (shared / REAL[d.source]).exists()]
    wanted = [d for d in args.datasets.split(",") if d]
    unknown = sorted(set(wanted) - {d.name for d in cfg.datasets})
    if unknown:
        parser.error(f"--datasets {unknown}: the preset has {[d.name for d in cfg.datasets]}")
    cfg.datasets = [d for d in cfg.datasets if d.name not in skipped and (not wanted or d.name in wanted)]
    if args.part:  # one job of a parallel run: its datasets under the given parent run
        from gem.utils.atomic import write_json

        write_json(run_datasets(cfg, args.work, args.parent_run, latency=not args.no_latency,
                                quiet_after=args.quiet_after), args.part)
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).resolve()
        payload = (_parallel(args, cfg, work) if args.jobs > 1 and len(cfg.datasets) > 1
                   else run_experiment(cfg, work, latency=not args.no_latency))
    payload["skipped"] = skipped
    payload["mlflow_experiment"] = cfg.experiment
    payload["preset"] = args.preset
    # what ran it, besides write_result's machine: students and serving run with cfg.threads
    # torch threads per job (the parent's own count says nothing), load averages (1, 5, 15 min)
    payload["run"] = {"jobs": args.jobs if len(cfg.datasets) > 1 else 1, "torch_threads_per_job": cfg.threads,
                      "load_average_before": [round(x, 2) for x in load_before],
                      "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    sizes = {ds: {"period_days": next(d.period_days for d in cfg.datasets if d.name == ds), **entry["sizes"],
                  "worlds": [r["world"] for r in entry["staleness"]]}
             for ds, entry in payload["datasets"].items()}
    path = write_section(args.result, args.section, payload, sizes) if args.section else \
        write_result(args.result, payload, sizes=sizes)
    rows = [("transfer_ratio_combined (simulator, AUC)", payload["transfer_ratio_combined"]),
            ("  note", payload["transfer_ratio_combined_note"] or "defined")]
    for key in sorted(k for k in payload if k.startswith("serving_") and k.endswith("p99_ms")):
        rows.append((key, payload[key]))
    for ds, entry in payload["datasets"].items():
        for arm, a in entry["arms"].items():
            lift = a.get("lift_auc") or {}
            if lift.get("mean") is not None and lift.get("lo") is not None:
                rows.append((f"{ds}/{arm} AUC lift [lo, hi]", f"{lift['mean']:+.4f} [{lift['lo']:+.4f}, "
                                                               f"{lift['hi']:+.4f}]"))
    rows.append(("wall_seconds", payload["wall_seconds"]))
    print_table(f"transfer ({path})", rows)


if __name__ == "__main__":
    main()
