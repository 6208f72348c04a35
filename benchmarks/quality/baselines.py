"""Reference models for the quality benchmark, trained on a features build's examples.

- ``lr_ids``: logistic regression (scikit-learn) on one-hot user and item ids;
- ``item_ctr``: each item's click rate, smoothed towards the global rate;
- ``fuxictr_din`` / ``fuxictr_wukong`` / ``fuxictr_dcnv2`` / ``fuxictr_dnn``: DIN, WuKong,
  DCNv2 and a plain DNN written on FuxiCTR's installed building blocks (``BaseModel``,
  ``FeatureMap``, ``FeatureEmbedding``, ``DIN_Attention``, ``CrossNetV2``, ``MLP_Block``).
  The pip package fuxictr 2.3.10 ships only the library (``fuxictr.pytorch.models`` has
  ``BaseModel`` and ``MultiTaskModel``), not the model zoo (``model_zoo/DIN``,
  ``model_zoo/WuKong``, ``model_zoo/DCNv2`` live only in the GitHub repository), so the
  models are assembled here from the papers with FuxiCTR's layers and its ``BaseModel``
  (``compile``/``train_step``/loss, Adam, grad-norm clipping at 10).

All read the same examples as GEM: ``load_examples(features_dir)`` walks the
FeatureLoader once (no shuffling) and returns numpy arrays: the sparse ids of
``FeatureSpec.sparse``, the item-id history (right-padded with 0 to ``max_seq_len``),
the dense features and the labels (click, conversion).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

EPS = 1e-7


@dataclass
class Examples:
    sparse: np.ndarray  # int64 (N, F), columns = keys of spec.sparse
    sparse_names: list[str]
    cardinality: dict[str, int]
    history: np.ndarray  # int64 (N, L), item ids oldest first, right-padded with 0
    history_len: np.ndarray  # int64 (N,)
    dense: np.ndarray  # float32 (N, D)
    dense_names: list[str]
    labels: np.ndarray  # float32 (N, T): click, conversion
    tasks: list[str]
    # label-aware histories: each history event's label as known at the example, 1 + the
    # features' seq_action (1 no click, 2 click, 3 conversion), 0 = padding; None = blind
    history_action: np.ndarray | None = None
    # extra numeric columns for the simple baselines (the same facts the deep models read)
    numeric: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def column(self, name: str) -> np.ndarray:
        return self.sparse[:, self.sparse_names.index(name)]


def load_examples(features_dir: str | Path, *, max_seq_len: int | None = None,
                  batch_size: int = 8192) -> Examples:
    """Every example of a features build, day by day (oldest first), no shuffle, no drop."""
    from gem.features.loader import FeatureLoader

    loader = FeatureLoader(features_dir, batch_size=batch_size, shuffle=False, drop_last=False, shard_order="time")
    spec = loader.spec
    length = min(max_seq_len or spec.max_seq_len, spec.max_seq_len)
    names = list(spec.sparse)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("sparse", "history", "len", "dense", "labels")}
    for batch in loader:
        b = batch.batch_size
        parts["sparse"].append(batch.sparse.values().view(len(names), b).T.numpy().astype(np.int64))
        seq = batch.sequence["seq_item_id"]
        lengths = seq.lengths().long()
        keep = lengths.clamp(max=length)
        # the most recent ``length`` events: drop the oldest ones of longer histories
        offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
        values = seq.values().long()
        padded = torch.zeros(b, length, dtype=torch.long)
        rows = torch.repeat_interleave(torch.arange(b), keep)
        starts = offsets[:-1] + lengths - keep
        pos = torch.arange(int(keep.sum())) - torch.repeat_interleave(
            torch.ops.fbgemm.asynchronous_complete_cumsum(keep)[:-1], keep)
        padded[rows, pos] = values[torch.repeat_interleave(starts, keep) + pos]
        parts["history"].append(padded.numpy())
        parts["len"].append(keep.numpy())
        parts["dense"].append(batch.dense.numpy())
        parts["labels"].append(batch.labels.numpy())
    return Examples(
        sparse=np.concatenate(parts["sparse"]), sparse_names=names, cardinality=dict(spec.sparse),
        history=np.concatenate(parts["history"]), history_len=np.concatenate(parts["len"]),
        dense=np.concatenate(parts["dense"]).astype(np.float32), dense_names=list(spec.dense),
        labels=np.concatenate(parts["labels"]).astype(np.float32), tasks=list(spec.tasks),
    )


# ---- metrics ----

def normalized_entropy(y: np.ndarray, p: np.ndarray) -> float:
    """Mean log loss / entropy of the observed positive rate (1.0 = constant predictor)."""
    y = np.asarray(y, dtype=np.float64)
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1 - EPS)
    rate = float(np.clip(y.mean(), EPS, 1 - EPS))
    logloss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    base = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return float(logloss / base)


def auc(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y)
    if y.min() == y.max():
        return float("nan")
    return float(roc_auc_score(y, p))


def score(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    return {"auc": auc(y, p), "ne": normalized_entropy(y, p), "positive_rate": float(np.mean(y))}


# ---- simple baselines ----

def item_ctr(train: Examples, test: Examples, *, task: int = 0, prior_weight: float = 20.0) -> np.ndarray:
    """Per-item positive rate, shrunk to the global rate with ``prior_weight`` pseudo-examples."""
    items_tr, items_te = train.column("item_id"), test.column("item_id")
    y = train.labels[:, task].astype(np.float64)
    size = int(max(items_tr.max(initial=0), items_te.max(initial=0))) + 1
    clicks = np.bincount(items_tr, weights=y, minlength=size)
    shows = np.bincount(items_tr, minlength=size).astype(np.float64)
    rate = float(y.mean())
    return (clicks[items_te] + prior_weight * rate) / (shows[items_te] + prior_weight)


def one_hot_ids(ex: Examples, names: tuple[str, ...] = ("user_id", "item_id")):
    """scipy CSR (N, sum of cardinalities): one 1 per id column."""
    from scipy import sparse as sp

    cols, offset = [], 0
    for name in names:
        cols.append(ex.column(name) + offset)
        offset += ex.cardinality[name]
    n = len(ex)
    indices = np.stack(cols, axis=1).ravel()
    indptr = np.arange(0, n * len(names) + 1, len(names))
    return sp.csr_matrix((np.ones(len(indices), dtype=np.float64), indices, indptr), shape=(n, offset))


def lr_ids(train: Examples, test: Examples, *, task: int = 0, C: float = 1.0) -> np.ndarray:
    """L2 logistic regression on one-hot (user_id, item_id), plus the examples' ``numeric``
    columns (standardised on train) when they have them. liblinear, not lbfgs: lbfgs
    stops at its first iterate when the base rate is exactly 0.5 (Taobao's one sampled
    negative per click), as the mean-loss gradient per id is below its tolerance."""
    from scipy import sparse as sp
    from sklearn.linear_model import LogisticRegression

    y = train.labels[:, task]
    if y.min() == y.max():
        return np.full(len(test), float(y.mean()))
    if train.numeric is not None:
        mean, scale = train.numeric.mean(axis=0), train.numeric.std(axis=0) + 1e-6

    def design(ex: Examples):
        ids = one_hot_ids(ex)
        if train.numeric is None:
            return ids
        return sp.hstack([ids, sp.csr_matrix((ex.numeric - mean) / scale)], format="csr")

    model = LogisticRegression(C=C, solver="liblinear")
    model.fit(design(train), y)
    return model.predict_proba(design(test))[:, 1]


# ---- FuxiCTR adapter ----

SEQ = "seq_item_id"
ACTION = "seq_action"  # the history events' labels (label-aware histories only)
LABEL = "click"


def fuxictr_feature_map(ex: Examples, root: str | Path, *, dataset_id: str = "gem", max_len: int | None = None):
    """A FuxiCTR FeatureMap over the examples' columns: every sparse id as a categorical
    field (vocab = the features build's cardinality, 0 = unknown), every dense feature as
    a numeric field, and the item history as a sequence field sharing item_id's table
    (padding index 0, so padded positions embed to zeros); with label-aware histories, the
    history's labels as a second sequence field with its own table (``history_embedding``
    adds it to each event's item embedding: the label is a side feature of the item)."""
    from fuxictr.features import FeatureMap

    fmap = FeatureMap(dataset_id, str(root))
    for name in ex.sparse_names:
        fmap.features[name] = {"type": "categorical", "source": "item" if name.startswith("item") else "user",
                               "vocab_size": int(ex.cardinality[name]), "padding_idx": None}
    for name in ex.dense_names:
        fmap.features[name] = {"type": "numeric", "source": "context"}
    fmap.features[SEQ] = {"type": "sequence", "source": "user", "vocab_size": int(ex.cardinality["item_id"]),
                          "max_len": int(max_len or ex.history.shape[1]), "padding_idx": 0,
                          "share_embedding": "item_id"}
    if ex.history_action is not None:
        fmap.features[ACTION] = {"type": "sequence", "source": "user", "vocab_size": 4,
                                 "max_len": int(max_len or ex.history.shape[1]), "padding_idx": 0}
    fmap.labels = [LABEL]
    fmap.num_fields = fmap.get_num_fields()
    fmap.set_column_index()
    return fmap


def fuxictr_batches(ex: Examples, batch_size: int, *, shuffle: bool, seed: int = 0, task: int = 0,
                    order: np.ndarray | None = None):
    """Batches as FuxiCTR models take them: {feature name: tensor, "click": labels}.
    Shuffled over the whole window, FuxiCTR's own convention: with its constant-lr Adam the
    day order GEM's trainer reads scored lower (docs/model-quality.md). ``order``: these
    rows in this order instead (the peers' protocol gives every model the same order)."""
    if order is None:
        order = np.random.default_rng(seed).permutation(len(ex)) if shuffle else np.arange(len(ex))
    sparse, history = torch.from_numpy(ex.sparse), torch.from_numpy(ex.history)
    dense, labels = torch.from_numpy(ex.dense), torch.from_numpy(ex.labels[:, task].copy())
    action = None if ex.history_action is None else torch.from_numpy(ex.history_action)
    for lo in range(0, len(order), batch_size):
        idx = torch.from_numpy(order[lo:lo + batch_size])
        batch = {name: sparse[idx, i] for i, name in enumerate(ex.sparse_names)}
        batch.update({name: dense[idx, i] for i, name in enumerate(ex.dense_names)})
        batch[SEQ] = history[idx]
        if action is not None:
            batch[ACTION] = action[idx]
        batch[LABEL] = labels[idx]
        yield batch


def history_embedding(X: dict, emb: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L, d) history embeddings and their (B, L) mask. Label-aware: each event's item
    embedding plus its label's, the label field taken out of ``emb`` (it joins the item,
    it is not a field of its own), and the mask from the labels, so an event whose item id
    is unknown (0) still shows its label. Blind: the item embeddings, masked where padded."""
    history = emb[SEQ]
    if ACTION in emb:
        history = history + emb.pop(ACTION)
        return history, (X[ACTION] > 0).float()
    return history, (X[SEQ] > 0).float()


def _fields_in(feature_map) -> int:
    """Fields the models embed: the label sequence joins the item history, not a field."""
    return feature_map.num_fields - (ACTION in feature_map.features)


def _base_kwargs(root: str | Path, model_id: str) -> dict:
    return dict(model_id=model_id, gpu=-1, verbose=0, model_root=str(root), metrics=["logloss", "AUC"])


def _fields(fmap, exclude: tuple[str, ...] = ()) -> list[str]:
    return [k for k in fmap.features if k not in exclude]


def make_din(fmap, root: str | Path, *, embedding_dim: int = 16, attention_units=(32,),
             dnn_units=(128, 64), seed: int = 0):
    """DIN (Zhou et al., 2018): the target item attends over the item history with an
    MLP on [target, event, target - event, target * event] (FuxiCTR's DIN_Attention,
    unnormalised weights as in the paper); the pooled history joins every field's
    embedding in an MLP with Dice activations."""
    from fuxictr.pytorch.layers import DIN_Attention, FeatureEmbedding, MLP_Block
    from fuxictr.pytorch.layers.activations import Dice
    from fuxictr.pytorch.models import BaseModel

    class DIN(BaseModel):
        def __init__(self, feature_map):
            super().__init__(feature_map, **_base_kwargs(root, "DIN"))
            self.embedding = FeatureEmbedding(feature_map, embedding_dim)
            self.attention = DIN_Attention(embedding_dim, attention_units=list(attention_units),
                                           hidden_activations="Dice", use_softmax=False)
            inputs = _fields_in(feature_map) * embedding_dim  # the sequence slot holds the pooled history
            self.dnn = MLP_Block(inputs, output_dim=1, hidden_units=list(dnn_units),
                                 hidden_activations=[Dice(u) for u in dnn_units])
            self.compile("adam", "binary_crossentropy", 1e-3)
            self.reset_parameters()
            self.model_to_device()

        def forward(self, inputs):
            X = self.get_inputs(inputs)
            emb = self.embedding.embedding_layer(X)
            history, mask = history_embedding(X, emb)  # (B, L, d); padded positions are zero rows
            emb[SEQ] = self.attention(emb["item_id"], history, mask)
            flat = self.embedding.embedding_layer.dict2tensor(emb, flatten_emb=True)
            return {"y_pred": self.output_activation(self.dnn(flat))}

    torch.manual_seed(seed)
    return DIN(fmap)


class _WuKongLayer(nn.Module):
    """One WuKong layer (Zang et al., 2024): a factorization-machine block (pairwise dot
    products of the n input embeddings, low-rank projected, MLP -> n_f embeddings) next
    to a linear-compress block (a learned mix of the inputs -> n_l embeddings); concat,
    plus a residual (projected when the width changes), then LayerNorm."""

    def __init__(self, n_in: int, n_f: int, n_l: int, dim: int, rank: int, hidden: int):
        super().__init__()
        from fuxictr.pytorch.layers import MLP_Block

        self.n_f, self.dim = n_f, dim
        self.proj = nn.Linear(n_in, rank, bias=False)  # Y = X^T P: the optimised FM of the paper
        self.fmb = MLP_Block(n_in * rank, output_dim=n_f * dim, hidden_units=[hidden], hidden_activations="ReLU")
        self.lcb = nn.Linear(n_in, n_l, bias=False)
        self.residual = nn.Linear(n_in, n_f + n_l, bias=False) if n_in != n_f + n_l else None
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        interactions = torch.bmm(x, self.proj(x.transpose(1, 2)))  # (B, n, rank) = X (X^T P)
        fm = self.fmb(interactions.flatten(1)).view(-1, self.n_f, self.dim)
        lc = self.lcb(x.transpose(1, 2)).transpose(1, 2)
        res = x if self.residual is None else self.residual(x.transpose(1, 2)).transpose(1, 2)
        return self.norm(torch.cat([fm, lc], dim=1) + res)


def make_wukong(fmap, root: str | Path, *, embedding_dim: int = 16, layers: int = 2, n_f: int = 8, n_l: int = 8,
                rank: int = 8, hidden: int = 128, dnn_units=(128, 64), seed: int = 0):
    """WuKong on FuxiCTR's FeatureEmbedding: every field one embedding (the item history
    mean-pooled over its non-padded events), a stack of WuKong layers, then an MLP."""
    from fuxictr.pytorch.layers import FeatureEmbedding, MLP_Block
    from fuxictr.pytorch.models import BaseModel

    class WuKong(BaseModel):
        def __init__(self, feature_map):
            super().__init__(feature_map, **_base_kwargs(root, "WuKong"))
            self.embedding = FeatureEmbedding(feature_map, embedding_dim)
            n = _fields_in(feature_map)
            blocks = []
            for _ in range(layers):
                blocks.append(_WuKongLayer(n, n_f, n_l, embedding_dim, rank, hidden))
                n = n_f + n_l
            self.layers = nn.Sequential(*blocks)
            self.dnn = MLP_Block(n * embedding_dim, output_dim=1, hidden_units=list(dnn_units),
                                 hidden_activations="ReLU")
            self.compile("adam", "binary_crossentropy", 1e-3)
            self.reset_parameters()
            self.model_to_device()

        def forward(self, inputs):
            fields = _pooled_fields(self, inputs)  # (B, n, d)
            return {"y_pred": self.output_activation(self.dnn(self.layers(fields).flatten(1)))}

    torch.manual_seed(seed)
    return WuKong(fmap)


def _pooled_fields(module, inputs) -> torch.Tensor:
    """(B, n, d): every field's embedding, the item history mean-pooled over its
    non-padded events (what FuxiCTR's non-sequence models do with a sequence field)."""
    X = module.get_inputs(inputs)
    emb = module.embedding.embedding_layer(X)
    history, mask = history_embedding(X, emb)
    mask = mask.unsqueeze(-1)
    emb[SEQ] = (history * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    return module.embedding.embedding_layer.dict2tensor(emb, flatten_emb=False)


def make_dnn(fmap, root: str | Path, *, embedding_dim: int = 16, dnn_units=(128, 64), seed: int = 0):
    """DNN (the plain embedding + MLP baseline of the CTR literature): every field's
    embedding (history mean-pooled) concatenated into an MLP."""
    from fuxictr.pytorch.layers import FeatureEmbedding, MLP_Block
    from fuxictr.pytorch.models import BaseModel

    class DNN(BaseModel):
        def __init__(self, feature_map):
            super().__init__(feature_map, **_base_kwargs(root, "DNN"))
            self.embedding = FeatureEmbedding(feature_map, embedding_dim)
            self.dnn = MLP_Block(_fields_in(feature_map) * embedding_dim, output_dim=1,
                                 hidden_units=list(dnn_units), hidden_activations="ReLU")
            self.compile("adam", "binary_crossentropy", 1e-3)
            self.reset_parameters()
            self.model_to_device()

        def forward(self, inputs):
            return {"y_pred": self.output_activation(self.dnn(_pooled_fields(self, inputs).flatten(1)))}

    torch.manual_seed(seed)
    return DNN(fmap)


def make_dcnv2(fmap, root: str | Path, *, embedding_dim: int = 16, cross_layers: int = 3, dnn_units=(128, 64),
               seed: int = 0):
    """DCNv2 (Wang et al., 2021), parallel structure as FuxiCTR's default: a cross network
    of full-rank layers (``CrossNetV2``: x_{l+1} = x_0 * (W x_l + b) + x_l) beside an MLP,
    both over the concatenated field embeddings (history mean-pooled), then one logit."""
    from fuxictr.pytorch.layers import CrossNetV2, FeatureEmbedding, MLP_Block
    from fuxictr.pytorch.models import BaseModel

    class DCNv2(BaseModel):
        def __init__(self, feature_map):
            super().__init__(feature_map, **_base_kwargs(root, "DCNv2"))
            self.embedding = FeatureEmbedding(feature_map, embedding_dim)
            width = _fields_in(feature_map) * embedding_dim
            self.cross = CrossNetV2(width, cross_layers)
            self.dnn = MLP_Block(width, output_dim=None, hidden_units=list(dnn_units), hidden_activations="ReLU")
            self.fc = nn.Linear(width + dnn_units[-1], 1)
            self.compile("adam", "binary_crossentropy", 1e-3)
            self.reset_parameters()
            self.model_to_device()

        def forward(self, inputs):
            flat = _pooled_fields(self, inputs).flatten(1)
            logit = self.fc(torch.cat([self.cross(flat), self.dnn(flat)], dim=-1))
            return {"y_pred": self.output_activation(logit)}

    torch.manual_seed(seed)
    return DCNv2(fmap)


FUXICTR_MODELS = {"din": make_din, "wukong": make_wukong, "dcnv2": make_dcnv2, "dnn": make_dnn}


def train_fuxictr(kind: str, train: Examples, test: Examples, *, epochs: int = 2, batch_size: int = 512,
                  task: int = 0, seed: int = 0, max_len: int | None = None, **model_kwargs) -> dict:
    """Train a FuxiCTR model (``kind`` in FUXICTR_MODELS) with its BaseModel.train_step;
    returns {"pred": test probabilities, "train_seconds", "train_examples_seen"}."""
    with tempfile.TemporaryDirectory() as root:
        fmap = fuxictr_feature_map(train, root, max_len=max_len)
        os.makedirs(os.path.join(root, fmap.dataset_id), exist_ok=True)
        build = FUXICTR_MODELS[kind]
        model = build(fmap, root, seed=seed, **model_kwargs)
        model._max_gradient_norm = 10.0  # what BaseModel.fit sets before train_step
        model.train()
        seen, start = 0, time.perf_counter()
        for epoch in range(epochs):
            for batch in fuxictr_batches(train, batch_size, shuffle=True, seed=seed + epoch, task=task):
                model.train_step(batch)
                seen += len(batch[LABEL])
        seconds = time.perf_counter() - start
        model.eval()
        preds = []
        with torch.no_grad():
            for batch in fuxictr_batches(test, 4096, shuffle=False, task=task):
                preds.append(model(batch)["y_pred"].view(-1).numpy())
    return {"pred": np.concatenate(preds).astype(np.float64), "train_seconds": seconds, "train_examples_seen": seen}
