"""One deep model under one grid point and seed, as the peers' protocol trains it
(benchmarks/quality/peers.py): the grid, the shared epoch order, GEM / DLRM and the
FuxiCTR models' training loops, restore-best fitting, and the run cache."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from benchmarks.quality import baselines
from benchmarks.quality.store import ExampleStore

CACHE_VERSION = 1
FLOP_ROWS = 256  # the test rows whose forward FLOPs are counted (real histories, per example)

@dataclass(frozen=True)
class GridPoint:
    lr_scale: float = 1.0
    weight_decay: float = 0.0
    history: bool = True  # False: the model reads no history (every sequence emptied)

    def name(self) -> str:
        return f"lr_x{self.lr_scale:g}_wd{self.weight_decay:g}" + ("" if self.history else "_nohist")

    def key(self) -> dict:
        """The point in run cache keys (``history`` only when off: keys of runs made
        before it was a grid dimension stay valid)."""
        out = dataclasses.asdict(self)
        if self.history:
            del out["history"]
        return out


@dataclass
class RunSettings:
    max_epochs: int = 2
    batch_size: int = 256
    schedule: str = "cosine"  # the dense lr over the max_epochs: "cosine" to 0, or "none"
    train_preset: str = "tiny"
    model_preset: str = "tiny"
    model_overrides: tuple[str, ...] = ()
    fuxictr_seq_len: int = 64
    eval_batch: int = 4096


def epoch_order(train_rows: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """The train rows in the (seed, epoch) order every model of that seed reads."""
    return train_rows[np.random.default_rng([seed, epoch]).permutation(len(train_rows))]


class GemRun:
    """GEM or the DLRM baseline with the trainer's own step (gem.training.step): torchrec
    tables under the fused-in-backward row-wise Adagrad, AdamW on the dense part, the
    train preset's lrs times the grid's scale; unsharded, one process (the Lightning
    engine's set-up), batches cut from the store."""

    def __init__(self, arch: str, store: ExampleStore, point: GridPoint, seed: int, settings: RunSettings,
                 steps_per_epoch: int):
        from gem.model import build_model
        from gem.training.config import load_train_config
        from gem.training.distributed import attach_embedding_optimizer
        from gem.training.step import build_dense_optimizer
        from gem.training.trainer import seed_everything

        cfg, model_cfg = load_train_config(settings.train_preset, [
            f"model_preset={settings.model_preset}", f"model.arch={arch}", f"seed={seed}",
            f"batch_size={settings.batch_size}", *[f"model.{o}" for o in settings.model_overrides]])
        self.cfg, self.store = cfg, store
        seed_everything(seed)
        self.model = build_model(model_cfg, store.spec)
        attach_embedding_optimizer(self.model, cfg.optim.embedding_lr * point.lr_scale, cfg.optim.embedding_eps)
        self.opt, self.sched = build_dense_optimizer(
            self.model, cfg.optim.dense_lr * point.lr_scale, point.weight_decay, cfg.optim.betas,
            cfg.optim.warmup_steps, decay=settings.schedule, total_steps=settings.max_epochs * steps_per_epoch)
        # click only: the peers see no conversion label
        self.task_weights = (1.0, 0.0)
        dense_lr, emb_lr = cfg.optim.dense_lr * point.lr_scale, cfg.optim.embedding_lr * point.lr_scale
        self.config = (f"train={settings.train_preset} model={settings.model_preset} dense_lr={dense_lr:g} "
                       f"embedding_lr={emb_lr:g} wd={point.weight_decay:g}")

    def train_epoch(self, order: np.ndarray, batch_size: int) -> float:
        from gem.training.step import train_step

        self.model.train()
        losses = []
        for lo in range(0, len(order), batch_size):
            result = train_step(self.model, self.store.batch(order[lo:lo + batch_size]), self.opt,
                                task_weights=self.task_weights, grad_clip=self.cfg.optim.grad_clip,
                                scheduler=self.sched)
            losses.append(float(result.per_task[0]))
        return float(np.mean(losses))

    def flops_per_example(self, rows: np.ndarray) -> float:
        from gem.model.flops import batch_forward_flops

        return batch_forward_flops(self.model, self.store.batch(rows)) / max(len(rows), 1)

    @torch.no_grad()
    def predict(self, rows: np.ndarray, batch_size: int) -> np.ndarray:
        from gem.training.step import eval_step

        self.model.eval()
        out = [eval_step(self.model, self.store.batch(rows[lo:lo + batch_size]))[:, 0].numpy()
               for lo in range(0, len(rows), batch_size)]
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


class FuxiRun:
    """A FuxiCTR model (baselines.FUXICTR_MODELS) with its BaseModel.train_step: Adam
    (AdamW with the grid's decay on the non-embedding parameters) at 1e-3 times the grid's
    scale, the same lr schedule as GEM's dense part, grad-norm clipping at 10."""

    BASE_LR = 1e-3

    def __init__(self, kind: str, examples: baselines.Examples, point: GridPoint, seed: int,
                 settings: RunSettings, steps_per_epoch: int, root: str):
        import functools

        from gem.training.step import lr_factor

        fmap = baselines.fuxictr_feature_map(examples, root, max_len=settings.fuxictr_seq_len)
        os.makedirs(os.path.join(root, fmap.dataset_id), exist_ok=True)
        torch.manual_seed(seed)
        self.model = baselines.FUXICTR_MODELS[kind](fmap, root, seed=seed)
        self.model._max_gradient_norm = 10.0  # what BaseModel.fit sets before train_step
        emb = [p for n, p in self.model.named_parameters() if n.startswith("embedding.")]
        dense = [p for n, p in self.model.named_parameters() if not n.startswith("embedding.")]
        lr = self.BASE_LR * point.lr_scale
        self.model.optimizer = torch.optim.AdamW([{"params": emb, "weight_decay": 0.0},
                                                  {"params": dense, "weight_decay": point.weight_decay}], lr=lr)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.model.optimizer, functools.partial(
            lr_factor, decay=settings.schedule, total_steps=settings.max_epochs * steps_per_epoch))
        self.examples = examples
        self.config = f"emb=16 seq_len={settings.fuxictr_seq_len} adam lr={lr:g} wd={point.weight_decay:g}"

    def train_epoch(self, order: np.ndarray, batch_size: int) -> float:
        self.model.train()
        losses = []
        for batch in baselines.fuxictr_batches(self.examples, batch_size, shuffle=False, order=order):
            losses.append(float(self.model.train_step(batch).detach()))
            self.sched.step()
        return float(np.mean(losses))

    def flops_per_example(self, rows: np.ndarray) -> float:
        from gem.model.flops import count_forward_flops

        self.model.eval()
        batch = next(baselines.fuxictr_batches(self.examples, len(rows), shuffle=False, order=rows))
        return count_forward_flops(lambda: self.model(batch)) / max(len(rows), 1)

    @torch.no_grad()
    def predict(self, rows: np.ndarray, batch_size: int) -> np.ndarray:
        self.model.eval()
        out = [self.model(b)["y_pred"].view(-1).numpy()
               for b in baselines.fuxictr_batches(self.examples, batch_size, shuffle=False, order=rows)]
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


