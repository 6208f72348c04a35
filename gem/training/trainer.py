"""The native training loop: one process or torchrun, torchrec DMP in both.

    result = train("synthetic://2048", "runs/x", *load_train_config("tiny"))

Reads in order: data, model, shard, optimizers, resume, track, loop (step, log,
checkpoint, evaluate), export.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from gem import limits
from gem.config import flatten, run_params
from gem.data.batch import FeatureSpec
from gem.limits import check_sequence_lengths
from gem.model import ModelConfig, build_model, count_parameters
from gem.model.batch_flops import flops_pricer
from gem.protocol import Split
from gem.training.checkpoint import (
    Checkpointer,
    restore_training,
    rng_state,
    set_rng_state,
    training_settings,
    training_tensors,
)
from gem.training.compile_cache import COMPILE_CACHE, compile_cache_counts, use_compile_cache
from gem.training.config import TrainConfig
from gem.training.data import SYNTHETIC_PREFIX, SyntheticLoader, default_synthetic_spec, rank_slice, slice_batch
from gem.training.distributed import (
    DistEnv,
    attach_embedding_optimizer,
    close_distributed,
    dense_memory,
    init_distributed,
    shard_model,
    unwrap,
)
from gem.training.efficiency import EfficiencyMeter, cached_peak_flops, measure_peak_flops, process_start_time
from gem.training.eval_predictions import EVAL_PREDICTIONS, KeptPredictions
from gem.training.parallelize import apply_activation_checkpointing, apply_compile
from gem.training.planning import MIB, format_plan, rank_totals
from gem.training.precision import fixed_precision, precision_trial
from gem.training.step import LossGuard, build_dense_optimizer, eval_step, train_step
from gem.training.threads import thread_tuner
from gem.training.tracking import Tracker
from gem.utils.cache import cache_dir
from gem.utils.outputs import claim_output
from gem.utils.progress import Progress
from gem.utils.progress import mode as progress_mode

if TYPE_CHECKING:
    from gem.training.metrics import SurfaceTaskMetrics

log = logging.getLogger(__name__)
MODEL_DIR = "model"
OUTPUT_KIND = "train-run"


def _earlier_run(folder: Path) -> bool:
    """A run folder written before output markers existed."""
    return (folder / "checkpoints" / "latest").is_file() or (folder / MODEL_DIR / "model_config.json").is_file()


@dataclass
class RunResult:
    out: Path
    steps: int
    eval_metrics: dict[str, float] = field(default_factory=dict)
    train_metrics: dict[str, float] = field(default_factory=dict)
    perf: dict[str, float] = field(default_factory=dict)
    run_id: str | None = None


def make_loader(features: str, cfg: TrainConfig, *, train: bool, split: Split | None = None, part: str = ""):
    """FeatureLoader over a features directory (only the examples of ``part`` of an
    explicit ``split`` when given), or generated examples:
    ``synthetic://N[?rows=R&max_seq_len=L&mean_len=M]`` (R rows per id table)."""
    if features.startswith(SYNTHETIC_PREFIX):
        if split is not None:
            raise ValueError(f"{features}: an explicit split needs a features directory (example ids and times)")
        rest, _, query = features[len(SYNTHETIC_PREFIX):].partition("?")
        opts = dict(item.split("=", 1) for item in query.split("&") if item)
        unknown = sorted(set(opts) - {"rows", "max_seq_len", "mean_len"})
        if unknown:
            raise ValueError(f"{features}: unknown option(s) {unknown}; use rows, max_seq_len, mean_len")
        num = int(rest) if rest else cfg.synthetic_examples
        spec = default_synthetic_spec(int(opts.get("max_seq_len", 16)), int(opts.get("rows", 0)) or None)
        return SyntheticLoader(spec, num, batch_size=cfg.batch_size, shuffle=cfg.shuffle and train,
                               seed=cfg.seed if train else cfg.seed + 1, drop_last=True,
                               mean_len=float(opts.get("mean_len", spec.max_seq_len * 3 / 8)))
    from gem.features.loader import FeatureLoader

    loader = FeatureLoader(features, batch_size=cfg.batch_size, shuffle=cfg.shuffle and train, seed=cfg.seed,
                           num_workers=cfg.num_workers, drop_last=train, shard_order=cfg.shard_order,
                           split=split, part=part)
    if split is not None and not loader.num_examples:
        raise split.empty_part(part, features, loader.manifest.get("window"))
    return loader


