"""Why GEM is or is not ahead under the peers' protocol, before tuning anything (issue 13):
the protocol rerun with one thing changed at a time, for GEM, its DLRM ablation and
``lr_ids``, on the grid point GEM's own selection chose (lr x0.3, history on).

    python -m benchmarks.quality.diagnose [--only no_history,train_fraction_0.5] [--jobs 2]
        [--work-dir DIR] [--from NAME=RESULTS_DIR ...]

| variant | question |
|---|---|
| reference | the point every variant changes (lr x0.3, history on, 2 epochs, embedding_dim 16) |
| no_history | does the label-blind history help at all? (every sequence emptied) |
| train_fraction_0.5, _0.25 | too few examples? (a random share of the train rows) |
| embedding_dim_8, _32 | capacity |
| dropout_0.2, weight_decay_0.1 | regularisation (dropout in GEM's blocks; AdamW decay of the dense part) |
| first_order | is a per-id bias what lr_ids has and GEM lacks? (model option first_order) |

Figures per variant, dataset and model: test AUC (seed mean) with its user-bootstrap
interval, the validation AUC (seed mean), AUC per group of test rows, and GEM minus the
model (paired). They go under ``peers_protocol_diagnostics`` in quality.json, each with
the command that produced it. ``--from NAME=DIR`` takes a variant from a run made
earlier (its DIR/quality.json) instead of running it again.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

MODELS = ("gem", "dlrm_baseline", "lr_ids")
FIXED = ["--protocol", "peers", "--grid-lr-scale", "0.3", "--grid-history", "on"]
VARIANTS = {
    "reference": [],
    "no_history": ["--no-history"],
    "train_fraction_0.5": ["--train-fraction", "0.5"],
    "train_fraction_0.25": ["--train-fraction", "0.25"],
    "embedding_dim_8": ["--model-set", "embedding_dim=8"],
    "embedding_dim_32": ["--model-set", "embedding_dim=32"],
    "dropout_0.2": ["--model-set", "dropout=0.2"],
    "weight_decay_0.1": ["--grid-weight-decay", "0.1"],
    "first_order": ["--model-set", "first_order=true"],
}
KEY = "peers_protocol_diagnostics"
GROUPS = ("auc_new_users", "auc_known_users", "auc_new_items", "auc_known_items")


def command(variant: str, extra: list[str]) -> list[str]:
    return [*FIXED, "--models", ",".join(MODELS), *VARIANTS[variant], *extra]


def summarize(result: dict) -> dict:
    """{dataset: {model: figures}} from a peers' protocol result."""
    out = {}
    for dataset, figs in result["datasets"].items():
        if "skipped" in figs:
            out[dataset] = {"skipped": figs["skipped"]}
            continue
        out[dataset] = {}
        for model in MODELS:
            f = figs.get(model)
            if not isinstance(f, dict) or "auc" not in f:
                continue
            entry = {"auc": f["auc"], "auc_ci95": f["auc_ci95"], "auc_by_seed": f["auc_by_seed"],
                     "val_auc": sum(f["val_auc_by_seed"]) / len(f["val_auc_by_seed"]), "ne": f["ne"],
                     **{g: f[g] for g in GROUPS if g in f}}
            if "gem_minus" in f:
                entry["gem_minus_auc"] = f["gem_minus"]["auc"]
            out[dataset][model] = entry
    return out


def run_variant(variant: str, extra: list[str]) -> dict:
    from benchmarks.quality import bench

    with tempfile.TemporaryDirectory(prefix=f"gem-diagnose-{variant}-") as tmp:
        return bench.main([*command(variant, extra), "--results-dir", tmp])


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.quality.bench import _read_results, _results_path
    from gem.utils.atomic import write_json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help=f"comma-separated variants (default: all of {list(VARIANTS)})")
    parser.add_argument("--from", dest="collected", action="append", default=[], metavar="NAME=DIR",
                        help="take variant NAME from DIR/quality.json (a run made earlier) instead of running it")
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--datasets", default=None)
    parser.add_argument("--seeds", default="3")
    parser.add_argument("--results-dir", default=None)
    args, passed = parser.parse_known_args(argv)  # any other option goes to every run (e.g. --max-epochs 1)
    wanted = [v for v in args.only.split(",") if v] or list(VARIANTS)
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    extra = ["--jobs", args.jobs, "--seeds", args.seeds, *(["--work-dir", args.work_dir] if args.work_dir else []),
             *(["--datasets", args.datasets] if args.datasets else []), *passed]
    sources = dict(item.split("=", 1) for item in args.collected)
    payload = _read_results(args.results_dir)
    diagnostics = payload.get(KEY, {})
    for variant in wanted:
        started = time.perf_counter()
        if variant in sources:  # what that run did is in its own protocol record
            result = json.loads((Path(sources[variant]) / "quality.json").read_text())["peers_protocol"]
            entry = {"collected_from": str(sources[variant]), "written_at": result.get("written_at"),
                     "protocol": result.get("protocol", {})}
        else:
            result = run_variant(variant, extra)
            entry = {"command": "python -m benchmarks.quality.bench " + " ".join(command(variant, extra)),
                     "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "seconds": round(time.perf_counter() - started, 1)}
        diagnostics[variant] = {**entry, "datasets": summarize(result)}
        payload[KEY] = diagnostics
        write_json(payload, _results_path(args.results_dir))  # after every variant: a cut-off run keeps what it has
    print_diagnostics(diagnostics)
    return diagnostics


def print_diagnostics(diagnostics: dict) -> None:
    print(f"\n{'variant':<20} {'dataset':<14} {'model':<14} {'test AUC [95%]':<26} {'val AUC':>8}")
    for variant, entry in diagnostics.items():
        for dataset, models in entry["datasets"].items():
            for model, f in models.items():
                if isinstance(f, dict):
                    lo, hi = f["auc_ci95"]
                    print(f"{variant:<20} {dataset:<14} {model:<14} {f['auc']:.4f} [{lo:.4f}, {hi:.4f}]   "
                          f"{f['val_auc']:.4f}")


if __name__ == "__main__":
    main()