def fit_deep(make: Callable[[int], object], rows: dict[str, np.ndarray], labels: np.ndarray, seed: int,
             settings: RunSettings) -> dict:
    """Train up to max_epochs, scoring the validation rows after each epoch; the test rows
    are scored only after an epoch that improved the validation AUC (the selected model
    is the last such epoch's: restore-best). Returns the curve and the test predictions."""
    steps = math.ceil(len(rows["train"]) / settings.batch_size)
    run = make(steps)
    curve, best, best_epoch, test_pred, start = [], -1.0, 0, None, time.perf_counter()
    seen = 0
    for epoch in range(settings.max_epochs):
        t0 = time.perf_counter()
        loss = run.train_epoch(epoch_order(rows["train"], seed, epoch), settings.batch_size)
        seen += len(rows["train"])
        train_s = time.perf_counter() - t0
        val = run.predict(rows["validation"], settings.eval_batch)
        s = baselines.score(labels[rows["validation"]], val)
        curve.append({"epoch": epoch + 1, "train_logloss": loss, "val_auc": s["auc"], "val_ne": s["ne"],
                      "train_seconds": train_s})
        if s["auc"] > best:
            best, best_epoch = s["auc"], epoch + 1
            test_pred = run.predict(rows["test"], settings.eval_batch)
    seconds = time.perf_counter() - start
    return {"curve": curve, "best_epoch": best_epoch, "val_auc": best, "test_pred": test_pred,
            "seconds": seconds, "examples_per_s": seen / sum(c["train_seconds"] for c in curve),
            "config": run.config, "flops_per_example": run.flops_per_example(rows["test"][:FLOP_ROWS])}


# ---- the cache ----

@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    from gem.utils.digest import code_version

    h = hashlib.sha256(code_version().encode())
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


class RunCache:
    """One .json (figures) + .npy (test predictions) per run key under ``root``."""

    def __init__(self, root: Path | None):
        self.root = root
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(**parts) -> str:
        """The run's content key: its parts and the code that computes it (the project's
        sources and this benchmark's), so a run made by other code is never read back."""
        return hashlib.sha256(json.dumps({"v": CACHE_VERSION, "code": _code_digest(), **parts}, sort_keys=True,
                                         default=str).encode()).hexdigest()[:24]

    def get(self, key: str) -> dict | None:
        if self.root is None or not (self.root / f"{key}.json").is_file() or not (self.root / f"{key}.npy").is_file():
            return None
        out = json.loads((self.root / f"{key}.json").read_text())
        out["test_pred"] = np.load(self.root / f"{key}.npy")
        out["cached"] = True
        return out

    def put(self, key: str, result: dict) -> None:
        if self.root is None:
            return
        np.save(self.root / f"{key}.npy.tmp.npy", result["test_pred"])
        os.replace(self.root / f"{key}.npy.tmp.npy", self.root / f"{key}.npy")
        body = {k: v for k, v in result.items() if k not in ("test_pred", "cached")}
        tmp = self.root / f"{key}.json.tmp"
        tmp.write_text(json.dumps(body, default=float))
        os.replace(tmp, self.root / f"{key}.json")
