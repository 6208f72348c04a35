"""Scaling curves under the peers' protocol with label-aware histories (issue 26, item 4).

    python -m benchmarks.quality.scaling [--jobs 2] [--parts data,simulator,size]

- ``data`` (MovieLens-1M): every model trained on the newest 12.5 / 25 / 50 / 100% of
  the train window, the validation and test parts fixed, each point selected on
  validation with the protocol's grid and seeds. The 100% point is the rich protocol
  itself, so this run also writes ``peers_protocol_rich``. Per model: test AUC per point
  with the user-bootstrap interval, and the least-squares slope of test AUC against
  log2(train rows) with a bootstrap interval (the same user weights at every point); GEM's
  slope over its DLRM's; GEM minus the best simple baseline (``lr_ids``, ``item_ctr``)
  per point, paired.
- ``simulator``: the simulator's default world (SimulatorConfig: 2,000 users x 5,000
  items x 7 days) at 1x, 4x and 16x its users: events grow with the users while each
  user's behaviour and the catalogue stay as they are. GEM, its DLRM and the simple
  baselines under the same protocol; GEM minus DLRM per scale.
- ``size``: GEM at three sizes (the ``tiny`` preset, ``medium`` and ``wide``: its widths
  doubled and quadrupled) on MovieLens-1M's whole train window, forward FLOPs per
  example at the test rows' mean history length.

Writes ``scaling`` (and ``peers_protocol_rich``) in quality.json, the plot
docs/images/scaling.png, and one MLflow run (experiment ``quality-scaling``) with the
figures as metrics and the plot as an artifact. Every unit (dataset x point) runs the
protocol's cached runs (``--work-dir``), so a rerun only trains what changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

FRACTIONS = (0.125, 0.25, 0.5, 1.0)
SIM_SCALES = (1, 4, 16)
SIM_MODELS = "gem,dlrm_baseline,lr_ids,item_ctr"
SIMPLE = ("lr_ids", "item_ctr")
WIDER = {  # the tiny preset's widths, doubled and quadrupled (the small preset: 50x tiny's FLOPs, ~8x its time)
    "medium": ("embedding_dim=32", "fm_tokens=8", "lcb_tokens=8", "fm_rank=8", "fm_mlp_hidden=128", "head_dim=16",
               "ffn_hidden=64", "trunk_hidden=[128]", "tower_hidden=[64]", "encode_dim=32"),
    "wide": ("embedding_dim=64", "fm_tokens=16", "lcb_tokens=16", "fm_rank=16", "fm_mlp_hidden=256", "num_heads=4",
             "head_dim=16", "ffn_hidden=128", "trunk_hidden=[256]", "tower_hidden=[128]", "encode_dim=64"),
}
SIZES = {"tiny": [], **{name: [a for o in opts for a in ("--model-set", o)] for name, opts in WIDER.items()}}
PLOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "scaling.png"


@dataclasses.dataclass
class Unit:
    part: str  # data | simulator | size
    point: str  # the fraction, the scale or the size
    dataset: str
    argv: list[str]

    @property
    def cost(self) -> float:
        """A rough relative cost, to start the longest units first."""
        if self.part == "data":
            return 10 * float(self.point)
        if self.part == "size":
            return {"tiny": 2.0, "medium": 2.0, "wide": 4.0}[self.point]
        return 0.16 * float(self.point[:-1])


def units(parts: list[str], dataset: str, sim_dirs: dict[int, Path], fractions=FRACTIONS) -> list[Unit]:
    out = []
    if "data" in parts:
        out += [Unit("data", f"{f:g}", dataset, ["--train-newest", f"{f:g}"]) for f in fractions]
    if "size" in parts:  # tiny on the whole window is the data curve's last point
        out += [Unit("size", s, dataset, ["--models", "gem", *SIZES[s]])
                for s in SIZES if s != "tiny" or "data" not in parts]
    if "simulator" in parts:
        out += [Unit("simulator", f"{k}x", str(sim_dirs[k]), ["--models", SIM_MODELS]) for k in sim_dirs]
    return sorted(out, key=lambda u: -u.cost)


def unit_args(unit: Unit, base: list[str]):
    from benchmarks.quality import bench

    parser = bench.build_parser()
    return bench.peers_args(parser.parse_args(["--protocol", "peers", "--datasets", unit.dataset, *base,
                                               *unit.argv]), parser)


def prepare(unit: Unit, base: list[str]) -> None:
    """The unit's dataset and features build, made once before the units run in parallel."""
    from benchmarks.quality import peers

    args = unit_args(unit, base)
    label = Path(unit.dataset).name if Path(unit.dataset).is_dir() else unit.dataset
    peers.prepare(unit.dataset, Path(args.work_dir) / label, max_seq_len=args.max_seq_len, shared=args.shared,
                  fresh=args.fresh, history=args.history, counters=args.counters)


