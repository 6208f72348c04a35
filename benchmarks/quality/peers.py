"""The peers' protocol of the quality benchmark (issue 13, item 7; item 4's explicit split).

    python -m benchmarks.quality.bench --protocol peers [--datasets movielens100k,taobao]
        [--quantiles 0.8,0.9 | --cut ISO --cut ISO | --split-file ids.parquet]

The protocol of the published CTR benchmarks (FuxiCTR / BARS style), per dataset:

1. **Data.** MovieLens-100K as today (click = rating >= 4). Taobao with its honest label
   times (``convert_taobao(label="action")``: every page view is an impression whose
   click is a cart / fav / buy of the item within 3 days, known at the first such
   action; no synthetic negatives).
2. **Label-blind history.** One features build over the whole window with
   ``history_labels=false``: an example's history is the items the user acted on
   strictly before it (same-second events excluded), with no earlier label, no action
   and no prior CTR (gem/features/loader.py).
3. **A global time split** at the 0.8 / 0.9 quantiles of example time
   (``gem.protocol.quantile_cuts``: train < cut0 <= validation < cut1 <= test), or an
   explicit one: two ``--cut`` time points or a ``--split-file`` of example ids with their
   part (``gem.protocol.assign_split``). Histories cross the cuts (a test example sees the
   user's earlier validation-period items), labels never do.
4. **Train-only id space.** An id (user, item, attribute) that no train row shows, as its
   own feature or in its history, maps to 0 (unknown) in every row: nothing of the
   validation or test period enters any model's tables.
5. **Same rows, same budget, selection on validation.** Every model trains on exactly
   the train rows, click labels only (GEM's conversion head gets weight 0), in the same
   shuffled order per (seed, epoch). The deep models (GEM, DLRM, FuxiCTR DIN / WuKong /
   DCNv2 / DNN) share one grid (``--grid-lr-scale``, ``--grid-weight-decay``: each model's
   own lr times the scale; AdamW decoupled weight decay on the dense parameters) and one
   budget: ``--max-epochs`` epochs with the dense lr on a cosine to 0 over them, scored
   on the validation part after every epoch. Seed 0 searches the grid; the grid point with
   the best validation AUC (at its best epoch) is rerun on the other seeds, and every seed
   reports the test predictions of its own best validation epoch. ``lr_ids`` picks C and
   ``item_ctr`` its prior weight on the validation part. The test part is read once per
   run, only to score the selected epoch.
6. **Figures.** Test AUC, NE and log loss per model: mean over seeds, the seed spread
   (ddof=1), a 95% interval of the seed mean from a bootstrap over test *users* (Poisson
   weights per user shared by all of the user's rows, students/stats.py), and for GEM
   minus every other model the paired bootstrap interval of the seed-averaged
   difference (the same user weights for both models).

Every run (model, grid point, seed) is cached in ``--work-dir`` (default
.local_runs/quality-peers) under a key of everything it depends on, so an interrupted or
extended run reuses what is done; ``--fresh`` ignores the cache. ``--user-fraction``
keeps a deterministic share of the users (by a hash of the raw id), recorded in the JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from benchmarks.quality import baselines
from benchmarks.quality.runs import (
    CACHE_VERSION,
    FuxiRun,
    GemRun,
    GridPoint,
    RunCache,
    RunSettings,
    fit_deep,
)
from benchmarks.quality.sequence_peers import SEQUENCE_MODELS, SequenceRun
from benchmarks.quality.store import ExampleStore, take, user_hash_fraction
from gem.features.counters import COUNTER_PREFIX, HORIZONS

PEERS = ("item_ctr", "lr_ids", "fuxictr_dnn", "fuxictr_dcnv2", "fuxictr_wukong", "fuxictr_din", "bst", "hstu")
REFERENCES = ("dlrm_baseline",)  # GEM's own ablation (history mean-pooled, an MLP): not one of the peers
MODELS = ("gem", *REFERENCES, *PEERS)
DEEP = ("gem", "dlrm_baseline", "fuxictr_dnn", "fuxictr_dcnv2", "fuxictr_wukong", "fuxictr_din", "bst", "hstu")
DATASETS = ("movielens100k", "taobao")  # the default; movielens1m and ciao on request
# name -> (path under the shared data, files in it of which one must exist (none: the path is the file),
# adapter, its options)
REAL_SOURCES = {
    "movielens100k": ("movielens-100k", ("u.data",), "gem.data.adapters.movielens.convert_movielens", {}),
    "taobao": ("taobao-userbehavior/UserBehavior.csv", (), "gem.data.adapters.taobao.convert_taobao",
               {"label": "action"}),
    "movielens1m": ("movielens-1m", ("ratings.dat.gz", "ratings.dat"),
                    "gem.data.adapters.movielens1m.convert_movielens1m", {}),
    "ciao": ("ciao/ratings.csv.gz", (), "gem.data.adapters.ciao.convert_ciao", {}),
    # implicit feedback: every rating a positive, one sampled unrated movie per positive (seed 0)
    "movielens1m_implicit": ("movielens-1m", ("ratings.dat.gz", "ratings.dat"),
                             "gem.data.adapters.movielens1m.convert_movielens1m", {"implicit": True, "seed": 0}),
}
HISTORIES = ("blind", "labels")  # label-blind histories, or every model the same label-aware one
HISTORY_TEXT = {
    "blind": "label-blind: items acted on strictly before the example, no earlier labels, no prior CTR",
    "labels": "label-aware, the same for every model: each earlier event's item with its label, shown only once "
              "the label's time is strictly before the example's (click at click_time, conversion at "
              "conversion_time), the user's prior click rate among the dense features; FuxiCTR models: the label "
              "as a side feature of each history item; bst / hstu: a label token per event; lr_ids: the dense "
              "features, the prior click rate and the history-label counts beside its one-hot ids",
}
LR_IDS_C = (0.1, 1.0, 10.0)
ITEM_CTR_PRIOR = (5.0, 20.0, 100.0)


# ---- the split ----

def split_parts(store: ExampleStore, *, quantiles=(0.8, 0.9), cuts_iso: list[str] | None = None,
                split_file: str | None = None) -> tuple[np.ndarray, dict]:
    """object (N,) part per row ("train" / "validation" / "test" / "" unused) and what
    defined it: the quantile cut points of example time, explicit cut points, or a file."""
    from gem.data.contract import parse_utc
    from gem.protocol import assign_split, quantile_cuts

    if cuts_iso and split_file:
        raise ValueError("give --cut or --split-file, not both")
    if split_file:
        parts = assign_split(store.example_id, store.time_us, ids_file=split_file)
        info = {"kind": "file", "split_file": str(split_file),
                "split_file_sha256": hashlib.sha256(Path(split_file).read_bytes()).hexdigest()}
    else:
        if cuts_iso:
            if len(cuts_iso) != 2:
                raise ValueError(f"--cut: two time cut points (validation start, test start), got {cuts_iso}: "
                                 "the peers' protocol selects on a validation part")
            cuts = [int(round(parse_utc(c).timestamp() * 1_000_000)) for c in cuts_iso]
            info = {"kind": "cuts"}
        else:
            cuts = quantile_cuts(store.time_us, tuple(quantiles))
            info = {"kind": "quantiles", "quantiles": list(quantiles)}
        if not cuts[0] < cuts[1]:
            raise ValueError(f"cut points must increase, got {cuts}")
        parts = assign_split(store.example_id, store.time_us, cuts=cuts)
        info["cuts_us"] = cuts
        info["cuts"] = [_iso(c) for c in cuts]
    for name in ("train", "validation", "test"):
        if not (parts == name).any():
            raise ValueError(f"the split leaves no {name} example")
    return parts, info


def _iso(us: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(us / 1e6, tz=dt.timezone.utc).isoformat()


def newest(train: np.ndarray, time_us: np.ndarray, fraction: float) -> np.ndarray:
    """The newest ``fraction`` of the rows ``train`` by example time (ties: later row
    first), in their original order."""
    if not 0 < fraction <= 1:
        raise ValueError(f"train_newest must be in (0, 1], got {fraction}")
    keep = max(1, int(round(len(train) * fraction)))
    order = np.lexsort((train, time_us[train]))
    return np.sort(train[order[len(train) - keep:]])


def check_split(store: ExampleStore, parts: np.ndarray, info: dict) -> dict:
    """Assertions that the split cannot leak: disjoint parts, and for a time split every
    train example before every validation one before every test one."""
    ids = {p: set(store.example_id[parts == p].tolist()) for p in ("train", "validation", "test")}
    assert not (ids["train"] & ids["validation"]) and not (ids["train"] & ids["test"]) \
        and not (ids["validation"] & ids["test"]), "an example is in two parts"
    out = {f"{p}_examples": len(v) for p, v in ids.items()}
    if info["kind"] != "file":
        t = {p: store.time_us[parts == p] for p in ids}
        assert t["train"].max() < info["cuts_us"][0] <= t["validation"].min(), "train reaches past cut 0"
        assert t["validation"].max() < info["cuts_us"][1] <= t["test"].min(), "validation reaches past cut 1"
    return out


# ---- the models under the protocol ----

def run_model(model: str, store: ExampleStore, rows: dict[str, np.ndarray], *, seeds: int,
              grid: list[GridPoint], settings: RunSettings, cache: RunCache, data_key: str,
              log: Callable[[str], None] = print) -> dict:
    """Selection on validation, then test predictions per seed: {"seeds": [...], "selected": ...}."""
    labels = store.labels[:, 0]
    if model in ("lr_ids", "item_ctr"):
        return _run_shallow(model, store, rows, labels)
    stores = {True: store}
    if not all(p.history for p in grid):
        stores[False] = store.without_history()
    examples = {h: s.examples(settings.fuxictr_seq_len) for h, s in stores.items()} \
        if model.startswith("fuxictr") else None

    def one(point: GridPoint, seed: int) -> dict:
        key = cache.key(data=data_key, model=model, point=point.key(), seed=seed,
                        settings=dataclasses.asdict(settings))
        hit = cache.get(key)
        if hit is not None:
            log(f"    {model} {point.name()} seed {seed}: cached (val auc {hit['val_auc']:.4f})")
            return hit

        def make(steps: int):
            if model in ("gem", "dlrm_baseline"):
                return GemRun("gem" if model == "gem" else "dlrm", stores[point.history], point, seed, settings,
                              steps)
            if model in SEQUENCE_MODELS:
                return SequenceRun(model, stores[point.history], point, seed, settings, steps)
            return FuxiRun(model.split("_", 1)[1], examples[point.history], point, seed, settings, steps, tmp)

        with tempfile.TemporaryDirectory(prefix="gem-peers-") as tmp:
            result = fit_deep(make, rows, labels, seed, settings)
        result.update(point=dataclasses.asdict(point), seed=seed)
        cache.put(key, result)
        log(f"    {model} {point.name()} seed {seed}: val auc {result['val_auc']:.4f} at epoch "
            f"{result['best_epoch']} ({result['seconds']:.0f}s, {result['examples_per_s']:.0f} ex/s)")
        return result

    searched = [one(point, 0) for point in grid]
    chosen = max(range(len(grid)), key=lambda i: searched[i]["val_auc"])
    per_seed = [searched[chosen]] + [one(grid[chosen], seed) for seed in range(1, seeds)]
    ran = searched + per_seed[1:]
    return {"seeds": per_seed, "runs": [{"seconds": r["seconds"], "cached": bool(r.get("cached"))} for r in ran],
            "selected": {"point": dataclasses.asdict(grid[chosen]),
                                            "grid_val_auc": {p.name(): r["val_auc"] for p, r in zip(grid, searched)},
                                            "grid_curves": {p.name(): r["curve"] for p, r in zip(grid, searched)}}}


def _run_shallow(model: str, store: ExampleStore, rows: dict[str, np.ndarray], labels: np.ndarray) -> dict:
    ex = store.examples(1)
    counters = [i for i, name in enumerate(store.spec.dense) if name.startswith(COUNTER_PREFIX)]
    if store.spec.history_labels:  # the same facts the deep models read: dense features, history labels
        ex.numeric = np.column_stack([store.dense, store.label_facts()[0]]).astype(np.float64)
    elif counters:  # label-blind histories: of the dense features, the counters carry labels
        ex.numeric = store.dense[:, counters].astype(np.float64)
    parts = {p: take(ex, rows[p]) for p in ("train", "validation", "test")}
    values = LR_IDS_C if model == "lr_ids" else tuple(HORIZONS) if counters else ITEM_CTR_PRIOR
    if model == "lr_ids":
        def fit(v, part):
            return baselines.lr_ids(parts["train"], parts[part], C=v)
    elif counters:  # the item's click rate so far in a horizon, from the counters the deep models read
        dense = list(store.spec.dense)

        def fit(v, part):
            lift, base = (store.dense[rows[part], dense.index(n)] for n in (f"cnt_item_{v}_ctr_lift",
                                                                            "cnt_global_all_ctr_logit"))
            return 1.0 / (1.0 + np.exp(-(lift + base)))
    else:
        def fit(v, part):
            return baselines.item_ctr(parts["train"], parts[part], prior_weight=v)
    start = time.perf_counter()
    val_auc = {v: baselines.auc(labels[rows["validation"]], fit(v, "validation")) for v in values}
    best = max(values, key=lambda v: val_auc[v])
    pred = fit(best, "test")
    seconds = time.perf_counter() - start
    name = "C" if model == "lr_ids" else "horizon" if counters else "prior_weight"
    config = (f"C={best:g} one-hot user+item, liblinear" if model == "lr_ids" else
              f"the item's smoothed click rate so far over {best}" if counters else
              f"prior_weight={best:g}, train-window item rate")
    result = {"test_pred": pred, "val_auc": val_auc[best], "seconds": seconds, "seed": 0, "config": config,
              "examples_per_s": len(rows["train"]) * len(values) / max(seconds, 1e-9)}
    return {"seeds": [result], "selected": {"point": {name: best},
                                            "grid_val_auc": {f"{name}={_text(v)}": a for v, a in val_auc.items()}}}


def _item_ctr_grid(args) -> str:
    return f"horizon in {list(HORIZONS)}" if getattr(args, "counters", False) else f"prior in {list(ITEM_CTR_PRIOR)}"


def _text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# ---- figures ----

def figures(results: dict[str, dict], labels: np.ndarray, users: np.ndarray, *, replicates: int = 1000,
            seed: int = 0, groups: dict[str, np.ndarray] | None = None) -> dict:
    """Per model: test AUC / NE / logloss (seed mean, seed std ddof=1, 95% user-bootstrap
    interval of the seed mean); GEM minus each other model: paired intervals. ``groups``:
    name -> bool mask of test rows, the seed-mean AUC on each (``auc_<name>``)."""
    from students.stats import paired_difference, sample_std, user_weights, weighted_auc, weighted_ne

    weights = user_weights(users, n=replicates, seed=seed)
    ones = np.ones((1, len(labels)))
    out: dict = {}
    for model, res in results.items():
        preds = [r["test_pred"] for r in res["seeds"]]
        aucs = [float(weighted_auc(labels, p, ones)[0]) for p in preds]
        nes = [float(weighted_ne(labels, p, ones)[0]) for p in preds]
        lls = [_logloss(labels, p) for p in preds]
        rep_auc = np.mean([weighted_auc(labels, p, weights) for p in preds], axis=0)
        rep_ne = np.mean([weighted_ne(labels, p, weights) for p in preds], axis=0)
        out[model] = {
            "auc": float(np.mean(aucs)), "auc_std": sample_std(aucs), "auc_ci95": _ci(rep_auc),
            "ne": float(np.mean(nes)), "ne_std": sample_std(nes), "ne_ci95": _ci(rep_ne),
            "logloss": float(np.mean(lls)), "logloss_std": sample_std(lls),
            "calibration": float(np.mean([np.mean(p) for p in preds]) / max(labels.mean(), 1e-9)),
            "auc_by_seed": aucs, "ne_by_seed": nes, "seeds": len(preds),
            "val_auc_by_seed": [r["val_auc"] for r in res["seeds"]],
            "best_epoch_by_seed": [r.get("best_epoch") for r in res["seeds"]],
            "examples_per_s": float(np.mean([r["examples_per_s"] for r in res["seeds"]])),
            "flops_per_example": res["seeds"][0].get("flops_per_example"),
            "train_seconds": float(sum(r["seconds"] for r in res["seeds"])),
            "config": res["seeds"][0]["config"], "selected": res["selected"],
        }
        for group, mask in (groups or {}).items():
            out[model][f"auc_{group}"] = float(np.mean([baselines.auc(labels[mask], p[mask]) for p in preds]))
        if "curve" in res["seeds"][0]:
            out[model]["curve_by_seed"] = [r["curve"] for r in res["seeds"]]
    if "gem" in results:
        gem = [r["test_pred"] for r in results["gem"]["seeds"]]
        rows = np.arange(len(labels))
        for model, res in results.items():
            if model == "gem":
                continue
            other = [r["test_pred"] for r in res["seeds"]]
            pairs = [(rows, labels, g, other[i % len(other)]) for i, g in enumerate(gem)]
            out[model]["gem_minus"] = {"auc": paired_difference(pairs, weights, metric="auc"),
                                       "ne": _negated(paired_difference(pairs, weights, metric="ne"))}
    return out


def _logloss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, baselines.EPS, 1 - baselines.EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def _ci(replicates: np.ndarray) -> list[float]:
    from students.stats import interval

    return list(interval(replicates))


def _negated(d: dict) -> dict:
    """paired_difference's NE lift is b - a (positive = a better); as GEM minus peer."""
    return {"mean": -d["mean"], "lo": -d["hi"], "hi": -d["lo"], "excludes_zero": d["excludes_zero"]}


