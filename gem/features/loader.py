"""FeatureLoader: shards of a features build -> gem.data.batch.Batch, deterministic and resumable.

Order of an epoch (seed, epoch, num_workers fixed => the same batches in the same order):
- shards are permuted by ``(seed, epoch)`` (when shuffling) and dealt round-robin to
  S = max(1, num_workers) streams; stream s reads shards ``order[s::S]`` in turn;
- within a shard, examples are permuted by ``(seed, epoch, shard)``; a stream cuts its
  examples into batches of ``batch_size`` (a batch may span two shards of the stream;
  only the stream's last batch can be short, dropped when ``drop_last``);
- batches are emitted round-robin over the streams that still have batches.
num_workers=0 reads the single stream in-process; num_workers=1 gives the same order.
Each worker process owns one stream, so every shard is read once per epoch.

``state_dict()`` records (epoch, batches already yielded); after ``load_state_dict``
iteration resumes with exactly the remaining batches, skipping consumed shards
without reading them.

Sequence of one example: ``history[row][max(0, end - max_seq_len):end]``, see shards.py.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem.data.batch import Batch, FeatureSpec
from gem.data.contract import MANIFEST
from gem.features.jagged import ragged_arange
from gem.features.shards import (
    DENSE_FEATURES, EXAMPLES_FILE, HISTORY_FILE, HISTORY_LISTS, US_PER_S, dense_features,
)
from gem.features.staging import NO_CONVERSION
from gem.features.storage import dir_bytes

STATE_KEYS = ("seed", "batch_size", "num_workers", "shuffle", "drop_last", "shards", "digest")


def read_manifest(features_dir: str | Path) -> dict:
    path = Path(features_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; not a finished features build (run `gem features build`)")
    manifest = json.loads(path.read_text())
    if not str(manifest.get("format", "")).startswith("gem-features/"):
        raise ValueError(f"{path}: not a features manifest (format {manifest.get('format')!r})")
    return manifest


def load_feature_spec(features_dir: str | Path) -> FeatureSpec:
    return FeatureSpec.from_dict(read_manifest(features_dir)["spec"])


@dataclass
class ShardData:
    """One shard in memory: example columns (B_shard,) and flat history columns (H,)."""

    examples: dict[str, np.ndarray]
    history: dict[str, np.ndarray]  # + "event_s": int64 event seconds (floored)
    history_offsets: np.ndarray  # int64 (users + 1,)


def read_shard(shard_dir: Path) -> ShardData:
    examples = pq.read_table(shard_dir / EXAMPLES_FILE)
    history = pq.read_table(shard_dir / HISTORY_FILE)
    flat, offsets = {}, np.zeros(1, dtype=np.int64)
    for name in HISTORY_LISTS:
        column = history.column(name).combine_chunks()
        off = column.offsets.to_numpy().astype(np.int64)
        values = column.values.slice(off[0], off[-1] - off[0])
        if name == "conversion_time":
            values = pc.fill_null(values, NO_CONVERSION)
        flat[name] = values.to_numpy(zero_copy_only=False)
        offsets = off - off[0]
    # event seconds: the row's first event plus the running sum of gaps inside the row
    lengths = np.diff(offsets)
    running = np.cumsum(flat["gap_s"], dtype=np.int64)
    row_start = np.repeat(offsets[:-1], lengths)
    first_s = history.column("first_event_s").to_numpy()
    flat["event_s"] = np.repeat(first_s, lengths) + running - running[row_start] if len(running) else running
    return ShardData(
        examples={name: examples.column(name).to_numpy() for name in examples.column_names},
        history=flat,
        history_offsets=offsets,
    )


def gather(spec: FeatureSpec, shard: ShardData, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Columns of the examples ``idx`` of a shard (B = len(idx), T = sum of lengths):
    sparse (B, F) int64, lengths (B,), sequence (K, T) int64, age (T,) float32,
    dense (B, D) float32, labels (B, 2) float32, surface (B,) int64, example_id (B,)."""
    ex, hist = shard.examples, shard.history
    row = ex["history_row"][idx]
    first = shard.history_offsets[row]
    end = first + ex["history_end"][idx].astype(np.int64)
    start = np.maximum(first, end - spec.max_seq_len)
    lengths = end - start
    g = ragged_arange(start, lengths)
    t_us = ex["event_time"][idx]
    t = np.repeat(t_us, lengths)
    click = hist["click"][g].astype(np.int64)
    # a conversion is known only once it happened: strictly before this impression
    action = np.where(click > 0, 1 + (hist["conversion_time"][g] < t), 0)
    by_key = {
        "seq_item_id": hist["item"][g],
        "seq_event_type": hist["event_type"][g],
        "seq_surface": hist["surface"][g],
        "seq_is_ad": hist["is_ad"][g].astype(np.int64) + 1,  # 1 organic, 2 ad (0 = unknown)
        "seq_action": action,
    }
    sequence = np.stack([by_key[k].astype(np.int64) for k in spec.sequence]) if len(g) else \
        np.zeros((len(spec.sequence), 0), dtype=np.int64)
    history_len = ex["history_len"][idx]
    last_s = hist["event_s"][np.maximum(end - 1, 0)] if len(hist["event_s"]) else np.zeros(len(idx), np.int64)
    dense = dense_features(t_us, history_len, last_s, ex["ad_impressions_before"][idx], ex["ad_clicks_before"][idx])
    return {
        "sparse": np.stack([ex[name][idx].astype(np.int64) for name in spec.sparse], axis=1),
        "lengths": lengths,
        "sequence": sequence,
        "age": ((t - hist["event_s"][g] * US_PER_S) / US_PER_S).astype(np.float32),
        "dense": dense[:, [DENSE_FEATURES.index(name) for name in spec.dense]],
        "labels": np.stack([ex[task][idx] for task in spec.tasks], axis=1).astype(np.float32),
        "surface": ex["surface"][idx].astype(np.int64),
        "example_id": ex["example_id"][idx].astype(np.int64),
    }


def concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts], axis=1 if k == "sequence" else 0) for k in parts[0]}


def to_batch(spec: FeatureSpec, arrays: dict[str, torch.Tensor]) -> Batch:
    b = arrays["surface"].shape[0]
    lengths = arrays["lengths"].long()
    return Batch(
        sparse=KeyedJaggedTensor(keys=list(spec.sparse), values=arrays["sparse"].t().reshape(-1),
                                 lengths=torch.ones(b * len(spec.sparse), dtype=torch.long), stride=b),
        sequence=KeyedJaggedTensor(keys=list(spec.sequence), values=arrays["sequence"].reshape(-1),
                                   lengths=lengths.repeat(len(spec.sequence)), stride=b),
        sequence_age=arrays["age"],
        dense=arrays["dense"],
        surface=arrays["surface"],
        labels=arrays["labels"],
        example_id=arrays["example_id"],
    )


class _Streams(IterableDataset):
    """One stream per DataLoader worker: yields (stream id, tensors) per batch."""

    def __init__(self, loader: "FeatureLoader", epoch: int, skips: list[int]):
        self.loader, self.epoch, self.skips = loader, epoch, skips

    def __iter__(self):
        info = get_worker_info()
        s = info.id if info is not None else 0
        for arrays in self.loader._iter_stream(self.epoch, s, self.skips[s]):
            yield s, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}


