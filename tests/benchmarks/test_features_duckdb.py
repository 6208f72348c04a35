"""The DuckDB peer of the features build (benchmarks/features_duckdb.py) gives the same
rows and the same point-in-time sequences as the build, on small data that exercises
every rule: same-time ties, delayed clicks, conversions landing later, rows that are
only examples or only history."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from benchmarks.features_duckdb import compare, run_peer
from gem.data.contract import Manifest
from gem.features.build import build_features
from gem.features.plan import to_us
from tests.features.conftest import raw_events, tiny_cfg
from tests.features.test_leakage import rewrite_events

N = 24


@pytest.fixture(scope="module")
def hard_dataset(tmp_path_factory):
    """Simulator events with clicks known hours later, event times floored to the
    minute (many same-time ties), role "example" on some ads and "history" on some
    organic rows."""
    from gem.data.simulate import SimulatorConfig, simulate

    base = tmp_path_factory.mktemp("peer") / "sim"
    simulate(SimulatorConfig(users=150, items=300, days=3, topics=6, advertisers=20, seed=7, click_bias=-2.0,
                             conversion_bias=0.5, click_delay_hours=3.0, workers=1), base, progress=False)

    def harden(frame: pd.DataFrame) -> pd.DataFrame:
        ids = frame["event_id"].to_numpy()
        role = np.where(frame["is_ad"] & (ids % 7 == 0), "example",
                        np.where(~frame["is_ad"] & (ids % 5 == 0), "history", None))
        return frame.assign(role=role, event_time=frame["event_time"].dt.floor("min"))

    out = base.parent / "hard"
    rewrite_events(base, out, harden)
    return out


@pytest.fixture(scope="module")
def ours(hard_dataset):
    out = hard_dataset.parent / "ours"
    build_features(hard_dataset, out, tiny_cfg(max_seq_len=N))
    return out


def test_the_peer_gives_the_builds_rows_and_sequences(hard_dataset, ours, tmp_path):
    manifest = Manifest.read(hard_dataset)
    peer = run_peer(hard_dataset, tmp_path / "peer.parquet", start_us=to_us(manifest.start),
                    end_us=to_us(manifest.end), n=N, threads=1)
    check = compare(ours, tmp_path / "peer.parquet", sample=10**6, shards=10**6)
    assert check["examples_ours"] == check["examples_peer"] == peer["examples"] > 300
    assert check["checked"] == check["examples_ours"]  # every example, every element
    assert check["mismatches"] == 0, check["first_mismatches"]
    assert check["elements_checked"] > 5_000

    # the data exercised each rule the peer must follow
    events = raw_events(hard_dataset)
    ties = events.duplicated(["user_id", "event_time"], keep=False)
    assert ties.sum() > 20
    assert ((events["click"] == 1) & (events["click_time"] > events["event_time"])).sum() > 10
    assert set(events["role"]) >= {"example", "history", "both"}


def test_a_wrong_label_time_rule_is_caught(hard_dataset, ours, tmp_path, monkeypatch):
    """The comparison is not vacuous: a peer that shows clicks at their event time
    (ignoring click_time) differs from the build."""
    import benchmarks.features_duckdb as peer_module

    leaky = peer_module.PEER_SQL.replace("coalesce(epoch_us(click_time), epoch_us(event_time))", "epoch_us(event_time)")
    assert leaky != peer_module.PEER_SQL
    monkeypatch.setattr(peer_module, "PEER_SQL", leaky)
    manifest = Manifest.read(hard_dataset)
    run_peer(hard_dataset, tmp_path / "peer.parquet", start_us=to_us(manifest.start), end_us=to_us(manifest.end),
             n=N, threads=1)
    check = compare(ours, tmp_path / "peer.parquet", sample=10**6, shards=10**6)
    assert check["mismatches"] > 0
    assert {m["what"] for m in check["first_mismatches"]} <= {"seq_action", "seq_event_type"}
