"""FeatureLoader: shards of a features build -> gem.data.batch.Batch, deterministic and resumable.

Order of an epoch (seed, epoch, num_workers fixed => the same batches in the same order):
- shards are ordered by ``shard_order``: "random" permutes them by ``(seed, epoch)``
  (when shuffling); "time" takes them period by period, oldest first, the buckets of a
  period permuted by ``(seed, epoch)`` (when shuffling);
- shards are dealt round-robin to S = max(1, num_workers) streams; stream s reads
  shards ``order[s::S]`` in turn ("time": its shards of a period day by day, every
  shard's examples of one day before the next day's, so a model trained on a time
  window ends on its freshest day, as a model trained on the live stream would,
  however many days a shard holds);
- within a shard, examples are permuted by ``(seed, epoch, shard)`` ("time": then
  grouped by day, keeping that order within a day); a stream cuts its examples into
  batches of ``batch_size`` (a batch may span two shards of the stream; only the
  stream's last batch can be short, dropped when ``drop_last``);
- batches are emitted round-robin over the streams that still have batches.
num_workers=0 reads the single stream in-process; num_workers=1 gives the same order.
Each worker process owns one stream, so every shard's examples are read once per epoch.

Histories are carried across the shards of a bucket (see shards.py): reading shard
(b, d) also reads the history segments of the shards (b, <= d); each stream keeps the
decoded segments in an LRU cache (``cache_events``).

``split`` + ``part`` (gem.protocol.Split) keep only the examples of one part of an
explicit split (time cut points or a file of example ids), row for row: the order is
then that of those examples alone.

``state_dict()`` records (epoch, batches already yielded); after ``load_state_dict``
iteration resumes with exactly the remaining batches, skipping consumed shards
without reading them.

Sequence of one example: the last ``max_seq_len`` events before its own event (same-time
ties excluded) in its user's rows of those segments, concatenated; see segments.py.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from gem.data.batch import Batch, FeatureSpec
from gem.data.contract import MANIFEST
from gem.errors import UserError
from gem.features.config import SHARD_ORDERS
from gem.features.counters import COUNT_COLUMNS, COUNTER_FEATURES, COUNTER_PREFIX, counter_features
from gem.features.jagged import ragged_arange
from gem.features.segments import (
    BEFORE_COLUMNS,
    FORMAT,
    NO_CLICK_TIME,
    US_PER_S,
    Segment,
    SegmentCache,
    read_examples,
    read_segment,
)
from gem.features.shards import DENSE_FEATURES, dense_features
from gem.features.storage import dir_bytes
from gem.protocol import SPLIT_PARTS, Split

US_PER_DAY = 86_400 * US_PER_S
ALL_DENSE = (*DENSE_FEATURES, *COUNTER_FEATURES)
_SELECTIONS: dict[tuple, tuple[list[np.ndarray], list[list[int]]]] = {}

DEFAULT_CACHE_EVENTS = 4_000_000  # decoded history events kept per stream (24 bytes each)
STATE_KEYS = ("seed", "batch_size", "num_workers", "shuffle", "shard_order", "drop_last", "shards", "digest",
              "split")


class NotAFeaturesWindow(UserError, ValueError):
    """A folder given as a features window that is not a finished build this code reads."""


def read_manifest(features_dir: str | Path) -> dict:
    path = Path(features_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; not a finished features build (run `gem features build`)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise NotAFeaturesWindow(f"{path}: not valid JSON ({exc}); rebuild the features (`gem features build`)") \
            from None
    if not isinstance(manifest, dict) or not str(manifest.get("format", "")).startswith("gem-features/"):
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise NotAFeaturesWindow(f"{path}: not a features manifest (format {found!r}): give a folder written by "
                                 "`gem features build`, not a dataset")
    if manifest["format"] != FORMAT:
        raise NotAFeaturesWindow(f"{path}: features format {manifest['format']!r}, this code reads {FORMAT!r}; "
                                 "rebuild the features (`gem features build`)")
    return manifest


def load_feature_spec(features_dir: str | Path, manifest: dict | None = None) -> FeatureSpec:
    """The window's FeatureSpec; a build from before vocabulary digests were recorded in
    it gets them from its vocab/ files."""
    spec = FeatureSpec.from_dict((manifest or read_manifest(features_dir))["spec"])
    if not spec.vocab_digests:
        from gem.features.vocab import Vocabularies

        spec.vocab_digests = dict(sorted(Vocabularies.read(Path(features_dir)).digests().items()))
    return spec


@dataclass
class ShardData:
    """One shard in memory: example columns (B_shard,) and its users' histories as flat
    columns (H,): each user's stored events from every segment up to the shard's,
    concatenated. An example's whole stored history is history[history_first:history_end]."""

    examples: dict[str, np.ndarray]
    history: dict[str, np.ndarray]  # item, event_type, surface, is_ad, click, hidden, click/conversion_time, event_s
    # the model's per-example inputs of every example, made by the first gather: a batch
    # then takes its rows (~60 small numpy calls a gather, ~3 a batch on day-ordered logs)
    inputs: tuple[FeatureSpec, dict[str, np.ndarray]] | None = None

    def example_inputs(self, spec: FeatureSpec) -> dict[str, np.ndarray]:
        """sparse (B_shard, F) int64, dense (B_shard, D) float32, labels (B_shard, 2)
        float32, surface and example_id (B_shard,) int64, each row from its own
        example's columns alone."""
        if self.inputs is None or self.inputs[0] is not spec:
            self.inputs = (spec, _example_inputs(spec, self))
        return self.inputs[1]