def split_parts(split: Split | None, features: str, eval_features: str | None,
                eval_part: str = "") -> tuple[str | None, str]:
    """With an explicit split: training reads part "train"; evaluation reads ``eval_part``
    (default "validation" when the split has one, else "test") of ``eval_features``
    (default: the training window itself)."""
    if split is None:
        return eval_features, ""
    return eval_features or features, split.evaluated_part(eval_part)


def check_trainable(cfg: TrainConfig, loader, features: str) -> None:
    """Refuse, before any step, a run that would train nothing: no full batch in the
    window, or every task the data has weighted 0."""
    from gem.config import ConfigError

    if len(loader) == 0:
        n = getattr(loader, "num_examples", 0)
        raise ConfigError(f"{features}: {n:,} training example(s), not one full batch of batch_size={cfg.batch_size} "
                          "(training drops a last partial batch), so no step would run; lower batch_size")
    # the tasks whose labels the data holds (a window without conversions has all-0 labels there)
    tasks = getattr(loader, "manifest", {}).get("dataset", {}).get("data_tasks") or list(loader.spec.tasks)
    if not any(w > 0 for w, task in zip(cfg.task_weights, loader.spec.tasks) if task in tasks):
        raise ConfigError(f"task_weights={list(cfg.task_weights)}: the tasks of {features} ({', '.join(tasks)}) all "
                          "weigh 0, so the loss is 0 and nothing is learned")