def verdict(figs: dict) -> dict:
    """The best peer by mean test AUC and whether GEM is at or above it."""
    peers = {m: f["auc"] for m, f in figs.items() if m in PEERS and isinstance(f, dict) and "auc" in f}
    if "gem" not in figs or not peers:
        return {}
    best = max(peers, key=peers.get)
    diff = figs[best].get("gem_minus", {}).get("auc", {})
    return {"best_peer": best, "best_peer_auc": peers[best], "gem_auc": figs["gem"]["auc"],
            "gem_minus_best_peer_auc": diff,
            "gem_at_or_above_best_peer": bool(figs["gem"]["auc"] >= peers[best]),
            "gem_significantly_below_best_peer": bool(diff.get("hi", 0.0) < 0)}


# ---- per dataset ----

DEFAULT_SEQ_LEN = 64


def features_name(history: str, counters: bool = False, max_seq_len: int = DEFAULT_SEQ_LEN) -> str:
    """The features build's folder under a dataset's work folder (one per setting, so
    builds of other settings run side by side)."""
    return (("features" if history == "blind" else f"features-{history}") + ("-counters" if counters else "")
            + (f"-L{max_seq_len}" if max_seq_len != DEFAULT_SEQ_LEN else ""))


def prepare(name: str, work: Path, *, max_seq_len: int, shared: Path, fresh: bool = False,
            log: Callable[[str], None] = print, history: str = "blind",
            counters: bool = False) -> tuple[Path | None, str]:
    """The contract dataset and its one features build (label-blind histories, or with
    ``history="labels"`` label-aware ones), reused from ``work`` only while the source's
    content, the settings and the code are unchanged (``benchmarks.results.built``);
    returns (features dir, "") or (None, why skipped)."""
    from benchmarks.results import built
    from gem.features import build_features
    from gem.features.config import FeaturesConfig
    from gem.utils.digest import path_digest

    data = work / "data"
    if name in REAL_SOURCES:
        folder, needed, adapter, options = REAL_SOURCES[name]
        raw = shared / folder
        paths = [raw / n for n in needed] or [raw]
        if not any(path.is_file() for path in paths):
            return None, f"{' or '.join(map(str, paths))} not found (shared data absent)"
        module, function = adapter.rsplit(".", 1)
        convert = getattr(importlib.import_module(module), function)
        data_digest = built(data, {"raw": path_digest(raw)}, lambda o: convert(raw, o, **options), fresh=fresh)
    elif (Path(name) / "manifest.json").is_file():  # a contract dataset folder (tests, own data)
        data, data_digest = Path(name), path_digest(name)
    else:
        raise ValueError(f"unknown dataset {name!r}; choose from {DATASETS} or give a contract dataset folder")
    if history not in HISTORIES:
        raise ValueError(f"history={history!r}: one of {HISTORIES}")
    cfg = FeaturesConfig(max_seq_len=max_seq_len, num_buckets=2, workers=1, history_labels=history == "labels",
                         counters=counters)

    def build(out: Path) -> None:
        t0 = time.perf_counter()
        build_features(data, out, cfg)
        log(f"[quality/peers] {name}: features built in {time.perf_counter() - t0:.0f}s")

    key = {"data": data_digest, "config": dataclasses.asdict(cfg), "v": CACHE_VERSION}
    features = work / features_name(history, counters, max_seq_len)
    built(features, key, build, fresh=fresh)
    return features, ""


