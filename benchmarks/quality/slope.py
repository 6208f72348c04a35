"""Why GEM's data slope is what it is (issue 40, item 7): ablations one change at a time.

    python -m benchmarks.quality.slope [--variants reference,counters,...] [--fractions 0.125,1] [--jobs 2]

GEM (and by default its DLRM) on MovieLens-1M under the rich peers' protocol, trained on
the newest share of the train window at each fraction (validation and test fixed), each
point selected on validation (the protocol's grid), once per variant. A variant is one
change against the reference protocol (``VARIANTS``). Per variant and model: validation
and test AUC at each fraction, the slope of test AUC per doubling of train rows with its
bootstrap interval, and the variant's AUC minus the reference's at each fraction, paired
(same test rows and users). Every figure is reported, those that say a change does not
help included; the choice of a change is read on validation, never on test.

Writes ``data_slope_ablations`` in quality.json and prints a table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.quality.scaling import Unit, curve, run_units

# name -> (what changes, the protocol arguments that change it)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "reference": ("the rich protocol as it is: histories of 64, one epoch, lr x{1, 0.3}, no counters", []),
    "counters": ("point-in-time counters on, for every model", ["--counters", "on"]),
    "history_256": ("histories of 256 events instead of 64", ["--max-seq-len", "256"]),
    "epochs_3": ("up to 3 epochs, the best on validation kept (early stopping)", ["--max-epochs", "3"]),
    "lr_x3": ("lr grid x{3, 1, 0.3}: a larger lr for more data is allowed", ["--grid-lr-scale", "3,1,0.3"]),
    "no_history": ("no history at all: the InterFormer sequence part reads nothing", ["--grid-history", "off"]),
    # the tiny model preset the protocol trains already has two InterFormer layers (an
    # "interformer_2" variant of 2026-12-05 changed nothing: identical predictions)
    "interformer_1": ("one InterFormer layer instead of the preset's two", ["--model-set", "num_layers=1"]),
    "wukong_2": ("two Wukong layers per interaction block instead of one", ["--model-set", "wukong_layers=2"]),
}
FRACTIONS = (0.125, 1.0)


def variant_units(dataset: str, variants: list[str], fractions: list[float]) -> list[Unit]:
    out = [Unit("ablation", f"{v}@{f:g}", dataset, ["--train-newest", f"{f:g}", *VARIANTS[v][1]])
           for v in variants for f in fractions]
    return sorted(out, key=lambda u: -float(u.point.split("@")[1]))  # the whole window's units first


def summarize(done: list[dict], replicates: int) -> dict:
    """Per variant: the data curve (test AUC per point, slope), validation AUC per point,
    and its test AUC minus the reference's per point, paired."""
    from students.stats import paired_difference, user_weights

    by: dict[str, list[dict]] = {}
    for r in done:
        variant, fraction = r["unit"]["point"].split("@")
        by.setdefault(variant, []).append({**r, "unit": {**r["unit"], "point": fraction}})
    out: dict = {}
    for variant, results in by.items():
        results = sorted(results, key=lambda r: float(r["unit"]["point"]))
        entry = curve(results, replicates)
        entry["what"] = VARIANTS[variant][0]
        entry["val_auc"] = {m: [float(np.mean(r["figs"][m]["val_auc_by_seed"])) for r in results]
                            for m in entry["models"]}
        out[variant] = entry
    reference = {float(r["unit"]["point"]): r for r in by.get("reference", [])}
    if reference:
        for variant, results in by.items():
            if variant == "reference":
                continue
            diffs = {}
            for r in results:
                base = reference.get(float(r["unit"]["point"]))
                if base is None or not np.array_equal(base["labels"], r["labels"]):
                    continue
                weights = user_weights(r["users"], n=replicates, seed=0)
                rows = np.arange(len(r["labels"]))
                for m in r["predictions"]:
                    if m in base["predictions"]:
                        ref = base["predictions"][m]
                        pairs = [(rows, r["labels"], p, ref[i % len(ref)]) for i, p in enumerate(r["predictions"][m])]
                        diffs.setdefault(m, []).append({"fraction": float(r["unit"]["point"]),
                                                        **paired_difference(pairs, weights, metric="auc")})
            out[variant]["minus_reference"] = diffs
    return out


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.quality.bench import _read_results, _results_path
    from benchmarks.results import machine_info, work_dir
    from gem.utils.atomic import write_json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="movielens1m")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--fractions", default=",".join(f"{f:g}" for f in FRACTIONS))
    parser.add_argument("--models", default="gem,dlrm_baseline")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--results-dir", default=None)
    parser.add_argument("--result-key", default="data_slope_ablations")
    parser.add_argument("--replicates", type=int, default=500)
    args, passed = parser.parse_known_args(argv)  # any other option goes to every unit (e.g. --seeds 1)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    work = Path(args.work_dir or work_dir("quality-peers"))
    # the reference is the data curve's protocol: one epoch (the bench's default is 2), the
    # lr grid x{1, 0.3}; a variant's own arguments come after these and win
    base = ["--history", "labels", "--grid-history", "on", "--max-epochs", "1", "--grid-lr-scale", "1,0.3",
            "--work-dir", str(work), "--models", args.models, "--replicates", str(args.replicates), *passed]
    todo = variant_units(args.dataset, variants, [float(f) for f in args.fractions.split(",") if f])
    started = time.perf_counter()
    done = run_units(todo, base, args.jobs)
    result = {"variants": summarize(done, args.replicates), "dataset": args.dataset,
              "command": "python -m benchmarks.quality.slope " + " ".join(argv or []),
              "units": {r["unit"]["point"]: {"seconds": r["seconds"], "runs": r["sizes"].get("runs")} for r in done},
              "total_seconds": time.perf_counter() - started, "machine": machine_info(),
              "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    payload = _read_results(args.results_dir)
    payload[args.result_key] = result
    path = _results_path(args.results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(payload, path)
    print_summary(result, path)
    return result


def print_summary(result: dict, path: Path) -> None:
    print(f"\n== data-slope ablations ({path})")
    for variant, entry in result["variants"].items():
        for m, f in entry["models"].items():
            lo, hi = f["slope_ci95"]
            val = " ".join(f"{v:.4f}" for v in entry["val_auc"][m])
            print(f"  {variant:<14} {m:<14} val {val}  test {' '.join(f'{a:.4f}' for a in f['auc'])}  "
                  f"slope {f['slope_per_doubling']:+.4f} [{lo:+.4f}, {hi:+.4f}]")


if __name__ == "__main__":
    main()
