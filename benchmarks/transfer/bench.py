"""The transfer benchmark: GEM teachers into per-surface students on the simulator (with
drift), MovieLens-100k and Taobao, every arm under one protocol, lifts with paired
bootstrap intervals, the staleness sweep, and the serving latency of a student.

`python -m benchmarks.transfer.bench [--preset bench] [--work DIR] [--set KEY=VALUE]`
(or `python -m benchmarks transfer`) writes benchmarks/results/transfer.json (see
benchmarks/transfer/report.py) and logs the whole experiment to one MLflow experiment.
Datasets whose raw files are missing are skipped (listed under ``skipped``).
``--preset tiny`` is the smoke run (one small simulator world, two arms).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from benchmarks.results import print_table, shared_data, write_result

REAL = {"movielens": "movielens-100k", "taobao": "taobao-userbehavior"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--work", type=Path, default=None, help="keep data, features, teachers here")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--no-latency", action="store_true", help="skip the serving benchmark")
    parser.add_argument("--result", default="transfer", help="result name (benchmarks/results/<name>.json)")
    parser.add_argument("--datasets", default="", help="comma-separated dataset names (default: every one)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("benchmarks").setLevel(logging.INFO)  # the experiment's progress; the libraries' at WARNING

    from benchmarks.transfer.experiment import load_experiment_config, run_experiment

    cfg = load_experiment_config(args.preset, args.overrides)
    shared = shared_data()
    skipped = [d.name for d in cfg.datasets
               if d.source in REAL and not d.raw and not (shared / REAL[d.source]).exists()]
    wanted = [d for d in args.datasets.split(",") if d]
    unknown = sorted(set(wanted) - {d.name for d in cfg.datasets})
    if unknown:
        parser.error(f"--datasets {unknown}: the preset has {[d.name for d in cfg.datasets]}")
    cfg.datasets = [d for d in cfg.datasets if d.name not in skipped and (not wanted or d.name in wanted)]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        payload = run_experiment(cfg, work, latency=not args.no_latency)
    payload["skipped"] = skipped
    payload["mlflow_experiment"] = cfg.experiment
    payload["preset"] = args.preset
    sizes = {ds: {"period_days": next(d.period_days for d in cfg.datasets if d.name == ds), **entry["sizes"],
                  "worlds": [r["world"] for r in entry["staleness"]]}
             for ds, entry in payload["datasets"].items()}
    path = write_result(args.result, payload, sizes=sizes)
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
