"""A thin LightningModule for single-process training with unsharded tables.

It runs the same ``train_step`` as the native loop (manual optimization: the tables
are updated in backward by the row-wise Adagrad attached with
``apply_optimizer_in_backward``; AdamW handles the rest). Multi-process runs and exact
resume use the native loop (``gem.training.trainer``): torchrec's
DistributedModelParallel owns process groups and sharded state, which Lightning's
strategies would fight.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn

from gem.config import flatten
from gem.model import ModelConfig, build_model
from gem.training.config import TrainConfig
from gem.training.distributed import attach_embedding_optimizer
from gem.training.metrics import SurfaceTaskMetrics
from gem.training.parallelize import apply_activation_checkpointing, apply_compile
from gem.training.precision import fixed_precision
from gem.training.step import build_dense_optimizer, diverged, eval_step, train_step


class GEMLightningModule(pl.LightningModule):
    def __init__(self, model: nn.Module, cfg: TrainConfig) -> None:
        super().__init__()
        self.model, self.cfg = model, cfg
        self.automatic_optimization = False
        attach_embedding_optimizer(model, cfg.optim.embedding_lr, cfg.optim.embedding_eps)
        spec = model.spec
        self.val_metrics = SurfaceTaskMetrics(spec.surfaces, spec.tasks)
        self._scheduler = None

    def configure_optimizers(self):
        optimizer, self._scheduler = build_dense_optimizer(
            self.model, self.cfg.optim.dense_lr, self.cfg.optim.weight_decay, self.cfg.optim.betas,
            self.cfg.optim.warmup_steps, decay=self.cfg.optim.lr_decay,
            total_steps=int(self.trainer.estimated_stepping_batches), min_lr_ratio=self.cfg.optim.min_lr_ratio)
        return optimizer

    def training_step(self, batch, batch_idx: int):
        result = train_step(self.model, batch, self.optimizers(), precision=fixed_precision(self.cfg.precision),
                            task_weights=tuple(self.cfg.task_weights), grad_clip=self.cfg.optim.grad_clip,
                            scheduler=self._scheduler, backward=self.manual_backward)
        if not bool(torch.isfinite(result.loss)):  # stop at the first non-finite loss, naming the step
            raise diverged(self.global_step, self.cfg, float(result.loss))
        self.log_dict({"train/loss": result.loss, "train/loss_click": result.per_task[0],
                       "train/loss_conversion": result.per_task[1]}, batch_size=batch.batch_size)
        return result.loss

    def validation_step(self, batch, batch_idx: int) -> None:
        self.val_metrics.update(eval_step(self.model, batch, precision=fixed_precision(self.cfg.precision)),
                                batch.labels, batch.surface)

    def on_validation_epoch_end(self) -> None:
        metrics = self.val_metrics.compute()
        self.log_dict({f"eval/{k}": v for k, v in metrics.items()})
        self.last_eval = metrics
        self.val_metrics = SurfaceTaskMetrics(self.model.spec.surfaces, self.model.spec.tasks)

    def transfer_batch_to_device(self, batch, device, dataloader_idx: int):
        return batch.to(device)


class _Iterable(torch.utils.data.IterableDataset):
    """Lets Lightning iterate a FeatureLoader-like object without re-batching it."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


def train_lightning(features: str, out: str | Path, cfg: TrainConfig, model_cfg: ModelConfig, *,
                    eval_features: str | None = None, split=None, eval_part: str = ""):
    from lightning.pytorch.loggers import MLFlowLogger

    from gem.limits import check_sequence_lengths
    from gem.training.trainer import RunResult, check_trainable, make_loader, seed_everything, split_parts

    cfg.validate()
    check_sequence_lengths(features, cfg.allow_long_sequences)  # before any work (gem/limits.py)
    seed_everything(cfg.seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    eval_features, eval_part = split_parts(split, features, eval_features, eval_part)
    loader = make_loader(features, cfg, train=True, split=split, part="train")
    check_trainable(cfg, loader, features)
    model = build_model(model_cfg, loader.spec)
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model)
    if cfg.compile:
        apply_compile(model)
    module = GEMLightningModule(model, cfg)
    from gem.tracking import ensure_reachable, redact

    uri = cfg.tracking_uri or f"sqlite:///{(out / 'mlflow.db').resolve()}"
    ensure_reachable(uri)  # bounded: a clear error, not minutes of MLflow retries
    logger = MLFlowLogger(experiment_name=cfg.experiment, run_name=cfg.run_name or None, tracking_uri=uri)
    params = {**flatten(cfg, "train."), **flatten(model_cfg, "model.")}
    logger.log_hyperparams({k: redact(v) for k, v in params.items()})
    trainer = pl.Trainer(
        max_epochs=cfg.epochs, max_steps=cfg.max_steps or -1, logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=max(cfg.log_every, 1),
        accelerator="auto", devices=1, default_root_dir=str(out), num_sanity_val_steps=0,
    )
    batches = torch.utils.data.DataLoader(_Iterable(loader), batch_size=None)
    val = None
    if eval_features:
        from gem.features.vocab import check_vocabularies

        eval_loader = make_loader(eval_features, cfg, train=False, split=split, part=eval_part)
        check_vocabularies(loader.spec.vocab_digests, eval_loader.spec.vocab_digests,
                           model=f"the model trained on {features}", window=str(eval_features))
        val = torch.utils.data.DataLoader(_Iterable(eval_loader), batch_size=None)
    trainer.fit(module, batches, val)
    if val is not None and not hasattr(module, "last_eval"):  # max_steps stopped before an epoch end
        trainer.validate(module, val, verbose=False)
    metrics = {f"eval/{k}": v for k, v in getattr(module, "last_eval", {}).items()}
    return RunResult(out, trainer.global_step, metrics, {}, {}, logger.run_id)