@dataclass
class DatasetRun:
    """One dataset under the protocol: its figures and sizes, and what the scaling
    curves re-score (the test labels, users and every model's test predictions per seed)."""

    figs: dict
    sizes: dict
    test_labels: np.ndarray | None = None
    test_users: np.ndarray | None = None
    predictions: dict[str, list[np.ndarray]] = field(default_factory=dict)


def bench_dataset(name: str, args, work: Path, cache: RunCache,
                  log: Callable[[str], None] = print) -> tuple[dict, dict]:
    run = evaluate_dataset(name, args, work, cache, log)
    return run.figs, run.sizes


def evaluate_dataset(name: str, args, work: Path, cache: RunCache,
                     log: Callable[[str], None] = print) -> DatasetRun:
    started = time.perf_counter()
    label = Path(name).name if Path(name).is_dir() else name
    features, skipped = prepare(name, work / label, max_seq_len=args.max_seq_len, shared=args.shared,
                                fresh=args.fresh, log=log, history=getattr(args, "history", "blind"),
                                counters=getattr(args, "counters", False))
    if features is None:
        log(f"[quality/peers] {label}: skipped: {skipped}")
        return DatasetRun({"skipped": skipped}, {})
    store = ExampleStore.from_features(features)
    sizes: dict = {"examples_in_build": len(store)}
    if args.user_fraction < 1.0:
        kept = user_hash_fraction(store.raw_user, args.user_fraction)
        store = store.subset(np.flatnonzero(kept))
        sizes["user_fraction"] = args.user_fraction
    parts, split = split_parts(store, quantiles=args.quantiles, cuts_iso=args.cut, split_file=args.split_file)
    sizes.update(check_split(store, parts, split))
    rows = {p: np.flatnonzero(parts == p) for p in ("train", "validation", "test")}
    tag = b""  # what a diagnostic run changed, in its cache key
    if getattr(args, "train_fraction", 1.0) < 1.0:  # diagnostics: fewer train rows, the same validation and test
        keep = np.random.default_rng(12345).random(len(rows["train"])) < args.train_fraction
        rows["train"] = rows["train"][keep]
        tag += f"train-fraction={args.train_fraction:g}".encode()
        sizes["ablation"] = f"train rows: a random {args.train_fraction:g} of them (fixed rng)"
        sizes["train_examples_used"] = int(keep.sum())
    if getattr(args, "train_newest", 1.0) < 1.0:  # the scaling curve: the newest share of the train window
        rows["train"] = newest(rows["train"], store.time_us, args.train_newest)
        tag += f"train-newest={args.train_newest:g}".encode()
        sizes["train_window"] = f"the newest {args.train_newest:g} of the train rows (by example time)"
        sizes["train_examples_used"] = len(rows["train"])
    item_col = list(store.spec.sparse).index("item_id")
    # the new items: none of the train rows shows them (whatever --min-id-count maps to 0 besides)
    new_item = store.known_only(rows["train"])[0].sparse[:, item_col] == 0
    store, unknown = store.known_only(rows["train"], getattr(args, "min_id_count", 1))
    if getattr(args, "no_history", False):
        tag += b"no-history"
        store = store.without_history()
        sizes["ablation"] = "no history: every sequence emptied"
    labels = store.labels[:, 0]
    users = store.raw_user
    per_user = np.bincount(np.unique(users[rows["train"]], return_inverse=True)[1])
    sizes.update({
        "split": split, "users": int(len(np.unique(users))),
        "test_users": int(len(np.unique(users[rows["test"]]))),
        "test_users_without_train_rows": int(len(set(users[rows["test"]].tolist()) -
                                                 set(users[rows["train"]].tolist()))),
        "train_examples_per_user_median": float(np.median(per_user)),
        "click_rate": {p: float(labels[r].mean()) for p, r in rows.items()},
        "clicks": {p: int(labels[r].sum()) for p, r in rows.items()},
        "history_len_mean": {p: float(store.lengths[r].mean()) for p, r in rows.items()},
        "unknown_share_after_train_only_ids": unknown,
        "unknown_user_share": {p: float((store.sparse[r, list(store.spec.sparse).index("user_id")] == 0).mean())
                               for p, r in rows.items()},
        "unknown_item_share": {p: float((store.sparse[r, list(store.spec.sparse).index("item_id")] == 0).mean())
                               for p, r in rows.items()},
    })
    log(f"[quality/peers] {label}: {len(rows['train'])} train / {len(rows['validation'])} validation / "
        f"{len(rows['test'])} test examples, cuts {split.get('cuts', split['kind'])}")
    data_key = RunCache.key(examples=hashlib.sha256(store.example_id.tobytes() + parts.astype(str).tobytes()
                                                    + store.sparse.tobytes()
                                                    + tag).hexdigest(),
                            features=json.loads((features / "manifest.json").read_text())["digest"])
    settings = RunSettings(max_epochs=args.max_epochs, batch_size=args.batch_size, schedule=args.schedule,
                           train_preset=args.train_preset, model_preset=args.model_preset,
                           model_overrides=tuple(args.model_set), fuxictr_seq_len=args.fuxictr_seq_len)
    grid = [GridPoint(lr_scale=s, weight_decay=w, history=h) for h in args.grid_history
            for s in args.grid_lr_scale for w in args.grid_weight_decay]
    results: dict = {}
    errors: dict = {}
    for model in args.models:
        t0 = time.perf_counter()
        try:
            results[model] = run_model(model, store, rows, seeds=1 if model in ("lr_ids", "item_ctr") else args.seeds,
                                       grid=grid, settings=settings, cache=cache, data_key=data_key, log=log)
        except Exception as exc:  # noqa: BLE001 - one failing model must not lose the others
            import traceback

            traceback.print_exc()
            errors[model] = f"{type(exc).__name__}: {exc}"
            continue
        test = [baselines.auc(labels[rows["test"]], r["test_pred"]) for r in results[model]["seeds"]]
        log(f"[quality/peers] {label}/{model}: test auc {np.mean(test):.4f} ({time.perf_counter() - t0:.0f}s)")
    test_rows = rows["test"]
    train_users = np.isin(users[test_rows], users[rows["train"]])
    known_item = ~new_item[test_rows]
    groups = {"known_users": train_users, "new_users": ~train_users,  # test rows of users with / without train rows
              "known_items": known_item, "new_items": ~known_item}  # and of items a train row shows / none
    figs = figures(results, labels[test_rows], users[test_rows], replicates=args.replicates,
                   groups={g: m for g, m in groups.items() if m.any() and labels[test_rows][m].std() > 0})
    sizes["test_rows_of_new_users"] = float((~train_users).mean())
    for model, err in errors.items():
        figs[model] = {"error": err}
    figs["verdict"] = verdict(figs)
    sizes["seconds"] = time.perf_counter() - started  # this invocation's, cached runs read back
    done = [r for res in results.values() for r in res.get("runs", res["seeds"])]
    sizes["runs"] = {"total": len(done), "read_from_cache": sum(bool(r.get("cached")) for r in done),
                     # what the runs took when they ran (cached ones at their original time)
                     "model_seconds": float(sum(r["seconds"] for r in done))}
    return DatasetRun(figs, sizes, labels[test_rows], users[test_rows],
                      {m: [r["test_pred"] for r in res["seeds"]] for m, res in results.items()})


