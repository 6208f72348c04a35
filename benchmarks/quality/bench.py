"""Quality benchmark: GEM against simpler and published CTR models on one time split.

`python -m benchmarks.quality.bench [--datasets simulator,movielens100k,taobao] [--models ...]`
(or `python -m benchmarks quality`) writes benchmarks/results/quality.json:
``{dataset: {model: {"auc", "ne", "examples_per_s", ...}}}`` for the click task (and
``conversion_auc``/``conversion_ne`` where a model gives it), plus the split sizes.

Per dataset, every model trains on the same examples and is scored on the same held-out
examples: the last UTC day(s) of the dataset, as few as hold >= ``--eval-frac`` of the ad
impressions (the last day on the simulator and Taobao; on MovieLens, whose ratings are
spread thin over months, the last few weeks). Both windows are features builds of the
same dataset (`build_features` with a train window and an eval window; the eval build
reuses the train build's vocabularies, so ids unseen in training map to 0).

Models: ``gem`` and ``dlrm_baseline`` (gem.training.trainer.train_and_evaluate),
``fuxictr_wukong`` and ``fuxictr_din`` (FuxiCTR layers, see gem/baselines.py),
``lr_ids`` (logistic regression on one-hot user and item ids) and ``item_ctr``
(smoothed per-item click rate). NE = log loss / entropy of the held-out base rate
(lower is better; 1.0 is the constant base-rate predictor). ``examples_per_s`` is
training throughput (examples processed per second of training, all epochs).

Training: one pass over the training window for every trained model (``--epochs 1``;
deep CTR models over-fit from their second pass over the same examples). GEM and DLRM
read it day by day, oldest first, shuffled within each day (the trainer's
``shard_order="time"``), so that each model ends on the freshest day as it would on the
live stream, and decaying the dense lr on a cosine to the last step (the train preset's
``optim.lr_decay``). The FuxiCTR models train as FuxiCTR does, on examples shuffled over
the whole window with a constant-lr Adam (they scored lower in the day order). Models trained
from a random init run once per seed (``--seeds``, default 3); their figures are the
means over seeds, with ``*_std`` the spread and ``auc_by_seed``/``ne_by_seed``.
``gem_vs_dlrm_by_surface`` compares the seed means per surface.
Real datasets under ../shared/data are skipped, with the reason recorded, when absent.

``--protocol peers`` runs the peers' protocol instead (benchmarks/quality/peers.py): a
global time split at the 0.8 / 0.9 quantiles of example time (or an explicit split:
``--cut ISO --cut ISO`` or ``--split-file ids.parquet`` with columns example_id, part),
label-blind histories, Taobao with its honest label times, every model on the same train
rows with selection on the validation part, test AUC with user-bootstrap intervals. Its
figures go under the ``peers_protocol`` key of quality.json, beside today's protocol
(each protocol's run keeps the other's figures).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from benchmarks.results import bench_tracking, log_comparison_run, print_table, shared_data, write_result

SHARED = shared_data()
DATASETS = ("simulator", "movielens100k", "taobao")
MODELS = ("item_ctr", "lr_ids", "dlrm_baseline", "gem", "fuxictr_din", "fuxictr_wukong")
SEEDED = ("dlrm_baseline", "gem", "fuxictr_din", "fuxictr_wukong")  # trained from a random init
TASKS = ("click", "conversion")

log = logging.getLogger("quality")


# ---- data ----

def make_dataset(name: str, out: Path, *, sim_users: int = 12000, sim_items: int = 5000, sim_days: int = 8) -> str:
    """Write the contract dataset ``name`` under ``out``; returns "" or why it was skipped."""
    if name == "simulator":
        from gem.data.simulate import SimulatorConfig, simulate

        simulate(SimulatorConfig(users=sim_users, items=sim_items, days=sim_days, seed=0, workers=1), out,
                 progress=False)
        return ""
    if name == "movielens100k":
        raw = SHARED / "movielens-100k"
        if not (raw / "u.data").is_file():
            return f"{raw}/u.data not found (shared data absent)"
        from gem.data.adapters.movielens import convert_movielens

        convert_movielens(raw, out)
        return ""
    if name == "taobao":
        raw = SHARED / "taobao-userbehavior" / "UserBehavior.csv"
        if not raw.is_file():
            return f"{raw} not found (shared data absent)"
        from gem.data.adapters.taobao import convert_taobao

        convert_taobao(raw, out)
        return ""
    raise ValueError(f"unknown dataset {name!r}; choose from {DATASETS}")


def choose_split(data_dir: Path, eval_frac: float) -> dict:
    """The train/eval windows: eval = the last UTC days holding >= eval_frac of the ad
    impressions (at least one day, never all of them)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from gem.data.contract import EVENTS_DIR, Manifest

    manifest = Manifest.read(data_dir)
    table = ds.dataset(data_dir / EVENTS_DIR, format="parquet", partitioning="hive").to_table(
        columns=["event_time", "is_ad"], filter=ds.field("is_ad"))
    days = pc.cast(pc.floor_temporal(table.column("event_time"), unit="day"), "string").to_pylist()
    counts: dict[str, int] = {}
    for day in days:
        counts[day[:10]] = counts.get(day[:10], 0) + 1
    ordered = sorted(counts)
    total, held = sum(counts.values()), 0
    cut_day = ordered[-1]
    for day in reversed(ordered[1:]):
        held += counts[day]
        cut_day = day
        if held >= eval_frac * total:
            break
    cut = dt.datetime.fromisoformat(cut_day).replace(tzinfo=dt.timezone.utc)
    return {"train_start": manifest.start.isoformat(), "cut": cut.isoformat(), "eval_end": manifest.end.isoformat(),
            "eval_days": sum(1 for d in ordered if d >= cut_day), "train_days": sum(1 for d in ordered if d < cut_day),
            "ad_impressions": total, "eval_ad_impressions": held}


