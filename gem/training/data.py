"""Data for training: the FeatureLoader (gem.features) or a synthetic stand-in with
the same interface, and per-rank slicing of a global batch.

Under torchrun every rank iterates the same global batches and keeps its own
contiguous slice, so a run's result does not depend on the number of ranks.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem.data.batch import Batch, FeatureSpec, synthetic_batch

SYNTHETIC_VOCAB = {"synthetic": "generated ids"}  # synthetic:// ids mean nothing outside such windows

SYNTHETIC_PREFIX = "synthetic://"


def _slice_kjt(kjt: KeyedJaggedTensor, batch_size: int, start: int, end: int) -> KeyedJaggedTensor:
    lengths_KB = kjt.lengths().view(len(kjt.keys()), batch_size)
    offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(kjt.lengths()).view(-1)
    values, lengths = [], []
    for k in range(len(kjt.keys())):
        lo, hi = int(offsets[k * batch_size + start]), int(offsets[k * batch_size + end])
        values.append(kjt.values()[lo:hi])
        lengths.append(lengths_KB[k, start:end])
    return KeyedJaggedTensor.from_lengths_sync(kjt.keys(), torch.cat(values), torch.cat(lengths))


def slice_batch(batch: Batch, start: int, end: int) -> Batch:
    """Examples [start, end) of a batch, every field kept aligned."""
    size = batch.batch_size
    if not 0 <= start <= end <= size:
        raise ValueError(f"slice [{start}, {end}) must lie inside the batch of {size} examples")
    seq_offsets = batch.sequence_offsets()
    lo, hi = int(seq_offsets[start]), int(seq_offsets[end])
    return Batch(
        sparse=_slice_kjt(batch.sparse, size, start, end),
        sequence=_slice_kjt(batch.sequence, size, start, end),
        sequence_age=batch.sequence_age[lo:hi],
        dense=batch.dense[start:end],
        surface=batch.surface[start:end],
        labels=batch.labels[start:end],
        example_id=batch.example_id[start:end],
    )


def rank_slice(batch: Batch, rank: int, world_size: int) -> Batch:
    """Rank ``rank``'s contiguous share of a global batch (sizes differ by at most one)."""
    size = batch.batch_size
    if world_size == 1:
        return batch
    return slice_batch(batch, size * rank // world_size, size * (rank + 1) // world_size)


def default_synthetic_spec(max_seq_len: int = 16, rows: int | None = None) -> FeatureSpec:
    """The synthetic spec; ``rows`` scales the user/item tables (e.g. 10**6 on a GPU)."""
    users, items = (rows, rows) if rows else (500, 400)
    return FeatureSpec(
        sparse={"user_id": users, "country": 8, "item_id": items, "advertiser_id": 30},
        sequence={"hist_item_id": items, "hist_event_type": 4},
        dense=["user_activity", "item_ctr"],
        max_seq_len=max_seq_len,
        vocab_digests=dict(SYNTHETIC_VOCAB),
    )


class SyntheticLoader:
    """FeatureLoader's interface over seeded synthetic batches with a planted signal
    (click rate depends on item id, surface and the history), for tests and demos."""

    def __init__(self, spec: FeatureSpec, num_examples: int, *, batch_size: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = True, mean_len: float = 6.0) -> None:
        if batch_size <= 0 or num_examples < batch_size:
            raise ValueError(f"batch_size={batch_size} must be in [1, num_examples={num_examples}]")
        self.spec, self.num_examples, self.batch_size = spec, num_examples, batch_size
        self.shuffle, self.seed, self.mean_len = shuffle, seed, mean_len
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return self.num_examples // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def _batch(self, index: int) -> Batch:
        order = index
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = int(torch.randperm(len(self), generator=gen)[index])
        batch = synthetic_batch(self.spec, self.batch_size, seed=self.seed * 7919 + order, mean_len=self.mean_len)
        item = batch.sparse.to_dict()["item_id"].values()
        hist_len = batch.sequence.lengths()[: self.batch_size].float()
        logit = -2.0 + 2.5 * (item % 5 == 0).float() + 0.4 * batch.surface.float() + 0.08 * hist_len
        gen = torch.Generator().manual_seed(self.seed * 31 + order + 1)
        click = (torch.rand(self.batch_size, generator=gen) < torch.sigmoid(logit)).float()
        conv = click * (torch.rand(self.batch_size, generator=gen) < 0.3 + 0.4 * (item % 2 == 0).float()).float()
        batch.labels = torch.stack([click, conv], dim=1)
        batch.example_id = torch.arange(self.batch_size) + order * self.batch_size
        return batch

    def __iter__(self) -> Iterator[Batch]:
        while self.position < len(self):
            batch = self._batch(self.position)
            self.position += 1
            yield batch
