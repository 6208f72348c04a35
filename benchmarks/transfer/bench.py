"""The transfer benchmark: the stale-teacher experiment on the simulator (with drift),
MovieLens-100k and Taobao, 3 seeds, plus the serving latency of a student.

`python -m benchmarks.transfer.bench [--preset bench] [--work DIR] [--set KEY=VALUE]`
writes benchmarks/results/transfer.json (see students/report.py for the fields) and
logs everything to one MLflow experiment in ``<work>/mlflow.db``. Datasets whose raw
files are missing are skipped (listed under ``skipped``).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from benchmarks.results import print_table, shared_data, write_result

REAL = {"movielens": "movielens-100k", "taobao": "taobao-userbehavior"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--work", type=Path, default=None, help="keep data, features and mlflow.db here")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for name in ("torchrec", "mlflow", "feast", "fbgemm"):
        logging.getLogger(name).setLevel(logging.ERROR)

    from benchmarks.transfer.experiment import load_experiment_config, run_experiment

    cfg = load_experiment_config(args.preset, args.overrides)
    shared = shared_data()
    skipped = [d.name for d in cfg.datasets
               if d.source in REAL and not d.raw and not (shared / REAL[d.source]).exists()]
    cfg.datasets = [d for d in cfg.datasets if d.name not in skipped]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        payload = run_experiment(cfg, work)
    payload["skipped"] = skipped
    payload["mlflow_experiment"] = cfg.experiment
    sizes = {d.name: {"teacher_periods": d.teacher_periods, "student_periods": d.student_periods,
                      "period_days": d.period_days, **payload["datasets"][d.name]["examples"]}
             for d in cfg.datasets}
    path = write_result("transfer", payload, sizes=sizes)
    rows = [("transfer_ratio (simulator, AUC)", payload["transfer_ratio"]),
            ("student_p99_ms (item table + Feast user + score)", payload["student_p99_ms"]),
            ("student_p99_ms_online_items", payload["student_p99_ms_online_items"]),
            ("feast_sdk_fetch_p99_ms (peer, reads only)", payload["feast_sdk_fetch_p99_ms"]),
            ("student_flops_ratio (max)", payload["student_flops_ratio"])]
    for ds, entry in payload["datasets"].items():
        for method, lifts in entry["methods"].items():
            auc = lifts.get("auc_lift_click", {})
            rows.append((f"{ds}/{method} AUC lift", auc.get("mean")))
    print_table(f"transfer ({path})", rows)


if __name__ == "__main__":
    main()
