"""Exact forward FLOPs of any batch from its history lengths, without running the model.

Every FLOP the counter sees (gem/model/flops.py) is a matmul whose size is a constant
times one of: the batch size B; a layer's token count N_l = sum of its lengths; its
attention pairs sum L^2; or a padded B x max L (none of today's layers pads: its
coefficient fits to 0, kept so that a padded layer would be priced too). The lengths
of layer l follow from the batch's (CLS tokens prepended, the pyramid's budget applied),
so the FLOPs are a fixed linear function of those per-batch figures (InputArch does no
matmul on the history tokens; a model that did would fail the fit's check). ``BatchFlops`` finds
its coefficients by counting the model on a few small synthetic batches, then prices
each trained batch with a dot product (microseconds instead of a counted forward). The
fit is checked against every batch it counted, real batches of the window included.

    flops = BatchFlops.fit(model, real=[probe])
    flops.forward(batch)       # == batch_forward_flops(model, batch)
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch import nn

from gem.data.batch import Batch, synthetic_batch
from gem.model.flops import batch_forward_flops

log = logging.getLogger(__name__)
# relative error above which a fit is refused (the counts are integers; a right fit is
# off by float rounding only)
TOLERANCE = 1e-6


def length_profiles(model: nn.Module) -> list[int | None]:
    """The distinct token budgets of ``model``'s sequence layers (None: every token kept).
    The pyramid's clamps compound, so layer l keeps min(budget_0..l) tokens; layers of
    one budget see the same lengths and add no unknown to the fit."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or getattr(cfg, "arch", "gem") != "gem":
        return []
    longest = model.spec.max_seq_len  # a budget no history reaches cuts nothing
    running = {min(cfg.pyramid[: i + 1]) for i in range(cfg.num_layers)} if cfg.pyramid else set()
    cuts = sorted(b for b in running if b < longest)
    return cuts + [None] if len(cuts) < cfg.num_layers else cuts