def run_units(todo: list[Unit], base: list[str], jobs: int) -> list[dict]:
    """Every unit's dataset and features build made one at a time (units of one setting
    share a build), then the units, ``jobs`` processes side by side."""
    for unit in todo:
        prepare(unit, base)
    if jobs <= 1:
        return [run_unit((u, base)) for u in todo]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(run_unit, [(u, base) for u in todo]))


def run_unit(job: tuple[Unit, list[str]]) -> dict:
    """One unit in its own process: the protocol on its dataset and point; the figures,
    the test labels, users and predictions (float32), and GEM's FLOPs per example."""
    import torch

    from benchmarks.quality import peers
    from benchmarks.quality.runs import RunCache

    unit, base = job
    args = unit_args(unit, base)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    work = Path(args.work_dir)
    run = peers.evaluate_dataset(unit.dataset, args, work, RunCache(work / "runs"), print)
    out = {"unit": dataclasses.asdict(unit), "figs": run.figs, "sizes": run.sizes,
           "protocol": peers.protocol_description(args), "seconds": time.perf_counter() - started,
           "labels": run.test_labels, "users": run.test_users,
           "predictions": {m: [np.asarray(p, np.float32) for p in ps] for m, ps in run.predictions.items()}}
    if "gem" in run.predictions:
        out["gem_flops_per_example"] = gem_flops(args, unit.dataset, run.sizes)
    return out


def gem_flops(args, dataset: str, sizes: dict) -> float:
    """GEM's forward FLOPs per example at the test rows' mean history length."""
    from gem.features.loader import load_feature_spec
    from gem.model import build_model
    from gem.model.flops import forward_flops_per_example
    from gem.training.config import load_train_config

    label = Path(dataset).name if Path(dataset).is_dir() else dataset
    from benchmarks.quality.peers import features_name

    spec = load_feature_spec(Path(args.work_dir) / label / features_name(args.history, args.counters, args.max_seq_len))
    _, model_cfg = load_train_config(args.train_preset, [f"model_preset={args.model_preset}", "model.arch=gem",
                                                         *[f"model.{o}" for o in args.model_set]])
    model = build_model(model_cfg, spec)
    return float(forward_flops_per_example(model, mean_len=sizes["history_len_mean"]["test"]))


# ---- curves ----

def slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slopes of y (..., P) against x (P,)."""
    xc = x - x.mean()
    return (y - y.mean(axis=-1, keepdims=True)) @ xc / (xc @ xc)


def curve(results: list[dict], replicates: int, seed: int = 0) -> dict:
    """The data curve over units of the same test rows: per model its AUC per point with
    intervals, the slope against log2(train rows), GEM over DLRM, GEM minus the best simple."""
    from students.stats import interval, paired_difference, ratio_of_lifts, user_weights, weighted_auc

    labels, users = results[0]["labels"], results[0]["users"]
    for r in results:
        assert np.array_equal(r["labels"], labels) and np.array_equal(r["users"], users), "test rows differ"
    weights = user_weights(users, n=replicates, seed=seed)
    ones = np.ones((1, len(labels)))
    rows = np.array([r["sizes"]["train_examples_used"] if "train_examples_used" in r["sizes"]
                     else r["sizes"]["train_examples"] for r in results], dtype=float)
    x = np.log2(rows)
    models = [m for m in results[-1]["predictions"] if all(m in r["predictions"] for r in results)]
    out: dict = {"train_rows": rows.astype(int).tolist(), "points": [r["unit"]["point"] for r in results],
                 "models": {}}
    boot: dict[str, np.ndarray] = {}
    for m in models:
        point_auc = np.array([[float(weighted_auc(labels, p, ones)[0]) for p in r["predictions"][m]]
                              for r in results])  # (P, seeds)
        rep = np.stack([np.mean([weighted_auc(labels, p, weights) for p in r["predictions"][m]], axis=0)
                        for r in results], axis=1)  # (R, P): the seed mean per replicate
        boot[m] = slope(x, rep)
        auc = point_auc.mean(axis=1)
        out["models"][m] = {"auc": auc.tolist(), "auc_ci95": [list(interval(rep[:, i])) for i in range(len(results))],
                            "auc_by_seed": point_auc.tolist(), "slope_per_doubling": float(slope(x, auc)),
                            "slope_ci95": list(interval(boot[m])),
                            "selected": [r["figs"][m].get("selected", {}).get("point") for r in results]}
    if "gem" in boot and "dlrm_baseline" in boot:
        g, d = out["models"]["gem"]["slope_per_doubling"], out["models"]["dlrm_baseline"]["slope_per_doubling"]
        # defined only where DLRM's own slope interval is above 0 (students.stats.ratio_of_lifts)
        out["gem_slope_over_dlrm"] = ratio_of_lifts((g, boot["gem"]), (d, boot["dlrm_baseline"]))
        out["gem_minus_dlrm_slope"] = {"mean": g - d, "ci95": list(interval(boot["gem"] - boot["dlrm_baseline"]))}
    simple = [m for m in SIMPLE if m in out["models"]]
    if "gem" in out["models"] and simple:
        gaps = []
        for i, r in enumerate(results):
            best = max(simple, key=lambda m: out["models"][m]["auc"][i])
            gem, other = r["predictions"]["gem"], r["predictions"][best]
            pairs = [(np.arange(len(labels)), labels, p, other[j % len(other)]) for j, p in enumerate(gem)]
            gaps.append({"best_simple": best, **paired_difference(pairs, weights, metric="auc")})
        out["gem_minus_best_simple"] = gaps
        out["gem_minus_best_simple_grows"] = bool(gaps[-1]["mean"] > gaps[0]["mean"])
    deep = [m for m in out["models"] if m not in (*SIMPLE, "gem")]
    if "gem" in out["models"] and deep:  # GEM minus every deep model, paired, at every point
        out["gem_minus"] = {m: [_paired_gap(r, m, labels, weights) for r in results] for m in deep}
        peers = [m for m in deep if m != "dlrm_baseline"]  # DLRM is GEM's own ablation, not a peer
        if peers:
            best = [max(peers, key=lambda m: out["models"][m]["auc"][i]) for i in range(len(results))]
            lead = [{"best_peer": b, **out["gem_minus"][b][i]} for i, b in enumerate(best)]
            out["gem_minus_best_peer"] = lead
            out["gem_lead_does_not_shrink"] = bool(lead[-1]["mean"] >= lead[0]["mean"])
            out["gem_above_every_peer_everywhere"] = all(out["gem_minus"][m][i]["lo"] > 0
                                                          for m in peers for i in range(len(results)))
    return out


def _paired_gap(result: dict, other: str, labels: np.ndarray, weights: np.ndarray) -> dict:
    from students.stats import paired_difference

    gem, them = result["predictions"]["gem"], result["predictions"][other]
    pairs = [(np.arange(len(labels)), labels, p, them[j % len(them)]) for j, p in enumerate(gem)]
    return paired_difference(pairs, weights, metric="auc")


def scale_gaps(results: list[dict], replicates: int) -> dict:
    """Per simulator scale: every model's AUC and GEM minus DLRM, paired."""
    from students.stats import paired_difference, user_weights

    out = {}
    for r in results:
        figs = r["figs"]
        entry = {"train_rows": r["sizes"]["train_examples"], "test_rows": r["sizes"]["test_examples"],
                 "auc": {m: f["auc"] for m, f in figs.items() if isinstance(f, dict) and "auc" in f},
                 "auc_ci95": {m: f["auc_ci95"] for m, f in figs.items() if isinstance(f, dict) and "auc" in f}}
        preds = r["predictions"]
        if "gem" in preds and "dlrm_baseline" in preds:
            weights = user_weights(r["users"], n=replicates, seed=0)
            rows = np.arange(len(r["labels"]))
            pairs = [(rows, r["labels"], g, preds["dlrm_baseline"][i % len(preds["dlrm_baseline"])])
                     for i, g in enumerate(preds["gem"])]
            entry["gem_minus_dlrm_auc"] = paired_difference(pairs, weights, metric="auc")
        out[r["unit"]["point"]] = entry
    return out


