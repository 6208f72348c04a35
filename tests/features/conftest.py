"""Fixtures for the features tests: small datasets, one shared build, brute-force oracles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from gem.data.contract import EVENT_TYPES, EVENTS_SCHEMA, Manifest, event_files, with_optional_columns
from gem.features.config import FeaturesConfig
from gem.features.vocab import Vocabularies


def tiny_cfg(**overrides) -> FeaturesConfig:
    from gem.config import load_config

    return load_config(FeaturesConfig, section="features", preset="tiny",
                       overrides=[f"{k}={v}" for k, v in overrides.items()])


@pytest.fixture(scope="session")
def conv_dataset(tmp_path_factory) -> Path:
    """~7k simulator events with frequent clicks and conversions landing hours later, so
    histories often hold a click whose conversion is still in the future."""
    from gem.data.simulate import SimulatorConfig, simulate

    out = tmp_path_factory.mktemp("features-data") / "conv"
    simulate(SimulatorConfig(users=250, items=500, days=4, topics=8, advertisers=40, seed=3, click_bias=-2.0,
                             conversion_bias=0.5, conversion_delay_hours=12.0, workers=1), out, progress=False)
    return out


@pytest.fixture(scope="session")
def conv_features(conv_dataset, tmp_path_factory) -> Path:
    from gem.features.build import build_features

    out = tmp_path_factory.mktemp("features-out") / "conv"
    build_features(conv_dataset, out, tiny_cfg(max_seq_len=48))
    return out


def raw_events(data_dir: Path) -> pd.DataFrame:
    """Every event of a contract dataset; times as int64 microseconds (no conversion: -1)."""
    tables = []
    for path in event_files(data_dir):
        table = pq.read_table(path)
        table = table.set_column(table.schema.get_field_index("event_time"), "event_time",
                                 table.column("event_time").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()))
        conv = pc.fill_null(table.column("conversion_time").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()), -1)
        table = table.set_column(table.schema.get_field_index("conversion_time"), "conversion_time", conv)
        table = with_optional_columns(table)
        # when each click became known: click_time, or the event time when null
        known = pc.fill_null(table.column("click_time").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()),
                             table.column("event_time"))
        table = table.set_column(table.schema.get_field_index("click_time"), "click_time", known)
        role = pc.fill_null(table.column("role"), "both")
        table = table.set_column(table.schema.get_field_index("role"), "role", role)
        tables.append(table.select(EVENTS_SCHEMA.names))
    frame = pa.concat_tables(tables).to_pandas()
    return frame.sort_values(["user_id", "event_time", "event_id"], kind="stable").reset_index(drop=True)


class BruteForce:
    """The expected history of any (user, impression time), straight from raw events."""

    def __init__(self, data_dir: Path, features_dir: Path, max_seq_len: int):
        self.events = raw_events(data_dir)
        self.surfaces = list(Manifest.read(data_dir).surfaces)
        self.vocab = Vocabularies.read(features_dir)
        self.n = max_seq_len
        users, first = np.unique(self.events["user_id"].to_numpy(), return_index=True)
        self.bounds = dict(zip(users.tolist(), zip(first.tolist(), np.r_[first[1:], len(self.events)].tolist())))

    def history(self, user: int, t_us: int) -> pd.DataFrame:
        """All events of ``user`` strictly before ``t_us`` that may be history (role not
        "example"), oldest first."""
        lo, hi = self.bounds[user]
        rows = self.events.iloc[lo:hi]
        return rows[(rows["event_time"] < t_us) & (rows["role"] != "example")]

    @staticmethod
    def known_clicks(h: pd.DataFrame, t_us: int) -> np.ndarray:
        """bool: the rows of ``h`` whose click is 1 and already known at ``t_us``."""
        return (h["click"].to_numpy() == 1) & (h["click_time"].to_numpy() < t_us)

    def sequence(self, user: int, t_us: int, history_labels: bool = True) -> dict[str, np.ndarray]:
        h = self.history(user, t_us).tail(self.n)
        conv_t = h["conversion_time"].to_numpy()
        known_conversion = (h["conversion"].to_numpy() == 1) & (conv_t >= 0) & (conv_t < t_us)
        click = self.known_clicks(h, t_us) & history_labels
        event_type = np.array([EVENT_TYPES.index(v) + 1 for v in h["event_type"]], dtype=np.int64)
        return {
            "seq_item_id": self.vocab.ids("item_id", h["item_id"].to_numpy()).astype(np.int64),
            "seq_event_type": np.where(~click & (event_type >= 3), 2, event_type),  # like/share shown once known
            "seq_surface": np.array([self.surfaces.index(v) + 1 for v in h["surface"]], dtype=np.int64),
            "seq_is_ad": h["is_ad"].to_numpy().astype(np.int64) + 1,
            "seq_action": np.where(click, 1 + known_conversion, 0).astype(np.int64),
            "age": (t_us - h["event_time"].to_numpy()) / 1e6,
        }


class Collected:
    """One pass of a loader, concatenated; ``got[example_id]`` -> that example's columns."""

    def __init__(self, loader):
        ids, lengths, seq, ages, dense, labels, surface = [], [], {}, [], [], [], []
        self.batch_sizes = []
        for batch in loader:
            ids.append(batch.example_id.numpy())
            lengths.append(batch.sequence.lengths()[: batch.batch_size].numpy())
            keys = batch.sequence.keys()
            values = batch.sequence.values().view(len(keys), -1).numpy()  # every key has the same lengths
            for k, key in enumerate(keys):
                seq.setdefault(key, []).append(values[k])
            ages.append(batch.sequence_age.numpy())
            dense.append(batch.dense.numpy())
            labels.append(batch.labels.numpy())
            surface.append(batch.surface.numpy())
            self.batch_sizes.append(batch.batch_size)
        self.ids = np.concatenate(ids)
        self.lengths = np.concatenate(lengths)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.seq = {k: np.concatenate(v) for k, v in seq.items()}
        self.age = np.concatenate(ages)
        self.dense = np.concatenate(dense)
        self.labels = np.concatenate(labels)
        self.surface = np.concatenate(surface)
        self.row = {int(e): i for i, e in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self):
        return iter(self.row)

    def __getitem__(self, example_id: int) -> dict:
        i = self.row[example_id]
        lo, hi = self.offsets[i], self.offsets[i + 1]
        return {k: v[lo:hi] for k, v in self.seq.items()} | {
            "age": self.age[lo:hi], "dense": self.dense[i], "labels": self.labels[i], "surface": int(self.surface[i])}


def collect(loader) -> Collected:
    return Collected(loader)