def build_split(data_dir: Path, out: Path, split: dict, max_seq_len: int) -> tuple[Path, Path]:
    from gem.features import build_features
    from gem.features.config import FeaturesConfig

    train_dir, eval_dir = out / "features_train", out / "features_eval"
    build_features(data_dir, train_dir, FeaturesConfig(max_seq_len=max_seq_len, num_buckets=2, workers=1),
                   window_start=split["train_start"], window_end=split["cut"])
    build_features(data_dir, eval_dir, FeaturesConfig(max_seq_len=max_seq_len, num_buckets=2, workers=1,
                                                      vocab_from=str(train_dir)),
                   window_start=split["cut"], window_end=split["eval_end"])
    return train_dir, eval_dir


# ---- models ----

def run_trainer(arch: str, train_dir: Path, eval_dir: Path, args, tracking_uri: str, seed: int = 0) -> dict:
    from gem.training.config import load_train_config
    from gem.training.trainer import train_and_evaluate

    cfg, model_cfg = load_train_config(args.train_preset, [
        f"model_preset={args.model_preset}", f"model.arch={arch}", f"epochs={args.epochs}", f"seed={seed}",
        f"batch_size={args.batch_size}", "checkpoint_every=0", "log_every=50", "system_metrics=false",
        "log_model=false", "measure_peak=false", f"tracking_uri={tracking_uri}", "experiment=quality-bench",
        f"run_name=quality-{arch}-seed{seed}"])
    metrics = train_and_evaluate(str(train_dir), str(eval_dir), model_cfg, cfg)
    out = {"auc": metrics.get("auc/all/click", float("nan")), "ne": metrics.get("ne/all/click", float("nan")),
           "examples_per_s": metrics.get("perf/examples_per_s", float("nan")),
           "conversion_auc": metrics.get("auc/all/conversion", float("nan")),
           "conversion_ne": metrics.get("ne/all/conversion", float("nan")),
           "calibration": metrics.get("calibration/all/click", float("nan")),
           "steps": metrics.get("steps", 0), "epochs": args.epochs,
           "config": f"train={args.train_preset} model={args.model_preset} batch={args.batch_size}"}
    from gem.features.loader import load_feature_spec

    for surface in load_feature_spec(train_dir).surfaces:  # the data's surfaces
        if f"auc/{surface}/click" in metrics:
            out[f"auc_{surface}"] = metrics[f"auc/{surface}/click"]
            out[f"ne_{surface}"] = metrics.get(f"ne/{surface}/click", float("nan"))
    return out