class FeatureLoader:
    """Iterable of Batch over the shards of ``features_dir`` (see module docstring)."""

    def __init__(self, features_dir: str | Path, *, batch_size: int, shuffle: bool = True, seed: int = 0,
                 num_workers: int = 0, shards: list[str] | None = None, drop_last: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.features_dir = Path(features_dir)
        self.manifest = read_manifest(self.features_dir)
        self.spec = FeatureSpec.from_dict(self.manifest["spec"])
        entries = {s["name"]: s for s in self.manifest["shards"]}
        names = list(entries) if shards is None else list(shards)
        unknown = [n for n in names if n not in entries]
        if unknown:
            raise ValueError(f"{self.features_dir / MANIFEST}: unknown shard(s) {unknown[:5]}")
        for name in names:
            directory = self.features_dir / "shards" / name
            if not directory.is_dir() or dir_bytes(directory) != entries[name]["bytes"]:
                raise ValueError(f"{directory}: missing or changed since the manifest was written")
        self._index = {name: i for i, name in enumerate(entries)}  # stable per-shard RNG key
        self.shard_names = names
        self._counts = np.array([entries[n]["examples"] for n in names], dtype=np.int64)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.num_workers, self.drop_last = num_workers, drop_last
        self.epoch, self._position = 0, 0

    @property
    def num_examples(self) -> int:
        return int(self._counts.sum())

    @property
    def num_streams(self) -> int:
        return max(1, self.num_workers)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order and restart at its first batch."""
        self.epoch, self._position = int(epoch), 0

    def __len__(self) -> int:
        return len(self._schedule(self.epoch))

    # -- order -----------------------------------------------------------------------
    def _shard_order(self, epoch: int) -> np.ndarray:
        n = len(self.shard_names)
        return np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)

    def _stream_shards(self, epoch: int, stream: int) -> list[int]:
        return [int(i) for i in self._shard_order(epoch)[stream::self.num_streams]]

    def _stream_batches(self, epoch: int, stream: int) -> int:
        total = int(self._counts[self._stream_shards(epoch, stream)].sum())
        full, rest = divmod(total, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _schedule(self, epoch: int) -> np.ndarray:
        """Stream id of every batch of the epoch, in emission order."""
        remaining = [self._stream_batches(epoch, s) for s in range(self.num_streams)]
        out = []
        while any(remaining):
            for s in range(self.num_streams):
                if remaining[s]:
                    out.append(s)
                    remaining[s] -= 1
        return np.asarray(out, dtype=np.int64)

    def _example_order(self, epoch: int, shard: int) -> np.ndarray:
        n = int(self._counts[shard])
        if not self.shuffle:
            return np.arange(n)
        key = self._index[self.shard_names[shard]]
        return np.random.default_rng([self.seed, epoch, key]).permutation(n)

    def _iter_stream(self, epoch: int, stream: int, skip_batches: int) -> Iterator[dict[str, np.ndarray]]:
        skip = skip_batches * self.batch_size
        parts, pending = [], 0
        for shard in self._stream_shards(epoch, stream):
            n = int(self._counts[shard])
            if skip >= n:  # consumed before a resume: not even read
                skip -= n
                continue
            data = read_shard(self.features_dir / "shards" / self.shard_names[shard])
            order = self._example_order(epoch, shard)[skip:]
            skip = 0
            pos = 0
            while pos < len(order):
                take = min(self.batch_size - pending, len(order) - pos)
                parts.append(gather(self.spec, data, order[pos:pos + take]))
                pending += take
                pos += take
                if pending == self.batch_size:
                    yield concat(parts)
                    parts, pending = [], 0
        if pending and not self.drop_last:
            yield concat(parts)

    # -- iteration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        epoch, start = self.epoch, self._position
        schedule = self._schedule(epoch)
        skips = [int((schedule[:start] == s).sum()) for s in range(self.num_streams)]
        if self.num_workers == 0:
            source = ((0, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in a.items()})
                      for a in self._iter_stream(epoch, 0, skips[0]))
        else:
            source = iter(DataLoader(_Streams(self, epoch, skips), batch_size=None, num_workers=self.num_workers))
        buffers: list[deque] = [deque() for _ in range(self.num_streams)]
        for pos in range(start, len(schedule)):
            stream = int(schedule[pos])
            while not buffers[stream]:
                got, arrays = next(source)
                buffers[got].append(arrays)
            arrays = buffers[stream].popleft()
            self._position = pos + 1
            yield to_batch(self.spec, arrays)
        self._position = 0

    # -- checkpointing ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self._position, "seed": self.seed,
                "batch_size": self.batch_size, "num_workers": self.num_workers, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "shards": list(self.shard_names), "digest": self.manifest["digest"]}

    def load_state_dict(self, state: dict) -> None:
        for key in STATE_KEYS:
            if state.get(key) != self.state_dict()[key]:
                raise ValueError(
                    f"loader state was saved with {key}={state.get(key)!r} but this loader has "
                    f"{self.state_dict()[key]!r}; resume needs the same data and settings")
        self.epoch, self._position = int(state["epoch"]), int(state["position"])