def _example_inputs(spec: FeatureSpec, shard: ShardData) -> dict[str, np.ndarray]:
    ex, visible_index = shard.examples, shard.history["visible_index"]
    rank_end = ex["rank_end"]
    last_s = shard.history["event_s"][visible_index[np.maximum(rank_end - 1, 0)]] if len(visible_index) else \
        np.zeros(len(rank_end), np.int64)
    ad_clicks = ex["ad_clicks_before"] if spec.history_labels else np.zeros(len(rank_end), np.int64)
    dense = dense_features(ex["event_time"], ex["history_len"], last_s, ex["ad_impressions_before"], ad_clicks)
    if any(name.startswith(COUNTER_PREFIX) for name in spec.dense):  # the build's point-in-time counters
        dense = np.concatenate([dense, counter_features({c: ex[c] for c in COUNT_COLUMNS})], axis=1)
    return {
        "sparse": np.stack([ex[name].astype(np.int64) for name in spec.sparse], axis=1),
        "dense": np.ascontiguousarray(dense[:, [ALL_DENSE.index(name) for name in spec.dense]]),
        "labels": np.stack([ex[task] for task in spec.tasks], axis=1).astype(np.float32),
        "surface": ex["surface"].astype(np.int64),
        "example_id": ex["example_id"].astype(np.int64),
    }