def total_steps(cfg: TrainConfig, loader) -> int:
    """Optimizer steps the run will take (the lr schedule's horizon)."""
    every_epoch = cfg.epochs * len(loader)
    return min(cfg.max_steps, every_epoch) if cfg.max_steps else every_epoch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _gather_full_state(model: nn.Module, env: DistEnv) -> dict[str, torch.Tensor] | None:
    """Unsharded state dict on rank 0 (collective)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    full: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if isinstance(value, DTensor):  # FSDP2's slices of a dense tensor
            full[key] = value.full_tensor().detach().cpu()
        elif isinstance(value, ShardedTensor):
            out = torch.empty(value.size(), dtype=value.dtype, device=env.device) if env.is_main else None
            value.gather(dst=0, out=out)
            if env.is_main:
                full[key] = out.cpu()
        else:
            full[key] = value.detach().cpu().clone()
    return full if env.is_main else None


def export_model(full_state: dict[str, torch.Tensor], model_cfg: ModelConfig, spec: FeatureSpec,
                 out: Path) -> nn.Module:
    """Write ``out/model/`` with gem.model.store (weights.pt, model_config.json,
    feature_spec.json, digests.json); returns the unsharded model."""
    from gem.model.store import save_model

    model = build_model(model_cfg, spec)
    model.load_state_dict(full_state)
    save_model(model, model_cfg, spec, Path(out) / MODEL_DIR)
    return model.eval()


def init_weights(model: nn.Module, source: str, spec: FeatureSpec | None = None, features: str = "") -> None:
    """Start from another model's weights (continued pretraining from the champion):
    a run/model folder or an MLflow model URI, with the same config and vocabularies
    (those of ``spec``, the training window's, checked when given).
    Read through gem.model.store: digests checked, weights-only, nothing unpickled."""
    from gem.features.vocab import check_vocabularies
    from gem.model.store import load_state, resolve

    folder, _, _ = resolve(source)
    state, _, source_spec, _ = load_state(folder)
    if spec is not None:
        check_vocabularies(source_spec.vocab_digests, spec.vocab_digests, model=f"init_from={source}",
                           window=features or "the training window")
        if list(source_spec.dense) != list(spec.dense):
            added = sorted(set(spec.dense) - set(source_spec.dense))
            dropped = sorted(set(source_spec.dense) - set(spec.dense))
            raise ValueError(f"init_from={source!r} reads other dense features than {features or 'the window'} "
                             f"(the window adds {len(added)}: {added[:3]}, drops {len(dropped)}: {dropped[:3]}; "
                             "e.g. point-in-time counters turned on): train a model from scratch on it")
    own = model.state_dict()
    mismatched = sorted(k for k in own if k not in state or state[k].shape != own[k].shape)
    if mismatched:
        raise ValueError(f"init_from={source!r} does not fit this model (config or vocabularies differ): "
                         f"{len(mismatched)} tensors, e.g. {mismatched[:3]}")
    model.load_state_dict(state)
    log.info("initialised from %s", source)


def load_trained_model(out: str | Path) -> nn.Module:
    """The exported, unsharded model of a finished run (gem.model.store: verified, weights-only)."""
    from gem.model.store import load_model

    return load_model(Path(out) / MODEL_DIR).model


def evaluate(model: nn.Module, loader, env: DistEnv, spec: FeatureSpec, *, precision: str = "fp32",
             max_batches: int = 0, keep: KeptPredictions | None = None) -> SurfaceTaskMetrics:
    """``spec``: the model's (its vocabularies must be the window's, else VocabularyMismatch);
    ``keep``: also collects every example's predictions (gem.training.eval_predictions)."""
    from gem.features.vocab import check_vocabularies
    from gem.training.metrics import SurfaceTaskMetrics

    check_vocabularies(spec.vocab_digests, loader.spec.vocab_digests,
                       model=getattr(unwrap(model), "stored_as", "") or "the model",
                       window=str(getattr(loader, "features_dir", "")) or "the evaluation window")
    metrics = SurfaceTaskMetrics(spec.surfaces, spec.tasks, env.device)
    was_training = model.training
    model.eval()
    for i, batch in enumerate(loader):
        if max_batches and i >= max_batches:
            break
        local = rank_slice(batch, env.rank, env.world_size).to(env.device)
        if local.batch_size:
            probs = eval_step(model, local, precision=precision)
            metrics.update(probs, local.labels, local.surface)
            if keep is not None:
                keep.add(local.example_id, probs, local.labels)
    model.train(was_training)
    return metrics


class DeferredMetrics:
    """Training-set metrics kept off the step path: each step's predictions are only
    kept, and folded into a SurfaceTaskMetrics every ``every`` steps in one update. The
    trainer builds it (torchmetrics' import) after its first step: neither in the startup
    before the first step nor in the throughput window after it."""

    def __init__(self, spec: FeatureSpec, device: torch.device, every: int = 64) -> None:
        self.spec, self.device, self.every = spec, device, every
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.metrics: SurfaceTaskMetrics | None = None

    def update(self, probs: torch.Tensor, labels: torch.Tensor, surface: torch.Tensor) -> None:
        self.pending.append((probs, labels, surface))
        if len(self.pending) >= self.every:
            self.flush()

    def flush(self) -> SurfaceTaskMetrics:
        if self.metrics is None:
            from gem.training.metrics import SurfaceTaskMetrics

            self.metrics = SurfaceTaskMetrics(self.spec.surfaces, self.spec.tasks, self.device)
        if self.pending:
            self.metrics.update(*(torch.cat(parts) for parts in zip(*self.pending)))
            self.pending = []
        return self.metrics


def _mean_over_ranks(value: torch.Tensor, env: DistEnv) -> float:
    if env.world_size > 1:
        value = value.clone()
        dist.all_reduce(value)
        value /= env.world_size
    return float(value)


