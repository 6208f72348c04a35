"""The sequence-length curve (issue 40, item 6): test AUC and training cost of the
sequence models as their histories grow, under the rich peers' protocol.

    python -m benchmarks.quality.lengths [--lengths 16,64,256,1024] [--jobs 2] [protocol options]

Per length L, one unit: the features built with histories of the most recent L events
(``--max-seq-len L``; the FuxiCTR DIN reads the same L items), every model selected on
validation as the protocol does (grid, seeds, budget), the same test rows at every
length. Per model and length: test AUC with its user-bootstrap interval, training
examples/s and forward FLOPs per example (counted on real test rows, the jagged
attention's real work). Per model, the gain from one length to the next, paired (the
same test rows, users and seeds), and GEM's gain minus each peer's from 64 to 256.

Writes ``lengths`` in quality.json (``--result-key``), the plot docs/images/lengths.png,
and prints a table. Units run in parallel processes (``--jobs``), each with the
protocol's run cache, so a rerun trains only what changed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.quality.scaling import Unit, run_units

LENGTHS = (16, 64, 256, 1024)
MODELS = "gem,hstu,bst,fuxictr_din"
PLOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "lengths.png"


def length_units(dataset: str, lengths: list[int]) -> list[Unit]:
    units = [Unit("length", str(n), dataset, ["--max-seq-len", str(n), "--fuxictr-seq-len", str(n)])
             for n in lengths]
    return sorted(units, key=lambda u: -int(u.point))  # the longest first: they take the longest


def length_curve(results: list[dict], replicates: int, seed: int = 0) -> dict:
    """Per model: AUC, interval, examples/s and FLOPs per example at each length; the
    paired gain between consecutive lengths; GEM's gain minus each peer's."""
    from students.stats import interval, paired_difference, user_weights, weighted_auc

    results = sorted(results, key=lambda r: int(r["unit"]["point"]))
    labels, users = results[0]["labels"], results[0]["users"]
    for r in results:
        assert np.array_equal(r["labels"], labels) and np.array_equal(r["users"], users), "test rows differ"
    weights = user_weights(users, n=replicates, seed=seed)
    rows = np.arange(len(labels))
    lengths = [int(r["unit"]["point"]) for r in results]
    models = [m for m in results[0]["predictions"] if all(m in r["predictions"] for r in results)]
    out: dict = {"lengths": lengths, "models": {}}
    reps: dict[str, np.ndarray] = {}
    for m in models:
        per = [np.mean([weighted_auc(labels, p, weights) for p in r["predictions"][m]], axis=0) for r in results]
        reps[m] = np.stack(per, axis=1)  # (R, lengths)
        figs = [r["figs"][m] for r in results]
        out["models"][m] = {
            "auc": [f["auc"] for f in figs], "auc_ci95": [list(interval(reps[m][:, i])) for i in range(len(results))],
            "examples_per_s": [f["examples_per_s"] for f in figs],
            "flops_per_example": [f.get("flops_per_example") for f in figs],
            "history_len_mean": [r["sizes"]["history_len_mean"]["test"] for r in results],
            "selected": [f.get("selected", {}).get("point") for f in figs],
            "gain": [{"from": a, "to": b, **paired_difference(
                [(rows, labels, p, r0["predictions"][m][i % len(r0["predictions"][m])])
                 for i, p in enumerate(r1["predictions"][m])], weights, metric="auc")}
                for (a, r0), (b, r1) in zip(zip(lengths, results), zip(lengths[1:], results[1:]))],
        }
    if "gem" in reps and 64 in lengths and 256 in lengths:
        i, j = lengths.index(64), lengths.index(256)
        gem_gain = reps["gem"][:, j] - reps["gem"][:, i]
        mean = out["models"]["gem"]["auc"][j] - out["models"]["gem"]["auc"][i]
        out["gem_gain_64_256_minus"] = {}
        for m in models:
            if m == "gem":
                continue
            other = reps[m][:, j] - reps[m][:, i]
            diff = mean - (out["models"][m]["auc"][j] - out["models"][m]["auc"][i])
            lo, hi = interval(gem_gain - other)
            out["gem_gain_64_256_minus"][m] = {"mean": float(diff), "lo": float(lo), "hi": float(hi)}
        peers = {m: out["models"][m]["auc"][j] - out["models"][m]["auc"][i] for m in models if m != "gem"}
        if peers:
            best = max(peers, key=peers.get)
            out["best_peer_gain_64_256"] = {"model": best, "gain": peers[best]}
            out["gem_gain_64_256"] = mean
            out["gem_gains_at_least_best_peer"] = bool(mean >= peers[best])
    return out


def plot(curve: dict, path: Path, dataset: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for m, f in curve["models"].items():
        lo, hi = np.array(f["auc_ci95"]).T
        auc = np.array(f["auc"])
        axes[0].errorbar(curve["lengths"], auc, yerr=[auc - lo, hi - auc], marker="o", capsize=3, label=m,
                         lw=2.5 if m == "gem" else 1)
        if all(v for v in f["flops_per_example"]):
            axes[1].plot(f["flops_per_example"], auc, marker="o", label=m, lw=2.5 if m == "gem" else 1)
    axes[0].set(xscale="log", title=f"{dataset}: test AUC vs history length", xlabel="max history events",
                ylabel="test AUC")
    axes[1].set(xscale="log", title="test AUC vs forward FLOPs per example", xlabel="FLOPs per example",
                ylabel="test AUC")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.quality.bench import _read_results, _results_path
    from benchmarks.results import machine_info, work_dir
    from gem.utils.atomic import write_json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="movielens1m")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--results-dir", default=None)
    parser.add_argument("--result-key", default="lengths")
    parser.add_argument("--replicates", type=int, default=500)
    parser.add_argument("--plot", default=str(PLOT))
    args, passed = parser.parse_known_args(argv)  # any other option goes to every unit (e.g. --seeds 1)
    work = Path(args.work_dir or work_dir("quality-peers"))
    base = ["--history", "labels", "--grid-history", "on", "--work-dir", str(work), "--models", args.models,
            "--replicates", str(args.replicates), *passed]
    todo = length_units(args.dataset, [int(n) for n in args.lengths.split(",") if n])
    started = time.perf_counter()
    done = run_units(todo, base, args.jobs)
    curve = length_curve(done, args.replicates)
    curve.update(dataset=Path(args.dataset).name, protocol=done[0]["protocol"],
                 command="python -m benchmarks.quality.lengths " + " ".join(argv or []),
                 units={r["unit"]["point"]: {"seconds": r["seconds"], "runs": r["sizes"].get("runs")} for r in done},
                 total_seconds=time.perf_counter() - started, machine=machine_info(),
                 written_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    payload = _read_results(args.results_dir)
    payload[args.result_key] = curve
    path = _results_path(args.results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(payload, path)
    plot(curve, Path(args.plot), curve["dataset"])
    print_curve(curve, path)
    return curve


def print_curve(curve: dict, path: Path) -> None:
    print(f"\n== history length ({path}); lengths {curve['lengths']}")
    for m, f in curve["models"].items():
        cells = "  ".join(f"{a:.4f} [{lo:.4f},{hi:.4f}] {e:,.0f}/s {fl or 0:.3g}F"
                          for a, (lo, hi), e, fl in zip(f["auc"], f["auc_ci95"], f["examples_per_s"],
                                                         f["flops_per_example"]))
        print(f"  {m:<14} {cells}")
    for m, d in curve.get("gem_gain_64_256_minus", {}).items():
        print(f"  gem gain 64->256 minus {m}'s: {d['mean']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]")


if __name__ == "__main__":
    main()
