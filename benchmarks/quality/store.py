"""Every example of a features build in memory, as the peers' protocol cuts its rows
(benchmarks/quality/peers.py): GEM's batches, the FuxiCTR arrays and the sequence peers'
inputs are all cut from one ExampleStore, so every model sees the same rows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.quality import baselines


@dataclass
class ExampleStore:
    """Every example of a features build in memory, row for row as the loader gives them
    (the most recent ``max_seq_len`` history events): GEM's batches and the FuxiCTR
    arrays are both cut from it, so every model sees the same rows."""

    spec: object  # gem.data.batch.FeatureSpec
    sparse: np.ndarray  # int64 (N, F), columns = spec.sparse
    lengths: np.ndarray  # int64 (N,)
    offsets: np.ndarray  # int64 (N + 1,)
    sequence: np.ndarray  # int64 (K, T), rows = spec.sequence
    age: np.ndarray  # float32 (T,)
    dense: np.ndarray  # float32 (N, D)
    labels: np.ndarray  # float32 (N, tasks)
    surface: np.ndarray  # int64 (N,)
    example_id: np.ndarray  # int64 (N,)
    time_us: np.ndarray  # int64 (N,) example time
    raw_user: np.ndarray  # int64 (N,) the contract's user id (bootstrap clusters)

    def __len__(self) -> int:
        return len(self.example_id)

    @classmethod
    def from_features(cls, features_dir: str | Path) -> "ExampleStore":
        from gem.features.loader import FeatureLoader
        from gem.knowledge.windows import example_keys

        loader = FeatureLoader(features_dir, batch_size=8192, shuffle=False, drop_last=False, shard_order="time")
        spec = loader.spec
        f, k = len(spec.sparse), len(spec.sequence)
        parts: dict[str, list[np.ndarray]] = {n: [] for n in ("sparse", "lengths", "sequence", "age", "dense",
                                                                "labels", "surface", "example_id")}
        for batch in loader:
            b = batch.batch_size
            parts["sparse"].append(batch.sparse.values().view(f, b).T.numpy().astype(np.int64))
            parts["lengths"].append(batch.sequence.lengths().view(k, b)[0].numpy().astype(np.int64))
            parts["sequence"].append(batch.sequence.values().view(k, -1).numpy().astype(np.int64))
            parts["age"].append(batch.sequence_age.numpy())
            parts["dense"].append(batch.dense.numpy())
            parts["labels"].append(batch.labels.numpy())
            parts["surface"].append(batch.surface.numpy().astype(np.int64))
            parts["example_id"].append(batch.example_id.numpy().astype(np.int64))
        arrays = {n: np.concatenate(v, axis=1 if n == "sequence" else 0) for n, v in parts.items()}
        keys = example_keys(features_dir, None).set_index("example_id").loc[arrays["example_id"]]
        time_us = keys["event_timestamp"].astype("int64").to_numpy() // 1000
        return cls(spec=spec, offsets=np.concatenate([[0], np.cumsum(arrays["lengths"])]), time_us=time_us,
                   raw_user=keys["user_id"].to_numpy(np.int64), **arrays)

    def subset(self, rows: np.ndarray) -> "ExampleStore":
        """The examples ``rows`` (a new store, offsets rebuilt)."""
        from gem.features.jagged import ragged_arange

        pos = ragged_arange(self.offsets[rows], self.lengths[rows])
        lengths = self.lengths[rows]
        return dataclasses.replace(
            self, sparse=self.sparse[rows], lengths=lengths, offsets=np.concatenate([[0], np.cumsum(lengths)]),
            sequence=self.sequence[:, pos], age=self.age[pos], dense=self.dense[rows], labels=self.labels[rows],
            surface=self.surface[rows], example_id=self.example_id[rows], time_us=self.time_us[rows],
            raw_user=self.raw_user[rows])

    def known_only(self, train: np.ndarray, min_count: int = 1) -> tuple["ExampleStore", dict]:
        """Ids that no train row shows (as its own feature or, for items, in its history)
        mapped to 0 in every row; returns the store and the shares of rows changed.
        ``min_count`` > 1: also ids in fewer train rows than that (as their own feature;
        an item in a train history keeps its id), so the unknown id 0 is trained on the
        rare ids and means "new or rare" where it is met again."""
        from gem.features.jagged import ragged_arange

        names = list(self.spec.sparse)
        sparse = self.sparse.copy()
        train_pos = ragged_arange(self.offsets[train], self.lengths[train])
        seq_item = list(self.spec.sequence).index("seq_item_id")
        shares = {}
        for j, name in enumerate(names):
            seen = np.bincount(sparse[train, j], minlength=self.spec.sparse[name]) >= min_count
            if name == "item_id":
                seen[self.sequence[seq_item, train_pos]] = True
                item_seen = seen
            unknown = ~seen[sparse[:, j]]
            shares[name] = float(unknown.mean())
            sparse[unknown, j] = 0
        sequence = self.sequence.copy()
        hidden = ~item_seen[sequence[seq_item]]
        sequence[seq_item, hidden] = 0
        shares["history_item"] = float(hidden.mean()) if hidden.size else 0.0
        return dataclasses.replace(self, sparse=sparse, sequence=sequence), shares

    def without_history(self) -> "ExampleStore":
        """Every history emptied (the ablation without the sequence part; the dense
        features, which count the history, stay)."""
        lengths = np.zeros_like(self.lengths)
        return dataclasses.replace(self, lengths=lengths, offsets=np.zeros(len(lengths) + 1, dtype=np.int64),
                                   sequence=self.sequence[:, :0], age=self.age[:0])

    def batch(self, rows: np.ndarray):
        """The rows as one gem.data.batch.Batch."""
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        from gem.data.batch import Batch
        from gem.features.jagged import ragged_arange

        b = len(rows)
        lengths = self.lengths[rows]
        pos = ragged_arange(self.offsets[rows], lengths)
        t = torch.from_numpy
        return Batch(
            sparse=KeyedJaggedTensor(keys=list(self.spec.sparse), values=t(np.ascontiguousarray(self.sparse[rows].T))
                                     .reshape(-1), lengths=torch.ones(b * len(self.spec.sparse), dtype=torch.long),
                                     stride=b),
            sequence=KeyedJaggedTensor(keys=list(self.spec.sequence),
                                       values=t(np.ascontiguousarray(self.sequence[:, pos])).reshape(-1),
                                       lengths=t(lengths).repeat(len(self.spec.sequence)), stride=b),
            sequence_age=t(np.ascontiguousarray(self.age[pos])),
            dense=t(np.ascontiguousarray(self.dense[rows])),
            surface=t(np.ascontiguousarray(self.surface[rows])),
            labels=t(np.ascontiguousarray(self.labels[rows])),
            example_id=t(np.ascontiguousarray(self.example_id[rows])),
        )

    def examples(self, max_len: int) -> baselines.Examples:
        """All rows as the reference models' arrays (item history: the most recent
        ``max_len`` events, right-padded with 0)."""
        from gem.features.jagged import ragged_arange

        n = len(self)
        keep = np.minimum(self.lengths, max_len)
        starts = self.offsets[:-1] + self.lengths - keep
        history = np.zeros((n, max_len), dtype=np.int64)
        rows = np.repeat(np.arange(n), keep)
        cols = np.arange(int(keep.sum())) - np.repeat(np.concatenate([[0], np.cumsum(keep)[:-1]]), keep)
        seq_item = list(self.spec.sequence).index("seq_item_id")
        kept = ragged_arange(starts, keep)
        history[rows, cols] = self.sequence[seq_item, kept]
        action = None
        if self.spec.history_labels:  # each event's label as known at the example: 1 + seq_action, 0 = padding
            action = np.zeros((n, max_len), dtype=np.int64)
            action[rows, cols] = self.sequence[list(self.spec.sequence).index("seq_action"), kept] + 1
        return baselines.Examples(
            sparse=self.sparse, sparse_names=list(self.spec.sparse), cardinality=dict(self.spec.sparse),
            history=history, history_len=keep, dense=self.dense.astype(np.float32),
            dense_names=list(self.spec.dense), labels=self.labels.astype(np.float32), tasks=list(self.spec.tasks),
            history_action=action)

    def label_facts(self) -> tuple[np.ndarray, list[str]]:
        """float32 (N, 5) and their names: what a label-aware history says about its user,
        for the simple baselines (the same facts GEM reads): the user's prior click rate over
        the whole history, shrunk to 0.5 by 2 pseudo-events, and the number of history events
        per label (no click, click, conversion) among the stored ones, log1p; plus the
        click share among them. Zeros for a label-blind store."""
        names = ["prior_click_rate", "log1p_history_no_click", "log1p_history_click",
                 "log1p_history_conversion", "history_click_share"]
        n = len(self)
        if not self.spec.history_labels:
            return np.zeros((n, len(names)), np.float32), names
        dense = list(self.spec.dense)
        impressions = np.expm1(self.dense[:, dense.index("log_user_prior_ad_impressions")].astype(np.float64))
        # dense_features' smoothed rate is (clicks + 1) / (impressions + 50): its clicks back
        clicks = self.dense[:, dense.index("user_prior_ad_ctr")] * (impressions + 50.0) - 1.0
        rate = (np.clip(clicks, 0, None) + 1.0) / (impressions + 2.0)
        action = self.sequence[list(self.spec.sequence).index("seq_action")]
        row = np.repeat(np.arange(n), self.lengths)
        counts = np.stack([np.bincount(row[action == a], minlength=n) for a in (0, 1, 2)], axis=1).astype(np.float64)
        share = (counts[:, 1] + counts[:, 2] + 1.0) / (counts.sum(axis=1) + 2.0)
        return np.column_stack([rate, np.log1p(counts), share]).astype(np.float32), names


def take(ex: baselines.Examples, rows: np.ndarray) -> baselines.Examples:
    return dataclasses.replace(ex, sparse=ex.sparse[rows], history=ex.history[rows], history_len=ex.history_len[rows],
                               dense=ex.dense[rows], labels=ex.labels[rows],
                               history_action=None if ex.history_action is None else ex.history_action[rows],
                               numeric=None if ex.numeric is None else ex.numeric[rows])


def user_hash_fraction(raw_user: np.ndarray, fraction: float) -> np.ndarray:
    """bool (N,): the rows of a deterministic ``fraction`` of the users (splitmix64 of
    the raw id below fraction * 2^64)."""
    if fraction >= 1.0:
        return np.ones(len(raw_user), dtype=bool)
    z = raw_user.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return z < np.uint64(int(fraction * 2.0**64) - 1)