def _sum_over_ranks(env: DistEnv):
    """A reducer summing a list of floats over the ranks (the precision trial's costs)."""
    def reduce(values: list[float]) -> list[float]:
        summed = torch.tensor(values, dtype=torch.float64, device=env.device)
        dist.all_reduce(summed)
        return summed.tolist()
    return reduce


def _step_bar(cfg: TrainConfig, loader, env, done: int) -> Progress | None:
    """The training steps as a bar for the pipeline's console (rank 0). Elsewhere the step
    lines every ``log_every`` steps are the progress: a bar would break them on a terminal."""
    if not env.is_main or progress_mode() != "events":
        return None
    total = cfg.epochs * len(loader)
    bar = Progress(min(total, cfg.max_steps) if cfg.max_steps else total, "train", unit="step")
    if done:
        bar.update(done)  # a resumed run starts where it stopped
    return bar


def train(features: str, out: str | Path, cfg: TrainConfig, model_cfg: ModelConfig, *, resume: bool = False,
          eval_features: str | None = None, close: bool = True, init_from: str | None = None,
          split: Split | None = None, eval_part: str = "") -> RunResult:
    """``split``: train only on its part "train" and evaluate on its ``eval_part`` (see
    split_parts), row for row; a resumed run must have the same split."""
    launch = process_start_time()
    threads_at_start = torch.get_num_threads()
    cfg.validate()
    longest = check_sequence_lengths(features, cfg.allow_long_sequences)  # before the run folder or the model
    eval_features, eval_part = split_parts(split, features, eval_features, eval_part)
    out = Path(out)
    env = init_distributed()
    if cfg.batch_size % env.world_size:
        raise ValueError(f"batch_size={cfg.batch_size} must be divisible by world_size={env.world_size}")
    seed_everything(cfg.seed)
    if env.is_main:
        claim_output(out, OUTPUT_KIND, inputs=[features, eval_features, init_from], legacy=_earlier_run)
    out.mkdir(parents=True, exist_ok=True)

    phases: dict[str, float] = {"perf/startup_imports_s": time.time() - launch}
    mark = time.perf_counter()
    ckpt = Checkpointer(out / "checkpoints", env.rank, env.world_size, cfg.keep_checkpoints)
    saved = ckpt.read_state() if resume else None  # the tensors load once the model is sharded
    if saved is not None and not resumable(saved, os.environ.get("MLFLOW_RUN_ID", "")):
        log.info("the checkpoints in %s belong to MLflow run %s, not to this run %s (its inputs, settings or code "
                 "changed): training anew", out / "checkpoints", saved["progress"]["run_id"],
                 os.environ["MLFLOW_RUN_ID"])
        saved = None
    # The tracking worker process opens the store and the run while the model is built.
    run_id = (saved["progress"]["run_id"] or None) if saved else None
    tracker = Tracker(env.is_main, cfg.tracking_uri or f"sqlite:///{(out / 'mlflow.db').resolve()}",
                      cfg.experiment, cfg.run_name, run_id=run_id, system_metrics=cfg.system_metrics)
    try:
        loader = make_loader(features, cfg, train=True, split=split, part="train")
        check_trainable(cfg, loader, features)
        # a line before the work whose time grows with the histories: the probe's forward, then the first step
        log.info("training: batches of %d, histories of up to %d events (the kernels' tested range: %d); building "
                 "the model, then the first step (a line when it is done, then every %d steps)", cfg.batch_size,
                 longest, limits.MAX_TESTED_SEQ_LEN, cfg.log_every)
        spec = loader.spec
        model = build_model(model_cfg, spec)
        if init_from:
            init_weights(model, init_from, spec, features)
        sizes = count_parameters(model)
        probe = next(iter(make_loader(features, cfg, train=False, split=split, part="train")))
        probe = slice_batch(probe, 0, min(16, probe.batch_size))
        # every trained batch is priced exactly from its history lengths (MFU per window and run)
        flops = flops_pricer(model, probe, cache_dir() / "batch_flops.json")
        train_flops_per_example = 3.0 * flops.counted[0][1] / probe.batch_size
        phases["perf/startup_build_s"], mark = time.perf_counter() - mark, time.perf_counter()
        model.to(env.device)
        if cfg.activation_checkpointing:
            apply_activation_checkpointing(model)
        attach_embedding_optimizer(model, cfg.optim.embedding_lr, cfg.optim.embedding_eps)
        dmp = shard_model(model, env, ebc_sharding=cfg.sharding.ebc, ec_sharding=cfg.sharding.ec,
                          rank_memory_bytes=int(cfg.sharding.rank_memory_mib * MIB),
                          batch_size=cfg.batch_size // env.world_size, dense=cfg.sharding.dense)
        _log_plan(dmp.plan_rows, env, tracker, resumed_at=saved["progress"]["step"] if saved else None)
        if cfg.compile:  # the workspace keeps the compiled code for the next run (gem/training/compile_cache.py)
            use_compile_cache(out.parent / COMPILE_CACHE)
            apply_compile(unwrap(dmp))
        phases["perf/startup_shard_s"], mark = time.perf_counter() - mark, time.perf_counter()
        dense_opt, scheduler = build_dense_optimizer(
            dmp, cfg.optim.dense_lr, cfg.optim.weight_decay, cfg.optim.betas, cfg.optim.warmup_steps,
            decay=cfg.optim.lr_decay, total_steps=total_steps(cfg, loader), min_lr_ratio=cfg.optim.min_lr_ratio)

        progress: dict[str, Any] = {"step": 0, "epoch": 0, "resumed_epoch": -1, "finished": False}
        if saved is not None:
            restore_training(ckpt, Path(saved["path"]), dmp, dense_opt, saved["dense_optimizer"])
            if scheduler is not None:
                scheduler.load_state_dict(saved["scheduler"])
            loader.load_state_dict(saved["loader"])
            set_rng_state(saved["rng"])
            progress.update(step=saved["progress"]["step"], epoch=saved["progress"]["epoch"],
                            finished=bool(saved["progress"].get("finished", False)))
            progress["resumed_epoch"] = progress["epoch"]
            if not progress["finished"] and _epoch_consumed(loader):  # saved at an epoch's last batch
                progress["epoch"], progress["resumed_epoch"] = progress["epoch"] + 1, -1
            log.info("resumed from step %d (epoch %d, saved by %d rank(s), resumed by %d)%s", progress["step"],
                     progress["epoch"], saved["world_size"], env.world_size,
                     ": the run had finished, no step left" if progress["finished"] else "")

        if saved is None:
            tracker.log_params({**run_params(cfg, "train."), **flatten(model_cfg, "model."),
                                **{f"size.{k}_params": v for k, v in sizes.items()},
                                "size.train_flops_per_example": train_flops_per_example,
                                "world_size": env.world_size, "device": str(env.device)})
            tracker.log_input(features, spec.to_dict(), getattr(loader, "num_examples", 0), "training")
            if eval_features:
                tracker.log_input(eval_features, spec.to_dict(), 0, "evaluation")
            if split is not None:
                tracker.log_params({"split.key": split.key, "split.train_examples": loader.num_examples,
                                    "split.eval_part": eval_part})

        # "auto": a few first steps in each precision, the faster kept (gem/training/precision.py)
        trial = precision_trial(cfg.precision, env.device, env.world_size, reduce=_sum_over_ranks(env))
        step_precision = trial.precision()
        # The peak seen before on this machine; measured after the first step when there is
        # none (seconds of matmuls that would otherwise delay the first step).
        peak_dtype = torch.bfloat16 if step_precision == "bf16" else torch.float32
        peak_threads = torch.get_num_threads()  # the peak is per thread count; the tuner may change it
        peak = cached_peak_flops(env.device, peak_dtype) if cfg.measure_peak else None
        measure_after_first_step = cfg.measure_peak and peak is None
        phases["perf/startup_other_s"] = time.perf_counter() - mark
        log.info("startup phases: %s", {k.split("/")[1]: round(v, 2) for k, v in phases.items()})
        meter = EfficiencyMeter(train_flops_per_example, peak or float("nan"), env.world_size, launch)
        task_weights = tuple(cfg.task_weights)
        step = progress["step"]
        last_saved = step
        train_metrics: dict[str, float] = {}
        eval_metrics: dict[str, float] = {}
        done = bool(progress["finished"]) or bool(cfg.max_steps and step >= cfg.max_steps)
        running = None
        evaluator = None
        guard = LossGuard(cfg, env.device, env.world_size)
        tuner = thread_tuner(cfg.threads, env, warmup_steps=max(1, trial.steps_needed))

        kept = None  # the last evaluation's predictions, when they are what scoring the export gives
        bar = _step_bar(cfg, loader, env, step)

        def holdout_eval():  # a fresh loader per evaluation: eval_batches may stop one midway
            nonlocal kept
            loader = make_loader(eval_features, cfg, train=False, split=split, part=eval_part)
            kept = KeptPredictions(loader.manifest["digest"]) if keeps_predictions(cfg, env, split, loader) else None
            metrics = evaluate(dmp, loader, env, spec, precision=fixed_precision(cfg.precision),
                               max_batches=cfg.eval_batches, keep=kept)
            return metrics, {f"eval/{k}": v for k, v in metrics.compute().items()}

        dmp.train()
        for epoch in range(progress["epoch"], cfg.epochs if not done else progress["epoch"]):
            if epoch != progress["resumed_epoch"]:
                loader.set_epoch(epoch)
            progress["epoch"] = epoch
            running = DeferredMetrics(spec, env.device)
            for batch in loader:
                local = rank_slice(batch, env.rank, env.world_size).to(env.device)
                step_flops = 3.0 * flops.forward(batch)
                if tuner is not None:
                    tuner.before_step()
                step_precision = trial.precision()
                meter.step_begin()
                result = train_step(dmp, local, dense_opt, precision=step_precision, task_weights=task_weights,
                                    grad_clip=cfg.optim.grad_clip, scheduler=scheduler)
                meter.step_end(batch.batch_size, step_flops)
                if tuner is not None:
                    tuner.after_step(meter.last_step_seconds, step_flops)
                if trial.chosen is None:
                    trial.after_step(meter.last_step_seconds, step_flops)
                    if trial.chosen == "bf16" and cfg.measure_peak:  # the MFU's peak is bf16's from here
                        peak_dtype = torch.bfloat16
                        meter.peak = cached_peak_flops(env.device, peak_dtype) or measure_peak_flops(
                            env.device, peak_dtype)
                step += 1
                if bar is not None:
                    bar.update()
                guard.observe(result.loss, step)
                if step == progress["step"] + 1:  # this process's first step: progress within one step's time
                    log.info("first step done in %.1fs (batch of %d)", meter.step_seconds, batch.batch_size)
                    if measure_after_first_step:  # once per machine (cached); the MFU of every window needs it
                        meter.peak = measure_peak_flops(env.device, peak_dtype)
                    # one-time work after the first step, outside the throughput window: the
                    # metrics' import (torchmetrics, ~0.7 s: 3.5% of a tiny Ciao run's window)
                    running.flush()
                    meter.restart_window()
                running.update(result.probs, local.labels, local.surface)
                if cfg.log_every and step % cfg.log_every == 0:
                    guard.check()
                    loss = _mean_over_ranks(result.loss, env)
                    window = meter.window()
                    tracker.log_metrics({"train/loss": loss, "train/loss_click": float(result.per_task[0]),
                                         "train/loss_conversion": float(result.per_task[1]),
                                         "train/lr": dense_opt.param_groups[0]["lr"], **window}, step)
                    log.info("step %d epoch %d loss %.4f  %.0f examples/s  MFU %.3f", step, epoch, loss,
                             window["perf/window_examples_per_s"], window["perf/window_mfu"])
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    guard.check()  # never a checkpoint of diverged weights
                    last = bool(cfg.max_steps and step >= cfg.max_steps) or (
                        epoch == cfg.epochs - 1 and _epoch_consumed(loader))
                    _save(ckpt, dmp, dense_opt, scheduler, loader, step, epoch, tracker.run_id, finished=last)
                    last_saved = step
                if cfg.max_steps and step >= cfg.max_steps:
                    done = True
                    break
            guard.check()
            train_metrics = {f"train_epoch/{k}": v for k, v in running.flush().compute().items()}
            tracker.log_metrics({**train_metrics, "epoch": epoch}, step)
            if eval_features:
                evaluator, eval_metrics = holdout_eval()
                tracker.log_metrics(eval_metrics, step)
            if done:
                break
        if bar is not None:
            bar.close()
        if step != last_saved:  # the loader may have rewound at its epoch's end: "finished" says it all
            _save(ckpt, dmp, dense_opt, scheduler, loader, step, progress["epoch"], tracker.run_id, finished=True)
        if running is None and eval_features:  # resumed a finished run: the same weights, evaluated again
            evaluator, eval_metrics = holdout_eval()
        if cfg.measure_peak and step > progress["step"]:
            # measured again (kept when higher): a peak first measured under other jobs' load
            # would overstate every later run's MFU. At the thread count the run started
            # with: the tuner's last choice may be 1 thread, whose peak is half the machine's
            chosen_threads = torch.get_num_threads()
            torch.set_num_threads(peak_threads)
            try:
                meter.peak = measure_peak_flops(env.device, peak_dtype, repeats=2, refresh=True)
            finally:
                torch.set_num_threads(chosen_threads)
        perf = {**meter.summary(), **phases}
        if cfg.compile:
            perf.update({f"perf/compile_cache_{k}": float(v) for k, v in compile_cache_counts().items()})
        perf["perf/threads"] = float(torch.get_num_threads())  # the tuner's last choice when it ran
        perf["perf/bf16"] = float(step_precision == "bf16")  # the precision of the last step (auto's choice)
        if math.isfinite(trial.ratio):  # auto's trial ran
            perf["perf/bf16_step_time_ratio"] = trial.ratio
        tracker.log_metrics(perf, step)
        tracker.log_metrics(dense_memory(dense_opt), step)  # rank 0's (all ranks alike up to rounding)
        full_state = _gather_full_state(dmp, env)
        if env.is_main:
            export_model(full_state, model_cfg, spec, out)
            _keep_predictions(kept, out, spec)
            _log_outputs(tracker, cfg, out, spec, eval_metrics or train_metrics,
                         evaluator if eval_features else (running.flush() if running is not None else None))
        tracker.end()
    except BaseException:
        tracker.end("FAILED")
        raise
    finally:
        torch.set_num_threads(threads_at_start)  # the tuner's choice was for this run's steps only
        if close and not env.launched:
            close_distributed()
    return RunResult(out, step, eval_metrics, train_metrics, perf, tracker.run_id)


def keeps_predictions(cfg: TrainConfig, env: DistEnv, split: Split | None, loader) -> bool:
    """Whether an evaluation's predictions are those scoring the exported model on the
    whole window gives (gem.training.pyfunc.predict_window): one process, fp32, every
    batch, a finished window (content digest), no part of a split."""
    return (env.world_size == 1 and fixed_precision(cfg.precision) == "fp32" and not cfg.eval_batches and split is None
            and bool(getattr(loader, "manifest", {}).get("digest")))


def _keep_predictions(kept: KeptPredictions | None, out: Path, spec: FeatureSpec) -> None:
    """``out/eval_predictions.parquet`` for the exported weights, or none (an older file
    of other weights is removed)."""
    from gem.model.store import verify

    path = out / EVAL_PREDICTIONS
    path.unlink(missing_ok=True)
    if kept is not None and kept.parts:
        kept.write(path, model_digest=verify(out / MODEL_DIR), tasks=spec.tasks)


def _log_plan(rows: list[dict], env: DistEnv, tracker: Tracker, *, resumed_at: int | None) -> None:
    """The sharding plan: printed, and logged to MLflow (sharding/plan.json and a parameter
    per table; a resumed run's, perhaps at another world size, as plan_resumed_at_<step>.json)."""
    if not env.is_main:
        return
    totals = rank_totals(rows)
    log.info("sharding plan over %d rank(s) (tables and their optimizer state):\n%s\nper rank: %s", env.world_size,
             format_plan(rows), ", ".join(f"{r}: {b:,} bytes" for r, b in totals.items()))
    name = "plan.json" if resumed_at is None else f"plan_resumed_at_{resumed_at}.json"
    tracker.log_dict({"tables": rows, "bytes_per_rank": totals, "world_size": env.world_size}, f"sharding/{name}")
    if resumed_at is None:
        tracker.log_params({f"plan.{row['table']}": f"{row['sharding']} on ranks {row['ranks']}" for row in rows})


def _epoch_consumed(loader) -> bool:
    """The loader has yielded every batch of its current epoch."""
    return int(loader.state_dict()["position"]) >= len(loader)


def _save(ckpt: Checkpointer, dmp, dense_opt, scheduler, loader, step: int, epoch: int,
          run_id: str | None, *, finished: bool = False) -> None:
    ckpt.save(step, training_tensors(dmp, dense_opt), {
        **training_settings(dense_opt),
        "scheduler": scheduler.state_dict() if scheduler is not None else {},
        "loader": loader.state_dict(),
        # finished: no step is left (resuming then does none, whatever the loader's position)
        "progress": {"step": step, "epoch": epoch, "run_id": run_id or "", "finished": finished},
    }, rng_state())


def resumable(saved: dict, wanted_run_id: str) -> bool:
    """Whether a checkpoint may be resumed by the run ``wanted_run_id`` (MLFLOW_RUN_ID,
    set by the pipeline's train stage; empty: any). A checkpoint of another run belongs to
    other inputs, settings or code: resuming it would hand back that run's weights (all of
    them when it had finished) under a run that never logs a model."""
    owner = saved.get("progress", {}).get("run_id") or ""
    return not (wanted_run_id and owner and owner != wanted_run_id)


def _log_outputs(tracker: Tracker, cfg: TrainConfig, out: Path, spec: FeatureSpec,
                 metrics: dict[str, float], source: SurfaceTaskMetrics | None) -> None:
    if not tracker.enabled:
        return
    from gem.training.plots import calibration_figure, surface_auc_figure

    plain = {k.split("/", 1)[1]: v for k, v in metrics.items()}
    if source is not None:  # None: a finished run resumed without evaluation data
        tracker.log_figure(calibration_figure(source.calibration_curve()), "plots/calibration.png")
    if plain:
        tracker.log_figure(surface_auc_figure(plain, spec.surfaces, spec.tasks), "plots/auc_per_surface.png")
    tracker.log_dict(metrics, "metrics/final.json")
    if cfg.log_model:
        tracker.log_model(Path(out) / MODEL_DIR)


def train_and_evaluate(features_dir_train: str, features_dir_eval: str, model_cfg: ModelConfig,
                       train_cfg: TrainConfig, out: str | Path | None = None, *, split: Split | None = None,
                       eval_part: str = "") -> dict[str, float]:
    """Train on one features directory, evaluate on another; returns eval metrics
    (``auc/<surface|all>/<task>``, ``ne/...``, ``calibration/...``) plus perf figures."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = train(features_dir_train, out or tmp, train_cfg, model_cfg, eval_features=features_dir_eval,
                       split=split, eval_part=eval_part)
    metrics = {k.split("/", 1)[1]: v for k, v in result.eval_metrics.items()}
    metrics.update(result.perf)
    metrics["steps"] = result.steps
    return metrics