def read_shard(shard_dirs: list[Path], cache: SegmentCache | None = None) -> ShardData:
    """The shard ``shard_dirs[-1]``; ``shard_dirs`` are the shards of its bucket up to it,
    in day order, whose segments hold its users' histories."""
    segments = [cache.get(d) if cache is not None else read_segment(d) for d in shard_dirs]
    today = segments[-1]
    ex = read_examples(shard_dirs[-1], today)
    users = np.unique(ex["raw_user_id"])
    user, seg_of, row, src, length, before = _rows_of(users, segments)
    dest = np.concatenate([[0], np.cumsum(length)])
    history = {name: np.empty(int(dest[-1]), dtype=values.dtype) for name, values in today.events.items()}
    for j, seg in enumerate(segments):
        sel = np.flatnonzero(seg_of == j)
        from_idx, to_idx = ragged_arange(src[sel], length[sel]), ragged_arange(dest[sel], length[sel])
        for name, values in history.items():
            values[to_idx] = seg.events[name][from_idx]
    if not len(users):
        history["visible_index"] = np.zeros(0, dtype=np.int64)
        return ShardData(examples=ex, history=history)

    first_entry = np.flatnonzero(np.concatenate([[True], user[1:] != user[:-1]]))
    user_first = dest[first_entry]
    events_before, ads_before, clicks_before = np.add.reduceat(before, first_entry, axis=1)  # on the run's first row
    today_entry = np.zeros(len(today.users["user_id"]), dtype=np.int64)
    today_entry[row[seg_of == len(segments) - 1]] = np.flatnonzero(seg_of == len(segments) - 1)
    own = dest[:-1][today_entry[ex["row"]]] + ex["event"] - today.row_offsets[ex["row"]]
    end = own - ex["ties"]
    u = np.searchsorted(users, ex["raw_user_id"])
    first = user_first[u]
    # hidden rows (role "example") are stored for their own example only: histories,
    # lengths and counts skip them; an example's sequence is ranked over visible rows
    visible = history["hidden"] == 0
    cum_vis = np.concatenate([[0], np.cumsum(visible, dtype=np.int64)])
    is_ad = history["is_ad"].astype(np.int64) * visible
    ad_click = is_ad * history["click"]
    cum_ad = np.concatenate([[0], np.cumsum(is_ad)])
    cum_click = np.concatenate([[0], np.cumsum(ad_click)])
    t_us = ex["event_time"]
    clicks = clicks_before[u] + cum_click[end] - cum_click[first] - _pending_clicks(history, ad_click, first, end, t_us)
    ex.update(history_first=first, history_end=end, rank_first=cum_vis[first], rank_end=cum_vis[end],
              history_len=events_before[u] + cum_vis[end] - cum_vis[first],
              ad_impressions_before=ads_before[u] + cum_ad[end] - cum_ad[first], ad_clicks_before=clicks)
    history["visible_index"] = np.flatnonzero(visible)
    return ShardData(examples=ex, history=history)


def _pending_clicks(history: dict[str, np.ndarray], ad_click: np.ndarray, first: np.ndarray, end: np.ndarray,
                    t_us: np.ndarray) -> np.ndarray:
    """int64 (B,): ad clicks in each example's [first, end) whose label became known only
    at or after the example's time (click_time >= t): not yet known, not counted."""
    delayed = np.flatnonzero((ad_click > 0) & (history["click_time"] != NO_CLICK_TIME))
    out = np.zeros(len(first), dtype=np.int64)
    if not len(delayed) or not len(first):
        return out
    lo, hi = np.searchsorted(delayed, first), np.searchsorted(delayed, end)
    n = np.maximum(hi - lo, 0)
    at = delayed[ragged_arange(lo, n)]
    late = history["click_time"][at] >= np.repeat(t_us, n)
    return np.bincount(np.repeat(np.arange(len(first)), n), weights=late, minlength=len(first)).astype(np.int64)


def _rows_of(users: np.ndarray, segments: list[Segment]) -> list[np.ndarray]:
    """The rows (R,) of ``users`` (sorted raw ids) in every segment, ordered by (user,
    segment): user index, segment index, row, its first event, its events, and the
    run's before-counts (3, R)."""
    parts = []
    for j, seg in enumerate(segments):
        ids = seg.users["user_id"]
        pos = np.minimum(np.searchsorted(users, ids), max(len(users) - 1, 0))
        rows = np.flatnonzero(users[pos] == ids) if len(users) else np.zeros(0, dtype=np.int64)
        start = seg.row_offsets[rows]
        parts.append([pos[rows], np.full(len(rows), j), rows, start, seg.row_offsets[rows + 1] - start])
    columns = [np.concatenate(c) for c in zip(*parts)]
    before = np.concatenate([np.stack([seg.users[c][p[2]] for c in BEFORE_COLUMNS]).astype(np.int64)
                             for seg, p in zip(segments, parts)], axis=1)
    order = np.lexsort((columns[1], columns[0]))
    return [c[order] for c in columns] + [before[:, order]]