def over_seeds(run, seeds: int) -> dict:
    """``run(seed)`` for each seed: numeric figures averaged over the seeds, with the
    spread of AUC and NE (``auc_std``, ``ne_std``, ...) and the per-seed values."""
    runs = [run(seed) for seed in range(seeds)]
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            values = np.array([r[key] for r in runs], dtype=np.float64)
            out[key] = float(values.mean())
            if key.startswith(("auc", "ne")):
                out[f"{key}_std"] = float(values.std(ddof=1)) if seeds > 1 else 0.0
    out["seeds"] = seeds
    out["auc_by_seed"] = [r["auc"] for r in runs]
    out["ne_by_seed"] = [r["ne"] for r in runs]
    return out


def surface_wins(gem: dict, baseline: dict) -> dict:
    """Per surface, whether GEM beats the baseline on click AUC and on NE (lower is better),
    with the margins (GEM minus baseline), on the seed means."""
    wins = {}
    surfaces = [k[len("auc_"):] for k in gem if k.startswith("auc_") and not k.endswith("_std")
                and isinstance(gem[k], float)]
    for surface in surfaces:
        keys = (f"auc_{surface}", f"ne_{surface}")
        if all(k in gem and k in baseline for k in keys):
            wins[surface] = {"auc": bool(gem[keys[0]] > baseline[keys[0]]),
                             "ne": bool(gem[keys[1]] < baseline[keys[1]]),
                             "auc_margin": gem[keys[0]] - baseline[keys[0]],
                             "ne_margin": gem[keys[1]] - baseline[keys[1]]}
    return wins


def run_reference(name: str, train, test, args, seed: int = 0) -> dict:
    from benchmarks.quality import baselines

    out: dict = {}
    for t, task in enumerate(TASKS):
        if task == "conversion" and (not args.conversion or (name.startswith("fuxictr") and
                                                             not args.fuxictr_conversion)):
            continue
        start = time.perf_counter()
        if name == "item_ctr":
            pred, seen, config = baselines.item_ctr(train, test, task=t), len(train), "prior_weight=20"
        elif name == "lr_ids":
            pred, seen, config = baselines.lr_ids(train, test, task=t), len(train), "one-hot user+item, C=1"
        else:
            kind = name.split("_", 1)[1]
            res = baselines.train_fuxictr(kind, train, test, epochs=args.epochs, batch_size=args.batch_size, task=t,
                                          max_len=args.fuxictr_seq_len, seed=seed)
            pred, seen = res["pred"], res["train_examples_seen"]
            config = f"emb=16 epochs={args.epochs} batch={args.batch_size} seq_len={args.fuxictr_seq_len} adam 1e-3"
        seconds = time.perf_counter() - start
        s = baselines.score(test.labels[:, t], pred)
        if task == "click":
            out.update({"auc": s["auc"], "ne": s["ne"], "examples_per_s": seen / max(seconds, 1e-9),
                        "calibration": float(np.mean(pred) / max(test.labels[:, 0].mean(), 1e-9)),
                        "train_seconds": seconds, "config": config})
        else:
            out.update({"conversion_auc": s["auc"], "conversion_ne": s["ne"]})
    return out


# ---- driver ----