def length_features(lengths: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """float64 [B, then per budget: N, sum L^2, B * max(max L, 1)], L with the CLS tokens."""
    batch = lengths.numel()
    figures = [float(batch)]
    num_cls = getattr(getattr(model, "cfg", None), "num_cls_tokens", 0)
    for budget in length_profiles(model):
        kept = lengths.long() if budget is None else lengths.long().clamp(max=budget)
        layer = kept + num_cls
        longest = int(layer.max()) if batch else 0
        figures += [float(layer.sum()), float((layer * layer).sum()), float(batch * max(longest, 1))]
    return torch.tensor(figures, dtype=torch.float64)


def probe_batch(model: nn.Module, index: int, seed: int = 0) -> Batch:
    """A synthetic batch of 2 to 6 examples whose longest history cycles through every
    regime of the fit (short, just under and over each pyramid budget, the longest)."""
    spec = model.spec
    budgets = [b for b in length_profiles(model) if b is not None]
    caps = sorted({1, spec.max_seq_len, spec.max_seq_len // 2, *(b - 1 for b in budgets), *(b + 1 for b in budgets)})
    cap = max(1, min(caps[index % len(caps)], spec.max_seq_len))
    gen = torch.Generator().manual_seed(seed + index)
    lengths = torch.randint(0, cap + 1, (2 + (index * 3) % 5,), generator=gen)
    lengths[0] = cap  # the batch's longest is the cap
    return with_lengths(synthetic_batch(spec, len(lengths), seed=seed + index), lengths)


def with_lengths(batch: Batch, lengths: torch.Tensor) -> Batch:
    """``batch`` with histories of ``lengths`` (random ids and ages)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = batch.sequence.keys()
    total = int(lengths.sum())
    values = torch.ones(total * len(keys), dtype=torch.long)  # id 1 exists in every table
    sequence = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths.long().repeat(len(keys)))
    return replace(batch, sequence=sequence, sequence_age=torch.full((total,), 3600.0))


def batch_lengths(batch: Batch) -> torch.Tensor:
    return batch.sequence.lengths()[: batch.batch_size]


class BatchFlops:
    """Forward FLOPs of a batch as coefficients x ``length_features``."""

    def __init__(self, model: nn.Module, coefficients: torch.Tensor) -> None:
        self.model, self.coefficients = model, coefficients
        self.counted: list[tuple[int, float]] = []  # (examples, FLOPs) of the real batches fitted on

    @classmethod
    def fit(cls, model: nn.Module, real: list[Batch] = (), probes: int = 0, seed: int = 0) -> "BatchFlops":
        """Count the model on ``real`` batches and on small synthetic ones of varied sizes and
        lengths (as many as the unknowns, one more without a real batch: the fit is always
        over-determined) and solve for the coefficients; raises ValueError when they do not
        reproduce every count."""
        unknowns = len(length_features(torch.zeros(1, dtype=torch.long), model))
        batches = list(real)
        batches += [probe_batch(model, i, seed) for i in range(probes or unknowns + (not batches))]
        features = torch.stack([length_features(batch_lengths(b), model) for b in batches])
        target = torch.tensor([float(batch_forward_flops(model, b)) for b in batches], dtype=torch.float64)
        scale = features.abs().amax(0).clamp(min=1.0)
        solution = torch.linalg.lstsq(features / scale, target[:, None], driver="gelsd").solution[:, 0]
        fitted = cls(model, solution / scale)
        worst = float(((features @ fitted.coefficients - target).abs() / target.clamp(min=1.0)).max())
        if worst > TOLERANCE:
            raise ValueError(f"the model's FLOPs are not linear in the batch's lengths (off by {worst:.2e}); "
                             "count them with gem.model.flops.batch_forward_flops")
        fitted.counted = [(b.batch_size, float(t)) for b, t in zip(real, target)]
        return fitted

    def forward(self, batch: Batch) -> float:
        lengths = batch_lengths(batch)
        if lengths.numel() <= 1 or not bool(lengths.any()):
            # size-1 einsums (one example, or every history empty) run as elementwise
            # products, which the counter does not count: count those rare batches
            return float(batch_forward_flops(self.model, batch))
        return self.of_lengths(lengths)

    def of_lengths(self, lengths: torch.Tensor) -> float:
        return float(round(float(length_features(lengths, self.model) @ self.coefficients)))


class CountedFlops:
    """The fallback for a model ``BatchFlops`` cannot fit: counts each batch (a forward
    under the FLOP counter, as costly as an evaluation step)."""

    def __init__(self, model: nn.Module, real: list[Batch] = ()) -> None:
        self.model = model
        self.counted = [(b.batch_size, float(batch_forward_flops(model, b))) for b in real]

    def forward(self, batch: Batch) -> float:
        return float(batch_forward_flops(self.model, batch))


def fit_key(model: nn.Module) -> str:
    """What the coefficients depend on: the model's config and input spec (not the
    vocabularies' contents), and torch (its counter's formulas)."""
    spec = {k: v for k, v in model.spec.to_dict().items() if k != "vocab_digests"}
    cfg = getattr(model, "cfg", None)
    raw = json.dumps({"model": asdict(cfg) if cfg is not None else type(model).__name__, "spec": spec,
                      "torch": torch.__version__}, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def flops_pricer(model: nn.Module, probe: Batch, cache: Path | None = None) -> BatchFlops | CountedFlops:
    """``BatchFlops`` for ``model``, checked on ``probe`` (a batch of the training window):
    the coefficients kept in ``cache`` for this model (one counted forward: the probe's),
    else fitted anew (a few small counted forwards more); ``CountedFlops`` (with a
    warning) when no fit reproduces the counts."""
    key = fit_key(model)
    kept = json.loads(cache.read_text()) if cache is not None and cache.is_file() else {}
    if key in kept:
        pricer = BatchFlops(model, torch.tensor(kept[key], dtype=torch.float64))
        counted = float(batch_forward_flops(model, probe))
        if abs(pricer.forward(probe) - counted) <= TOLERANCE * max(counted, 1.0):
            pricer.counted = [(probe.batch_size, counted)]
            return pricer
    try:
        pricer = BatchFlops.fit(model, real=[probe])
    except ValueError as err:
        log.warning("%s: counting every batch's FLOPs instead (one more forward per step)", err)
        return CountedFlops(model, [probe])
    if cache is not None:
        from gem.utils.atomic import write_json

        kept = json.loads(cache.read_text()) if cache.is_file() else {}  # read again: another run may have added
        kept[key] = pricer.coefficients.tolist()
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json(kept, cache)
    return pricer