def run(args, log: Callable[[str], None] = print) -> dict:
    """The peers' protocol over ``args.datasets``: {"datasets": {...}, "protocol": {...}}."""
    started = time.perf_counter()
    out: dict = {"datasets": {}, "sizes": {}}
    labels = [Path(name).name if Path(name).is_dir() else name for name in args.datasets]
    if getattr(args, "jobs", 1) > 1 and len(args.datasets) > 1:  # one process per dataset
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(args.jobs, len(args.datasets)), mp_context=mp.get_context("spawn")) as pool:
            done = list(pool.map(_bench_one, [(name, args) for name in args.datasets]))
    else:
        done = [_bench_one((name, args)) for name in args.datasets]
    for label, (figs, sizes) in zip(labels, done):
        out["datasets"][label], out["sizes"][label] = figs, sizes
    out["protocol"] = protocol_description(args)
    out["total_seconds"] = time.perf_counter() - started
    return out


def _bench_one(job) -> tuple[dict, dict]:
    name, args = job
    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    return bench_dataset(name, args, work, RunCache(work / "runs"), print)


def protocol_description(args) -> dict:
    return {
        "name": "peers",
        "split": ("explicit file of example ids" if args.split_file else
                  f"explicit time cut points {args.cut}" if args.cut else
                  f"global time split at the {args.quantiles} quantiles of example time") +
                 " (train < cut0 <= validation < cut1 <= test)",
        "history": (HISTORY_TEXT["labels"] if getattr(args, "history", "blind") == "labels"
                    else HISTORY_TEXT["blind"]),
        "taobao_labels": "label=action: click = cart/fav/buy within 3 days, known at the first such action",
        "ids": ("ids no train row shows map to 0 (unknown) in every row" if getattr(args, "min_id_count", 1) <= 1
                else f"ids in fewer than {args.min_id_count} train rows map to 0 (unknown) in every row"),
        "counters": ("every model reads the point-in-time counters (item, advertiser, category, (surface, item), "
                     "user; 1d/7d/30d/all): the deep models as dense features, lr_ids as extra columns, item_ctr "
                     "as the item's click rate so far" if getattr(args, "counters", False) else "none"),
        "task": "click only, for every model (GEM's conversion head weight 0)",
        "selection": (f"deep models: grid lr_scale {list(args.grid_lr_scale)} x weight_decay "
                      f"{list(args.grid_weight_decay)} x history {args.grid_history} "
                      "searched on seed 0's validation AUC; the chosen point rerun "
                      f"on seeds 1..{args.seeds - 1}; up to {args.max_epochs} epochs, lr schedule {args.schedule} "
                      "over them, each seed keeps its best validation epoch; lr_ids C in "
                      f"{list(LR_IDS_C)}, item_ctr " + _item_ctr_grid(args) + " on validation"),
        "order": "the train rows shuffled per (seed, epoch), the same order for every model",
        "intervals": f"95%: bootstrap over test users ({args.replicates} Poisson replicates); GEM minus each model "
                     "paired (same weights), averaged over seeds; *_std: spread over seeds (ddof=1)",
        "seeds": args.seeds, "max_epochs": args.max_epochs, "batch_size": args.batch_size,
        "train_preset": args.train_preset, "model_preset": args.model_preset, "model_overrides": list(args.model_set),
        "max_seq_len": args.max_seq_len, "fuxictr_seq_len": args.fuxictr_seq_len, "threads": args.threads,
        "jobs": getattr(args, "jobs", 1), "no_history": bool(getattr(args, "no_history", False)),
        "train_fraction": getattr(args, "train_fraction", 1.0),
        "train_newest": getattr(args, "train_newest", 1.0), "history_mode": getattr(args, "history", "blind"),
        "user_fraction": args.user_fraction, "models": list(args.models), "peers": list(PEERS),
        "counters_on": bool(getattr(args, "counters", False)), "min_id_count": getattr(args, "min_id_count", 1),
        "references": list(REFERENCES),
    }
