"""Sequence-native peers for the peers' protocol, on the project's jagged attention kernels.

Both read what GEM reads from an ExampleStore: the history (item, label when the store is
label-aware, age), the target item, every sparse id and the dense features. The target is
appended to its history as one more token, so each example is one jagged sequence of
L + 1 tokens (``kernels.jagged_attention``, no padding).

- ``bst``: Behavior Sequence Transformer (Chen et al., 2019): token = item + label +
  time-bucket embedding (BST's position is the time between the event and the target);
  one post-norm transformer block (softmax multi-head attention, LeakyReLU FFN); the
  target token's output joins every other field's embedding and the dense features in an MLP.
- ``hstu``: an HSTU-style ranking model (Zhai et al., 2024; generative-recommenders'
  ranking setup): history tokens = item + label, the target token = its item with no
  label, two HSTU layers (U, V, Q, K = split(SiLU(W1 LN(x))); A = SiLU(QK^T/sqrt(d) +
  relative position bias) V / L, causal, the target seeing the history and itself
  (``num_targets``); x + W2(LN(A) * U)), the target token's output into the same MLP.
  Relative time: the kernels take a position bias table, not a per-pair time bias, so
  the time between each event and the target enters as a bucketed embedding added to
  the event's token (what the target's query sees of each key is its time to the target).

Training is the FuxiCTR peers' (runs.FuxiRun): Adam at 1e-3 times the grid's lr scale,
AdamW decay on the non-embedding parameters, the shared lr schedule, grad-norm clip 10.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import nn

from benchmarks.quality.store import ExampleStore

AGE_BUCKETS = 32  # 0 = the target ("now"); 1.. = log2 of minutes before it
EMBEDDING_INIT_STD = 0.02
NO_LABEL = 0  # the target's label token (and every token of a label-blind history is 1)


def age_bucket(age_s: torch.Tensor) -> torch.Tensor:
    return 1 + torch.log2(1.0 + age_s.clamp(min=0) / 60.0).floor().long().clamp(max=AGE_BUCKETS - 2)


class SequenceBatch:
    """The rows of a store as one jagged sequence per example, its target last."""

    def __init__(self, store: ExampleStore, rows: np.ndarray):
        from gem.features.jagged import ragged_arange

        spec = list(store.spec.sequence)
        lengths = store.lengths[rows]
        pos = ragged_arange(store.offsets[rows], lengths)
        b = len(rows)
        t = torch.from_numpy
        self.sparse = t(np.ascontiguousarray(store.sparse[rows]))
        self.dense = t(np.ascontiguousarray(store.dense[rows]))
        self.labels = t(np.ascontiguousarray(store.labels[rows, 0]))
        with_target = lengths + 1
        self.offsets = t(np.concatenate([[0], np.cumsum(with_target)]).astype(np.int64))
        self.max_len = int(with_target.max()) if b else 1
        hist_at = t(ragged_arange(self.offsets[:-1].numpy(), lengths))
        self.target_at = self.offsets[1:] - 1
        n = int(self.offsets[-1])
        item = torch.zeros(n, dtype=torch.long)
        item[hist_at] = t(store.sequence[spec.index("seq_item_id"), pos])
        item[self.target_at] = self.sparse[:, list(store.spec.sparse).index("item_id")]
        label = torch.full((n,), NO_LABEL, dtype=torch.long)
        label[hist_at] = (t(store.sequence[spec.index("seq_action"), pos]) + 1 if store.spec.history_labels
                          else torch.ones(len(pos), dtype=torch.long))
        age = torch.zeros(n, dtype=torch.long)
        age[hist_at] = age_bucket(t(store.age[pos]).double())
        self.item, self.label, self.age = item, label, age


class _Head(nn.Module):
    """Every sparse field but the item (which the sequence carries) embedded, the dense
    features projected, and the target token's output: an MLP to one logit."""

    def __init__(self, store: ExampleStore, dim: int, hidden=(128, 64)):
        super().__init__()
        names = list(store.spec.sparse)
        self.item_col = names.index("item_id")
        self.fields = nn.ModuleList(nn.Embedding(int(store.spec.sparse[n]), dim) if i != self.item_col
                                    else nn.Identity() for i, n in enumerate(names))
        self.dense = nn.Linear(store.dense.shape[1], dim)
        layers, width = [], dim * (len(names) + 1)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.mlp = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, target: torch.Tensor, batch: SequenceBatch) -> torch.Tensor:
        parts = [target if i == self.item_col else table(batch.sparse[:, i]) for i, table in enumerate(self.fields)]
        return self.mlp(torch.cat(parts + [self.dense(batch.dense)], dim=-1)).squeeze(-1)


class _Tokens(nn.Module):
    def __init__(self, store: ExampleStore, dim: int):
        super().__init__()
        self.item = nn.Embedding(int(store.spec.sparse["item_id"]), dim)
        self.label = nn.Embedding(4, dim)
        self.age = nn.Embedding(AGE_BUCKETS, dim)

    def forward(self, batch: SequenceBatch) -> torch.Tensor:
        return self.item(batch.item) + self.label(batch.label) + self.age(batch.age)