def bench_dataset(name: str, root: Path, args, tracking_uri: str) -> tuple[dict, dict]:
    from benchmarks.quality import baselines

    data_dir = root / name / "data"
    started = time.perf_counter()
    skipped = make_dataset(name, data_dir, sim_users=args.sim_users, sim_items=args.sim_items, sim_days=args.sim_days)
    if skipped:
        print(f"[quality] {name}: skipped: {skipped}", flush=True)
        return {"skipped": skipped}, {}
    split = choose_split(data_dir, args.eval_frac)
    train_dir, eval_dir = build_split(data_dir, root / name, split, args.max_seq_len)
    train, test = baselines.load_examples(train_dir), baselines.load_examples(eval_dir)
    sizes = {**split, "train_examples": len(train), "eval_examples": len(test),
             "train_click_rate": float(train.labels[:, 0].mean()), "eval_click_rate": float(test.labels[:, 0].mean()),
             "eval_conversion_rate": float(test.labels[:, 1].mean()),
             "eval_unknown_item_share": float((test.column("item_id") == 0).mean()),
             "eval_unknown_user_share": float((test.column("user_id") == 0).mean()),
             "prepare_seconds": time.perf_counter() - started}
    print(f"[quality] {name}: {len(train)} train / {len(test)} eval examples, split {split['cut']}", flush=True)
    figures: dict = {}
    for model in args.models:
        start = time.perf_counter()
        try:
            if model in ("gem", "dlrm_baseline"):
                arch = "gem" if model == "gem" else "dlrm"
                figures[model] = over_seeds(
                    lambda seed, arch=arch: run_trainer(arch, train_dir, eval_dir, args, tracking_uri, seed),
                    args.seeds)
            elif model in SEEDED:
                figures[model] = over_seeds(lambda seed, model=model: run_reference(model, train, test, args, seed),
                                            args.seeds)
            else:
                figures[model] = run_reference(model, train, test, args)
        except Exception as exc:  # noqa: BLE001 - one failing model must not lose the others
            traceback.print_exc()
            figures[model] = {"error": f"{type(exc).__name__}: {exc}"}
        figures[model]["wall_seconds"] = time.perf_counter() - start
        shown = figures[model]
        print(f"[quality] {name}/{model}: auc={shown.get('auc', float('nan')):.4f} "
              f"ne={shown.get('ne', float('nan')):.4f} ({shown['wall_seconds']:.0f}s)", flush=True)
    scored = {m: f["auc"] for m, f in figures.items() if isinstance(f.get("auc"), float) and f["auc"] == f["auc"]}
    if scored:
        figures["best_by_auc"] = max(scored, key=scored.get)
    if "gem" in figures and "dlrm_baseline" in figures:
        wins = surface_wins(figures["gem"], figures["dlrm_baseline"])
        figures["gem_vs_dlrm_by_surface"] = wins
        figures["gem_beats_dlrm_every_surface"] = bool(wins) and all(w["auc"] and w["ne"] for w in wins.values())
    return figures, sizes


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def _switches(text: str) -> list[bool]:
    values = {"on": True, "off": False}
    bad = [v for v in text.split(",") if v and v not in values]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad}: use on and/or off")
    return [values[v] for v in text.split(",") if v]