def sizes_curve(results: list[dict], replicates: int = 500) -> dict:
    """Per GEM size: FLOPs per example, AUC with its interval, and (from the second size
    on) its AUC minus the smallest size's, paired over the same test rows and seeds."""
    from students.stats import paired_difference, user_weights

    out = {r["unit"]["point"]: {"flops_per_example": r.get("gem_flops_per_example"),
                                "auc": r["figs"]["gem"]["auc"], "auc_ci95": r["figs"]["gem"]["auc_ci95"],
                                "auc_by_seed": r["figs"]["gem"]["auc_by_seed"],
                                "examples_per_s": r["figs"]["gem"]["examples_per_s"]}
           for r in results if "gem" in r["figs"]}
    sized = [r for r in results if "gem" in r.get("predictions", {})]
    if len(sized) > 1:
        base = sized[0]
        weights = user_weights(base["users"], n=replicates, seed=0)
        rows = np.arange(len(base["labels"]))
        for r in sized[1:]:
            assert np.array_equal(r["labels"], base["labels"]), "test rows differ"
            small = base["predictions"]["gem"]
            pairs = [(rows, base["labels"], p, small[i % len(small)]) for i, p in enumerate(r["predictions"]["gem"])]
            out[r["unit"]["point"]][f"auc_minus_{base['unit']['point']}"] = paired_difference(pairs, weights,
                                                                                               metric="auc")
    return out


# ---- the plot ----