class BST(nn.Module):
    def __init__(self, store: ExampleStore, dim: int = 16, heads: int = 2, ffn: int = 64, layers: int = 1):
        super().__init__()
        self.tokens, self.heads = _Tokens(store, dim), heads
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "qkv": nn.Linear(dim, 3 * dim), "out": nn.Linear(dim, dim), "norm1": nn.LayerNorm(dim),
            "ffn": nn.Sequential(nn.Linear(dim, ffn), nn.LeakyReLU(), nn.Linear(ffn, dim)),
            "norm2": nn.LayerNorm(dim)}) for _ in range(layers))
        self.head = _Head(store, dim)

    def forward(self, batch: SequenceBatch) -> torch.Tensor:
        from kernels import jagged_attention

        x = self.tokens(batch)
        for block in self.blocks:
            q, k, v = block["qkv"](x).view(len(x), 3, self.heads, -1).unbind(1)
            a = jagged_attention(q, k, v, batch.offsets, max_seq_len=batch.max_len)
            x = block["norm1"](x + block["out"](a.reshape(len(x), -1)))
            x = block["norm2"](x + block["ffn"](x))
        return self.head(x[batch.target_at], batch)


class HSTU(nn.Module):
    def __init__(self, store: ExampleStore, dim: int = 16, heads: int = 2, layers: int = 2,
                 max_relative: int = 64):
        super().__init__()
        self.tokens, self.heads, self.dim = _Tokens(store, dim), heads, dim
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "norm_in": nn.LayerNorm(dim), "uvqk": nn.Linear(dim, 4 * dim), "norm_attn": nn.LayerNorm(dim),
            "out": nn.Linear(dim, dim)}) for _ in range(layers))
        self.position_bias = nn.ParameterList(nn.Parameter(torch.zeros(heads, 2 * max_relative + 1))
                                              for _ in range(layers))
        self.head = _Head(store, dim)

    def forward(self, batch: SequenceBatch) -> torch.Tensor:
        from kernels import jagged_attention

        x = self.tokens(batch)
        targets = torch.ones(len(batch.target_at), dtype=torch.long)
        for block, bias in zip(self.blocks, self.position_bias):
            u, v, q, k = nn.functional.silu(block["uvqk"](block["norm_in"](x))).split(self.dim, dim=-1)
            shape = (len(x), self.heads, -1)
            a = jagged_attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), batch.offsets,
                                 max_seq_len=batch.max_len, form="gdpa", activation="silu", causal=True,
                                 attn_bias=bias, num_targets=targets)
            x = x + block["out"](block["norm_attn"](a.reshape(len(x), -1)) * u)
        return self.head(x[batch.target_at], batch)


SEQUENCE_MODELS = {"bst": BST, "hstu": HSTU}


class SequenceRun:
    """A sequence peer under one grid point and seed (the runs.FuxiRun recipe)."""

    BASE_LR = 1e-3

    def __init__(self, kind: str, store: ExampleStore, point, seed: int, settings, steps_per_epoch: int):
        from gem.training.step import lr_factor

        torch.manual_seed(seed)
        self.model, self.store = SEQUENCE_MODELS[kind](store), store
        for module in self.model.modules():
            if isinstance(module, nn.Embedding):  # small, as the FuxiCTR peers' tables (not N(0, 1))
                nn.init.normal_(module.weight, std=EMBEDDING_INIT_STD)
        embeddings = [p for m in self.model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()]
        ids = {id(p) for p in embeddings}
        dense = [p for p in self.model.parameters() if id(p) not in ids]
        lr = self.BASE_LR * point.lr_scale
        self.opt = torch.optim.AdamW([{"params": embeddings, "weight_decay": 0.0},
                                      {"params": dense, "weight_decay": point.weight_decay}], lr=lr)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, functools.partial(
            lr_factor, decay=settings.schedule, total_steps=settings.max_epochs * steps_per_epoch))
        self.config = f"{kind} dim=16 adam lr={lr:g} wd={point.weight_decay:g}"

    def train_epoch(self, order: np.ndarray, batch_size: int) -> float:
        self.model.train()
        losses = []
        for lo in range(0, len(order), batch_size):
            batch = SequenceBatch(self.store, order[lo:lo + batch_size])
            loss = nn.functional.binary_cross_entropy_with_logits(self.model(batch), batch.labels)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
            self.opt.step()
            self.sched.step()
            losses.append(float(loss.detach()))
        return float(np.mean(losses)) if losses else math.nan

    def flops_per_example(self, rows: np.ndarray) -> float:
        from gem.model.flops import count_forward_flops

        self.model.eval()
        batch = SequenceBatch(self.store, rows)
        return count_forward_flops(lambda: self.model(batch)) / max(len(rows), 1)

    @torch.no_grad()
    def predict(self, rows: np.ndarray, batch_size: int) -> np.ndarray:
        self.model.eval()
        out = [torch.sigmoid(self.model(SequenceBatch(self.store, rows[lo:lo + batch_size]))).numpy()
               for lo in range(0, len(rows), batch_size)]
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)