def _switch(text: str) -> bool:
    values = _switches(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: on or off")
    return values[0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("days", "peers"), default="days",
                        help="days: the last days held out (today's); peers: the peers' protocol (peers.py)")
    parser.add_argument("--datasets", default=None,
                        help=f"default: {','.join(DATASETS)} (days), movielens100k,taobao (peers)")
    parser.add_argument("--models", default=None)
    parser.add_argument("--sim-users", type=int, default=12000)
    parser.add_argument("--sim-items", type=int, default=5000)
    parser.add_argument("--sim-days", type=int, default=8)
    parser.add_argument("--eval-frac", type=float, default=0.1)
    parser.add_argument("--max-seq-len", type=int, default=64)
    parser.add_argument("--fuxictr-seq-len", type=int, default=64)
    parser.add_argument("--train-preset", default="tiny")
    parser.add_argument("--model-preset", default="tiny")
    parser.add_argument("--epochs", type=int, default=1,
                        help="passes over the training window (CTR models over-fit from the second)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="trained models run once per seed; figures are the means")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads; default 2 (days), 1 (peers: on a shared 2-core machine 2 threads "
                             "ran several times slower than 1)")
    peers = parser.add_argument_group("peers protocol (--protocol peers)")
    peers.add_argument("--quantiles", type=_floats, default=[0.8, 0.9],
                       help="cut points at these quantiles of example time (train / validation / test)")
    peers.add_argument("--cut", action="append", default=[],
                       help="an explicit time cut point (ISO-8601), twice: validation start, test start")
    peers.add_argument("--split-file", default=None,
                       help="explicit split: Parquet/CSV with columns example_id, part (train/validation/test)")
    peers.add_argument("--max-epochs", type=int, default=2, help="epoch budget of every deep model")
    peers.add_argument("--schedule", choices=("cosine", "none"), default="cosine",
                       help="dense lr over the epoch budget, for every deep model")
    peers.add_argument("--grid-lr-scale", type=_floats, default=[1.0, 0.3],
                       help="the tuning grid: each model's lr times these")
    peers.add_argument("--grid-weight-decay", type=_floats, default=[0.0],
                       help="the tuning grid: AdamW decoupled decay of the dense parameters")
    peers.add_argument("--grid-history", type=_switches, default=[True, False],
                       help="the tuning grid: whether the model reads the history (on,off: every deep model may "
                            "choose to read none, on validation)")
    peers.add_argument("--model-set", action="append", default=[],
                       help="a GEM/DLRM model override KEY=VALUE (diagnostics: capacity), repeatable")
    peers.add_argument("--user-fraction", type=float, default=1.0,
                       help="keep this deterministic share of the users (hash of the raw id)")
    peers.add_argument("--replicates", type=int, default=1000, help="bootstrap replicates over test users")
    peers.add_argument("--no-history", action="store_true",
                       help="diagnostics: every history emptied, for every model (the ablation without sequences)")
    peers.add_argument("--history", choices=("blind", "labels"), default="blind",
                       help="blind: label-blind histories (peers_protocol); labels: every model reads the same "
                            "label-aware history GEM reads (peers_protocol_rich)")
    peers.add_argument("--counters", type=_switch, default=False,
                       help="on: every model reads the point-in-time counters of the item, advertiser, category, "
                            "(surface, item) and user (gem/features/counters.py) as dense features, lr_ids as extra "
                            "columns, item_ctr as the item's rate so far; off (default): none does")
    peers.add_argument("--min-id-count", type=int, default=1,
                       help="ids (user, item, attributes) in fewer train rows than this map to 0 (unknown) in every "
                            "row, so the unknown id is trained on rare ones (1: only ids no train row shows)")
    peers.add_argument("--train-newest", type=float, default=1.0,
                       help="train on the newest share of the train window only (validation and test fixed)")
    peers.add_argument("--result-key", default=None,
                       help="quality.json key to write (default peers_protocol, or peers_protocol_rich with "
                            "--history labels)")
    peers.add_argument("--train-fraction", type=float, default=1.0,
                       help="diagnostics: train on a random share of the train rows (validation and test unchanged)")
    peers.add_argument("--jobs", type=int, default=1,
                       help="datasets run in parallel processes, each with --threads threads (2: both cores, as "
                            "today's protocol with 2 threads)")
    peers.add_argument("--work-dir", default=None,
                       help="cached data, features and runs (default .local_runs/quality-peers)")
    peers.add_argument("--fresh", action="store_true", help="rebuild and retrain, ignoring the work dir")
    parser.add_argument("--no-conversion", dest="conversion", action="store_false",
                        help="skip the conversion figures of lr_ids/item_ctr")
    parser.add_argument("--fuxictr-conversion", action="store_true",
                        help="also train FuxiCTR models on conversion (doubles their time)")
    parser.add_argument("--results-dir", default=None)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.protocol == "peers":
        return main_peers(args, parser)
    if args.cut or args.split_file:
        parser.error("--cut / --split-file define the peers' protocol split: add --protocol peers")
    args.datasets = args.datasets or ",".join(DATASETS)
    args.models = [m for m in (args.models or ",".join(MODELS)).split(",") if m]
    args.threads = args.threads or 2
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {MODELS}")
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)

    figures: dict = {}
    sizes: dict = {"models": args.models, "epochs": args.epochs, "seeds": args.seeds, "batch_size": args.batch_size,
                   "train_preset": args.train_preset, "model_preset": args.model_preset,
                   "max_seq_len": args.max_seq_len, "fuxictr_seq_len": args.fuxictr_seq_len,
                   "simulator": {"users": args.sim_users, "items": args.sim_items, "days": args.sim_days},
                   "eval_frac": args.eval_frac, "task": "click (primary); conversion_* where reported",
                   "datasets": {}}
    started = time.perf_counter()
    tracking_uri = bench_tracking("quality-bench")  # the trainers' runs, kept for comparison
    with tempfile.TemporaryDirectory(prefix="gem-quality-") as tmp:
        root = Path(tmp)
        for name in [d for d in args.datasets.split(",") if d]:
            figures[name], sizes["datasets"][name] = bench_dataset(name, root, args, tracking_uri)
            for model, result in figures[name].items():
                if model in MODELS and isinstance(result, dict):
                    log_comparison_run("quality", f"{name}/{model}", result,
                                       {"dataset": name, "model": model, "seeds": args.seeds, "epochs": args.epochs})
    sizes["total_seconds"] = time.perf_counter() - started
    previous = _read_results(args.results_dir)
    for key in KEPT_KEYS:  # the other protocols' figures stay beside today's
        if key in previous:
            figures[key] = previous[key]
    path = write_result("quality", figures, sizes=sizes, out_dir=args.results_dir)
    rows = []
    for name, models in figures.items():
        if "skipped" in models:
            rows.append((f"{name}", f"skipped: {models['skipped']}"))
            continue
        for model, f in models.items():
            if model in MODELS and isinstance(f, dict):
                rows.append((f"{name}/{model}", "error" if "error" in f else
                             f"auc {f['auc']:.4f}  ne {f['ne']:.4f}  {f['examples_per_s']:.0f} ex/s"))
        rows.append((f"{name} best by auc", models.get("best_by_auc", "-")))
    print_table(f"quality, click task ({path})", rows)
    return figures