def plot(scaling: dict, path: Path, dataset: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("data", "simulator", "size") if scaling.get(k)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, part in zip(axes[0], panels):
        if part == "data":
            d = scaling["data"]
            for m, f in d["models"].items():
                lo, hi = np.array(f["auc_ci95"]).T
                ax.errorbar(d["train_rows"], f["auc"], yerr=[np.array(f["auc"]) - lo, hi - np.array(f["auc"])],
                            marker="o", capsize=3, label=m, lw=2.5 if m == "gem" else 1)
            ax.set_xscale("log", base=2)
            ax.set(title=f"{dataset}: test AUC vs train rows (newest share)", xlabel="train rows",
                   ylabel="test AUC")
        elif part == "simulator":
            s = scaling["simulator"]
            keys = sorted(s, key=lambda k: s[k]["train_rows"])  # a file read back has its keys sorted as text
            rows = [s[k]["train_rows"] for k in keys]
            for m in s[keys[0]]["auc"]:
                auc = [s[k]["auc"][m] for k in keys]
                lo, hi = np.array([s[k]["auc_ci95"][m] for k in keys]).T
                ax.errorbar(rows, auc, yerr=[np.array(auc) - lo, hi - np.array(auc)], marker="o", capsize=3,
                            label=m, lw=2.5 if m == "gem" else 1)
            ax.set_xscale("log", base=2)
            ax.set(title="simulator at 1x / 4x / 16x users", xlabel="train rows", ylabel="test AUC")
        else:
            z = scaling["size"]
            names = sorted(z, key=lambda n: z[n]["flops_per_example"])
            flops = [z[n]["flops_per_example"] for n in names]
            auc = [z[n]["auc"] for n in names]
            lo, hi = np.array([z[n]["auc_ci95"] for n in names]).T
            ax.errorbar(flops, auc, yerr=[np.array(auc) - lo, hi - np.array(auc)], marker="o", capsize=3)
            for n, xv, yv in zip(names, flops, auc):
                ax.annotate(n, (xv, yv), textcoords="offset points", xytext=(5, 5))
            ax.set_xscale("log")
            ax.set(title=f"GEM size on {dataset}", xlabel="forward FLOPs per example", ylabel="test AUC")
        ax.grid(alpha=0.3)
        if part != "size":
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- the driver ----

def simulated(work: Path, scale: int, base_users: int) -> Path:
    """The simulator's default world at ``scale`` times its users (content-keyed reuse)."""
    from benchmarks.results import built
    from gem.data.simulate import SimulatorConfig, simulate

    cfg = SimulatorConfig(users=base_users * scale, workers=1)
    out = work / "simulated" / f"simulator-{scale}x"
    built(out, {"simulator": dataclasses.asdict(cfg)}, lambda o: simulate(cfg, o, progress=False))
    return out


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.quality.bench import RICH_KEY, _read_results, _results_path
    from benchmarks.results import machine_info, work_dir
    from gem.utils.atomic import write_json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="data,simulator,size")
    parser.add_argument("--dataset", default="movielens1m", help="the data and size curves' dataset")
    parser.add_argument("--sim-users", type=int, default=None,
                        help="the simulator's 1x users (default: SimulatorConfig's, 2,000)")
    parser.add_argument("--sim-scales", default=",".join(map(str, SIM_SCALES)))
    parser.add_argument("--fractions", default=",".join(f"{f:g}" for f in FRACTIONS),
                        help="the data curve's newest shares of the train window")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--results-dir", default=None)
    parser.add_argument("--replicates", type=int, default=500, help="bootstrap replicates over test users")
    parser.add_argument("--plot", default=str(PLOT))
    args, passed = parser.parse_known_args(argv)  # any other option goes to every unit (e.g. --seeds 2)
    parts = [p for p in args.parts.split(",") if p]
    work = Path(args.work_dir or work_dir("quality-peers"))
    base = ["--history", "labels", "--grid-history", "on", "--work-dir", str(work),
            "--replicates", str(args.replicates), *passed]
    from gem.data.simulate import SimulatorConfig

    base_users = args.sim_users or SimulatorConfig().users
    sims = {int(k): simulated(work, int(k), base_users) for k in args.sim_scales.split(",")} \
        if "simulator" in parts else {}
    todo = units(parts, args.dataset, sims, [float(f) for f in args.fractions.split(",")])
    started = time.perf_counter()
    done = run_units(todo, base, args.jobs)
    by = {p: [r for r in done if r["unit"]["part"] == p] for p in ("data", "simulator", "size")}
    scaling: dict = {"command": "python -m benchmarks.quality.scaling " + " ".join(argv or []),
                     "units": {r["unit"]["part"] + ":" + r["unit"]["point"]: {
                         "seconds": r["seconds"], "runs": r["sizes"].get("runs")} for r in done}}
    if by["data"]:
        data = sorted(by["data"], key=lambda r: float(r["unit"]["point"]))
        scaling["data"] = curve(data, args.replicates)
        scaling["data"]["dataset"] = Path(args.dataset).name
        tiny = data[-1]
        if tiny["unit"]["point"] == "1" and "size" in parts:  # the size curve's smallest point, not a panel alone
            by["size"] = [{**tiny, "unit": {**tiny["unit"], "point": "tiny"}}] + by["size"]
    if by["simulator"]:
        scaling["simulator"] = scale_gaps(sorted(by["simulator"], key=lambda r: int(r["unit"]["point"][:-1])),
                                          args.replicates)
    if by["size"]:
        scaling["size"] = sizes_curve(sorted(by["size"], key=lambda r: list(SIZES).index(r["unit"]["point"])),
                                      args.replicates)
    scaling["total_seconds"] = time.perf_counter() - started
    scaling["machine"] = machine_info()
    scaling["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    payload = _read_results(args.results_dir)
    payload["scaling"] = scaling
    full = [r for r in by["data"] if r["unit"]["point"] == "1"]
    if full:  # the whole train window is the rich protocol
        r = full[0]
        name = Path(args.dataset).name
        payload[RICH_KEY] = {"datasets": {name: r["figs"]}, "sizes": {name: r["sizes"]},
                             "protocol": r["protocol"], "total_seconds": r["seconds"], "machine": machine_info(),
                             "written_at": scaling["written_at"], "command": scaling["command"]}
    path = _results_path(args.results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(payload, path)
    image = plot(scaling, Path(args.plot), Path(args.dataset).name)
    log_mlflow(scaling, image)
    print_scaling(scaling, path)
    return scaling


def log_mlflow(scaling: dict, image: Path) -> None:
    import mlflow

    from benchmarks.results import bench_tracking

    bench_tracking("quality-scaling")
    with mlflow.start_run(run_name=f"scaling {scaling['written_at']}"):
        for m, f in scaling.get("data", {}).get("models", {}).items():
            mlflow.log_metric(f"slope_per_doubling/{m}", f["slope_per_doubling"])
            for rows, auc in zip(scaling["data"]["train_rows"], f["auc"]):
                mlflow.log_metric(f"test_auc/{m}", auc, step=int(rows))
        for scale, entry in scaling.get("simulator", {}).items():
            if "gem_minus_dlrm_auc" in entry:
                mlflow.log_metric(f"simulator_gem_minus_dlrm_auc/{scale}", entry["gem_minus_dlrm_auc"]["mean"])
        for size, entry in scaling.get("size", {}).items():
            mlflow.log_metric(f"gem_size_auc/{size}", entry["auc"])
        mlflow.log_artifact(str(image))
        mlflow.log_dict({k: v for k, v in scaling.items() if k != "machine"}, "scaling.json")


def print_scaling(scaling: dict, path: Path) -> None:
    print(f"\n== scaling ({path})")
    d = scaling.get("data")
    if d:
        print("train rows:", d["train_rows"])
        for m, f in d["models"].items():
            lo, hi = f["slope_ci95"]
            print(f"  {m:<16} auc {' '.join(f'{a:.4f}' for a in f['auc'])}  slope/doubling "
                  f"{f['slope_per_doubling']:+.4f} [{lo:+.4f}, {hi:+.4f}]")
        for i, gap in enumerate(d.get("gem_minus_best_peer", [])):
            print(f"  gem - best peer ({gap['best_peer']}) at {d['train_rows'][i]:,} rows: {gap['mean']:+.4f} "
                  f"[{gap['lo']:+.4f}, {gap['hi']:+.4f}]")
        ratio = d.get("gem_slope_over_dlrm", {})
        print("  gem slope / dlrm slope:", f"{ratio['mean']:.2f} [{ratio['lo']:.2f}, {ratio['hi']:.2f}]"
              if ratio.get("defined", True) and "mean" in ratio else ratio.get("why", "-"))
    for scale, entry in scaling.get("simulator", {}).items():
        g = entry.get("gem_minus_dlrm_auc")
        if g:
            print(f"  simulator {scale}: gem - dlrm {g['mean']:+.4f} [{g['lo']:+.4f}, {g['hi']:+.4f}]")
    for size, entry in scaling.get("size", {}).items():
        print(f"  gem {size}: {entry['flops_per_example']:.3g} FLOPs/example, auc {entry['auc']:.4f}")


if __name__ == "__main__":
    main()
