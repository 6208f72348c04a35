"""The batch contract between the data loader (features stage) and the models.

Shapes (B = batch size, L_i = history length of example i, N = sum_i L_i):

- ``sparse``: KeyedJaggedTensor, keys ``FeatureSpec.sparse`` in order, exactly one id
  per example and key (lengths all 1). Ids are already in ``[0, cardinality)``; id 0
  means unknown/missing.
- ``sequence``: KeyedJaggedTensor, keys ``FeatureSpec.sequence`` in order; every key
  has the same lengths ``L_i`` (the user's history strictly before the impression,
  oldest first, truncated to the most recent ``max_seq_len``).
- ``sequence_age``: float32 (N,), seconds between each history event and the
  impression (> 0), aligned with the sequence values; for time-aware attention.
- ``dense``: float32 (B, len(FeatureSpec.dense)).
- ``surface``: int64 (B,), index into ``FeatureSpec.surfaces``.
- ``labels``: float32 (B, len(FeatureSpec.tasks)), columns click (, conversion).
- ``example_id``: int64 (B,), the impression's event_id.

Example with B=2, histories of length 2 and 0, and one sequence key::

    sequence.lengths() == [2, 0]; sequence.values() == [item_a, item_b]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from gem.data.contract import SURFACES, TASKS

if TYPE_CHECKING:  # torch and torchrec load with the first batch, not with FeatureSpec (the
    # features build's planning and finalizing tasks read specs and never a tensor)
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


@dataclass(kw_only=True)
class FeatureSpec:
    """Names and cardinalities of the features a model consumes (written by the
    features stage into its manifest, read by the model to size its tables)."""

    sparse: dict[str, int]
    sequence: dict[str, int]
    dense: list[str]
    max_seq_len: int
    surfaces: list[str] = field(default_factory=lambda: list(SURFACES))  # the data's, in manifest order
    tasks: list[str] = field(default_factory=lambda: list(TASKS))  # "click" (+ "conversion" if the data has any)
    # False: label-blind histories (the items acted on, no earlier label, no prior CTR)
    history_labels: bool = True
    # vocabulary name -> content digest (gem.features.vocab): what the ids mean. A model
    # keeps its training window's; {} = not recorded (a model saved before they were)
    vocab_digests: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, raw: dict) -> "FeatureSpec":
        return cls(**raw)


_COUNTER_GROUP = re.compile(r"cnt_(.+?)_(?:\d+d|all)_")


def dense_groups(names: list[str]) -> list[list[int]]:
    """The dense features a model reads together, as positions in ``names``: first every
    feature that is not a point-in-time counter (possibly none), then one group per key
    kind of the counters (``cnt_<kind>_<horizon>_<stat>``, gem/features/counters.py), in
    order of first appearance."""
    groups: dict[str, list[int]] = {"": []}
    for i, name in enumerate(names):
        match = _COUNTER_GROUP.match(name)
        groups.setdefault(match.group(1) if match else "", []).append(i)
    return list(groups.values())


@dataclass
class Batch:
    sparse: KeyedJaggedTensor
    sequence: KeyedJaggedTensor
    sequence_age: torch.Tensor
    dense: torch.Tensor
    surface: torch.Tensor
    labels: torch.Tensor
    example_id: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.surface.shape[0])

    def sequence_offsets(self) -> torch.Tensor:
        """int64 (B+1,) offsets of each example's history in the sequence values."""
        import torch  # the fbgemm op is registered: a KeyedJaggedTensor means torchrec is loaded

        lengths = self.sequence.lengths()[: self.batch_size]
        return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths.long())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch(
            sparse=self.sparse.to(device, non_blocking=non_blocking),
            sequence=self.sequence.to(device, non_blocking=non_blocking),
            sequence_age=self.sequence_age.to(device, non_blocking=non_blocking),
            dense=self.dense.to(device, non_blocking=non_blocking),
            surface=self.surface.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            example_id=self.example_id.to(device, non_blocking=non_blocking),
        )


def synthetic_batch(spec: FeatureSpec, batch_size: int, *, seed: int = 0,
                    mean_len: float = 8.0) -> Batch:
    """A random batch that honours the contract (for unit tests and FLOP counting)."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.poisson(torch.full((batch_size,), float(mean_len)), generator=gen).long()
    lengths = lengths.clamp(0, spec.max_seq_len)
    total = int(lengths.sum())
    sparse_values = [torch.randint(0, card, (batch_size,), generator=gen) for card in spec.sparse.values()]
    seq_values = [torch.randint(0, card, (total,), generator=gen) for card in spec.sequence.values()]
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=list(spec.sparse),
        values=torch.cat(sparse_values) if sparse_values else torch.empty(0, dtype=torch.long),
        lengths=torch.ones(batch_size * len(spec.sparse), dtype=torch.long),
    )
    sequence = KeyedJaggedTensor.from_lengths_sync(
        keys=list(spec.sequence),
        values=torch.cat(seq_values) if seq_values else torch.empty(0, dtype=torch.long),
        lengths=lengths.repeat(len(spec.sequence)),
    )
    labels = torch.zeros(batch_size, len(spec.tasks))
    labels[:, 0] = (torch.rand(batch_size, generator=gen) < 0.2).float()
    if labels.shape[1] > 1:
        labels[:, 1] = labels[:, 0] * (torch.rand(batch_size, generator=gen) < 0.3).float()
    return Batch(
        sparse=sparse,
        sequence=sequence,
        sequence_age=torch.rand(total, generator=gen) * 86_400 * 7 + 1.0,
        dense=torch.randn(batch_size, len(spec.dense), generator=gen),
        surface=torch.randint(0, len(spec.surfaces), (batch_size,), generator=gen),
        labels=labels,
        example_id=torch.arange(batch_size, dtype=torch.long),
    )