PEERS_KEY = "peers_protocol"
RICH_KEY = "peers_protocol_rich"
KEPT_KEYS = (PEERS_KEY, RICH_KEY, "scaling", "peers_protocol_diagnostics")  # the days protocol keeps these


def _results_path(results_dir: str | None) -> Path:
    from benchmarks.results import results_dir as default_dir

    return Path(results_dir or default_dir()) / "quality.json"


def _read_results(results_dir: str | None) -> dict:
    import json

    path = _results_path(results_dir)
    return json.loads(path.read_text()) if path.is_file() else {}


def peers_args(args, parser):
    """The peers' protocol's settings, checked and completed (datasets and models as
    lists, threads, the shared-data and work folders)."""
    from benchmarks.quality import peers
    from benchmarks.results import work_dir

    args.datasets = [d for d in (args.datasets or ",".join(peers.DATASETS)).split(",") if d]
    args.models = [m for m in (args.models or ",".join(peers.MODELS)).split(",") if m]
    unknown = sorted(set(args.models) - set(peers.MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; the peers' protocol has {peers.MODELS}")
    if args.cut and args.split_file:
        parser.error("give --cut or --split-file, not both")
    if args.cut and len(args.cut) != 2:
        parser.error("--cut: twice (validation start, test start): the peers' protocol selects on validation")
    args.threads = args.threads or 1
    args.shared = SHARED
    args.work_dir = args.work_dir or str(work_dir("quality-peers"))
    return args


def main_peers(args, parser) -> dict:
    """--protocol peers: run it, then write its figures under ``peers_protocol`` (label-
    blind) or ``peers_protocol_rich`` (label-aware) of quality.json, keeping the rest of
    the file as it is."""
    from benchmarks.quality import peers
    from benchmarks.results import machine_info
    from gem.utils.atomic import write_json

    args = peers_args(args, parser)
    logging.basicConfig(level=logging.WARNING)
    result = peers.run(args)
    payload = _read_results(args.results_dir)
    key = args.result_key or (RICH_KEY if args.history == "labels" else PEERS_KEY)
    payload[key] = {**result, "machine": machine_info(),
                    "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = _results_path(args.results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(payload, path)
    print_peers(result, path)
    return result


def print_peers(result: dict, path: Path) -> None:
    from benchmarks.quality.peers import MODELS as PEER_MODELS

    rows = []
    for name, models in result["datasets"].items():
        if "skipped" in models:
            rows.append((name, f"skipped: {models['skipped']}"))
            continue
        for model in PEER_MODELS:
            f = models.get(model)
            if not isinstance(f, dict):
                continue
            if "error" in f:
                rows.append((f"{name}/{model}", f["error"]))
                continue
            lo, hi = f["auc_ci95"]
            diff = f.get("gem_minus", {}).get("auc")
            shown = f"auc {f['auc']:.4f} [{lo:.4f}, {hi:.4f}] sd {f['auc_std']:.4f}  ne {f['ne']:.4f}"
            if diff:
                shown += f"  gem-this {diff['mean']:+.4f} [{diff['lo']:+.4f}, {diff['hi']:+.4f}]"
            rows.append((f"{name}/{model}", shown))
        v = models.get("verdict", {})
        if v:
            rows.append((f"{name} best peer", f"{v['best_peer']} (gem at or above: {v['gem_at_or_above_best_peer']})"))
    print_table(f"quality, peers' protocol, click task ({path})", rows)


if __name__ == "__main__":
    main()