def gather(spec: FeatureSpec, shard: ShardData, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Columns of the examples ``idx`` of a shard (B = len(idx), T = sum of lengths):
    sparse (B, F) int64, lengths (B,), sequence (K, T) int64, age (T,) float32,
    dense (B, D) float32, labels (B, 2) float32, surface (B,) int64, example_id (B,)."""
    ex, hist = shard.examples, shard.history
    rank_end = ex["rank_end"][idx]
    rank_start = np.maximum(ex["rank_first"][idx], rank_end - spec.max_seq_len)
    lengths = rank_end - rank_start
    g = hist["visible_index"][ragged_arange(rank_start, lengths)]
    t_us = ex["event_time"][idx]
    t = np.repeat(t_us, lengths)
    # a label is shown only once known: the click at click_time (or its event time, which
    # is before t), the conversion at conversion_time, both strictly before this example
    click = (hist["click"][g] > 0) & (hist["click_time"][g] < t)
    action = np.where(click, 1 + (hist["conversion_time"][g] < t), 0)
    event_type = hist["event_type"][g]
    # an organic row's like/share (1 + index 2, 3) is its engagement label: "view" until known
    event_type = np.where(~click & (event_type >= 3), 2, event_type)
    if not spec.history_labels:  # label-blind: the items acted on, never their outcome
        action = np.zeros_like(action)
        event_type = np.where(event_type >= 3, 2, event_type)
    by_key = {
        "seq_item_id": hist["item"][g],
        "seq_event_type": event_type,
        "seq_surface": hist["surface"][g],
        "seq_is_ad": hist["is_ad"][g].astype(np.int64) + 1,  # 1 organic, 2 ad (0 = unknown)
        "seq_action": action,
    }
    sequence = np.stack([by_key[k].astype(np.int64) for k in spec.sequence]) if len(g) else \
        np.zeros((len(spec.sequence), 0), dtype=np.int64)
    inputs = shard.example_inputs(spec)
    return {
        "sparse": inputs["sparse"][idx],
        "lengths": lengths,
        "sequence": sequence,
        "age": ((t - hist["event_s"][g] * US_PER_S) / US_PER_S).astype(np.float32),
        "dense": inputs["dense"][idx],
        "labels": inputs["labels"][idx],
        "surface": inputs["surface"][idx],
        "example_id": inputs["example_id"][idx],
    }


def concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts], axis=1 if k == "sequence" else 0) for k in parts[0]}


def to_batch(spec: FeatureSpec, arrays: dict[str, torch.Tensor]) -> Batch:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # here: reading arrays needs no torchrec

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
    """One stream per DataLoader worker: yields (stream id, arrays) per batch. NumPy
    arrays, not tensors: they cross to the trainer pickled through the worker's pipe (~100
    KB a tiny batch), where a tensor would be moved into a shared-memory file of its own
    (~10 a batch, more time than building the batch)."""

    def __init__(self, loader: "FeatureLoader", epoch: int, skips: list[int]):
        self.loader, self.epoch, self.skips = loader, epoch, skips

    def __iter__(self):
        info = get_worker_info()
        s = info.id if info is not None else 0
        for arrays in self.loader._iter_stream(self.epoch, s, self.skips[s]):
            yield s, arrays  # made contiguous tensors on the trainer's side


def _as_is(item):
    return item


class FeatureLoader:
    """Iterable of Batch over the shards of ``features_dir`` (see module docstring)."""

    def __init__(self, features_dir: str | Path, *, batch_size: int, shuffle: bool = True, seed: int = 0,
                 num_workers: int = 0, shards: list[str] | None = None, drop_last: bool = False,
                 cache_events: int = DEFAULT_CACHE_EVENTS, shard_order: str = "random",
                 split: Split | None = None, part: str = ""):
        if shard_order not in SHARD_ORDERS:
            raise ValueError(f"shard_order={shard_order!r} must be one of {SHARD_ORDERS}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if split is not None and part not in SPLIT_PARTS:
            raise ValueError(f"part={part!r}: with a split, one of {SPLIT_PARTS}")
        self.features_dir = Path(features_dir)
        self.manifest = read_manifest(self.features_dir)
        self.spec = load_feature_spec(self.features_dir, self.manifest)
        entries = {s["name"]: s for s in self.manifest["shards"]}
        names = list(entries) if shards is None else list(shards)
        unknown = [n for n in names if n not in entries]
        if unknown:
            raise ValueError(f"{self.features_dir / MANIFEST}: unknown shard(s) {unknown[:5]}")
        # a shard's examples read their users' histories from the segments of the earlier
        # shards of their bucket: shard -> the shards of its bucket up to it, in day order
        by_bucket: dict[int, list[dict]] = {}
        for entry in sorted(entries.values(), key=lambda e: e["day"]):
            by_bucket.setdefault(entry["bucket"], []).append(entry)
        self._chains = {e["name"]: [x["name"] for x in chain[:i + 1]]
                        for chain in by_bucket.values() for i, e in enumerate(chain)}
        for name in sorted({d for n in names for d in self._chains[n]}):
            directory = self.features_dir / "shards" / name
            if not directory.is_dir() or dir_bytes(directory) != entries[name]["bytes"]:
                raise ValueError(f"{directory}: missing or changed since the manifest was written")
        self._index = {name: i for i, name in enumerate(entries)}  # stable per-shard RNG key
        self.shard_names = names
        self._days = [entries[n]["day"] for n in names]
        self.shard_order = shard_order
        # examples per day of each shard's period (builds without it: one slice per shard)
        self._by_day = [list(entries[n].get("examples_by_day") or [entries[n]["examples"]]) for n in names]
        self._kept = None  # with a split: per shard, the positions of the examples of the part
        self.split, self.part = split, part
        if split is not None:
            self._kept, self._by_day = self._select(names, split, part)
        self._counts = np.array([sum(d) for d in self._by_day], dtype=np.int64)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.num_workers, self.drop_last, self.cache_events = num_workers, drop_last, cache_events
        self.epoch, self._position = 0, 0

    def _select(self, names: list[str], split: Split, part: str):
        """Per shard, the positions of its examples of ``part`` and their count per day
        (kept for the process's next loader of the same selection: a trainer's probe and
        evaluations read the shards once)."""
        key = (str(self.features_dir.resolve()), self.manifest["digest"], split.key, part, tuple(names))
        if key not in _SELECTIONS:
            while len(_SELECTIONS) >= 4:
                _SELECTIONS.pop(next(iter(_SELECTIONS)))
            _SELECTIONS[key] = self._read_selection(names, split, part)
        return _SELECTIONS[key]

    def _read_selection(self, names: list[str], split: Split, part: str):
        kept, by_day = [], []
        for name, days in zip(names, self._by_day):
            directory = self.features_dir / "shards" / name
            ex = read_examples(directory, read_segment(directory))
            positions = np.flatnonzero(split.parts(ex["example_id"], ex["event_time"]) == part)
            kept.append(positions)
            by_day.append(np.bincount(_day_slots(ex, directory)[positions], minlength=len(days))[:len(days)].tolist()
                          if len(days) > 1 else [len(positions)])
        return kept, by_day

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
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        if self.shard_order == "time":  # stable: a day's shards keep their (permuted) order
            order = order[np.argsort([self._days[i] for i in order], kind="stable")]
        return order

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
        """Positions of the shard's examples (of the split's part) in the epoch's order."""
        n = int(self._counts[shard])
        order = np.arange(n)
        if self.shuffle:
            key = self._index[self.shard_names[shard]]
            order = np.random.default_rng([self.seed, epoch, key]).permutation(n)
        return order if self._kept is None else self._kept[shard][order]

    def _stream_slices(self, epoch: int, stream: int) -> list[tuple[int, int]]:
        """(shard, day of its period or -1 = all) in the order the stream reads them."""
        shards = self._stream_shards(epoch, stream)
        if self.shard_order != "time":
            return [(shard, -1) for shard in shards]
        first = {shard: _day_number(self._days[shard]) for shard in shards}
        slices = [(first[shard] + d, pos, shard, d) for pos, shard in enumerate(shards)
                  for d in range(len(self._by_day[shard])) if self._by_day[shard][d] or len(self._by_day[shard]) == 1]
        return [(shard, d if len(self._by_day[shard]) > 1 else -1) for _, _, shard, d in sorted(slices)]

    def _iter_stream(self, epoch: int, stream: int, skip_batches: int) -> Iterator[dict[str, np.ndarray]]:
        skip = skip_batches * self.batch_size
        parts, pending = [], 0
        cache = SegmentCache(self.cache_events)
        slices = self._stream_slices(epoch, stream)
        last_use = {shard: i for i, (shard, _) in enumerate(slices)}
        open_shards: dict[int, tuple[ShardData, np.ndarray]] = {}  # read, with their order, until their last day
        for i, (shard, day) in enumerate(slices):
            n = int(self._counts[shard] if day < 0 else self._by_day[shard][day])
            if skip >= n:  # consumed before a resume (or empty): not even read
                skip -= n
                if last_use[shard] == i:
                    open_shards.pop(shard, None)
                continue
            if shard not in open_shards:
                chain = self._chains[self.shard_names[shard]]
                data = read_shard([self.features_dir / "shards" / name for name in chain], cache)
                order = self._example_order(epoch, shard)
                if day >= 0:  # grouped by day, the shuffled order kept within each day
                    slots = _day_slots(data.examples, self.features_dir / "shards" / self.shard_names[shard])
                    order = order[np.argsort(slots[order], kind="stable")]
                open_shards[shard] = (data, order)
            data, order = open_shards[shard]
            if day >= 0:
                lo = int(sum(self._by_day[shard][:day]))
                order = order[lo:lo + n]
            if last_use[shard] == i:
                del open_shards[shard]
            order = order[skip:]
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
        for arrays in self.iter_arrays():
            yield to_batch(self.spec, arrays)

    def iter_arrays(self) -> Iterator[dict[str, torch.Tensor]]:
        """The batches as plain tensors, in the same order with the same position: ``sparse``
        [batch, len(spec.sparse)], ``sequence`` [len(spec.sequence), sum(lengths)] with
        ``lengths`` [batch], ``age``, ``dense``, ``surface``, ``labels``, ``example_id``.
        Readers that want no KeyedJaggedTensor (the students) skip importing torchrec."""
        epoch, start = self.epoch, self._position
        schedule = self._schedule(epoch)
        skips = [int((schedule[:start] == s).sum()) for s in range(self.num_streams)]
        if self.num_workers == 0:
            source = ((0, a) for a in self._iter_stream(epoch, 0, skips[0]))
        else:
            source = iter(DataLoader(_Streams(self, epoch, skips), batch_size=None, num_workers=self.num_workers,
                                     collate_fn=_as_is))
        buffers: list[deque] = [deque() for _ in range(self.num_streams)]
        for pos in range(start, len(schedule)):
            stream = int(schedule[pos])
            while not buffers[stream]:
                got, arrays = next(source)
                buffers[got].append(arrays)
            arrays = buffers[stream].popleft()
            self._position = pos + 1
            yield {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
        self._position = 0

    # -- checkpointing ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self._position, "seed": self.seed,
                "batch_size": self.batch_size, "num_workers": self.num_workers, "shuffle": self.shuffle,
                "shard_order": self.shard_order, "drop_last": self.drop_last, "shards": list(self.shard_names),
                "digest": self.manifest["digest"],
                "split": f"{self.split.key}:{self.part}" if self.split is not None else None}

    def load_state_dict(self, state: dict) -> None:
        state = {"shard_order": "random", "split": None, **state}  # states saved before these existed
        for key in STATE_KEYS:
            if state.get(key) != self.state_dict()[key]:
                raise ValueError(
                    f"loader state was saved with {key}={state.get(key)!r} but this loader has "
                    f"{self.state_dict()[key]!r}; resume needs the same data and settings")
        self.epoch, self._position = int(state["epoch"]), int(state["position"])


def _day_number(day: str) -> int:
    import datetime as dt

    return dt.date.fromisoformat(day).toordinal()


def _day_slots(examples: dict[str, np.ndarray], shard_dir: Path) -> np.ndarray:
    """int64 (B,): the day of each example within its shard's period (0 = the first)."""
    start = (_day_number(Path(shard_dir).name.split("-", 1)[1]) - _day_number("1970-01-01")) * US_PER_DAY
    return (examples["event_time"] - start) // US_PER_DAY
