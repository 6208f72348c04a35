"""No leakage: every sequence element and feature predates its impression, and each
sequence equals a brute-force recomputation from the raw events."""

from __future__ import annotations

import numpy as np
import pytest

from gem.features.loader import FeatureLoader
from tests.conftest import MOVIELENS_DIR, TAOBAO_CSV, require_real_data
from tests.features.conftest import BruteForce, collect, tiny_cfg

SEQ_KEYS = ("seq_item_id", "seq_event_type", "seq_surface", "seq_is_ad", "seq_action")


def check_against_brute_force(data_dir, features_dir, *, sample: int, seed: int = 0) -> dict:
    """Compare ``sample`` random examples with the oracle; check all examples' ages.
    Returns counts so callers can assert the check was not vacuous."""
    loader = FeatureLoader(features_dir, batch_size=512, shuffle=False)
    got = collect(loader)
    assert len(got) == loader.num_examples > 0
    assert (got.age <= 0).sum() == 0, "a history element at or after its impression time"
    assert got.lengths.max() <= loader.spec.max_seq_len

    oracle = BruteForce(data_dir, features_dir, loader.spec.max_seq_len)
    impressions = oracle.events.set_index("event_id")
    rng = np.random.default_rng(seed)
    ids = rng.choice(got.ids, size=min(sample, len(got)), replace=False)
    counts = {"checked": 0, "elements": 0, "pending_conversions": 0, "known_conversions": 0, "ties_excluded": 0,
              "pending_clicks": 0}
    for eid in ids:
        row = impressions.loc[int(eid)]
        user, t = int(row["user_id"]), int(row["event_time"])
        want = oracle.sequence(user, t)
        have = got[int(eid)]
        for key in SEQ_KEYS:
            np.testing.assert_array_equal(have[key], want[key], err_msg=f"example {eid} {key}")
        # ages use event times floored to whole seconds (never smaller, < 1 s larger), in float32
        slack = want["age"] * 1e-6 + 0.07
        assert np.all(have["age"] >= want["age"] - slack) and np.all(have["age"] < want["age"] + 1 + slack), eid
        full = oracle.history(user, t)
        np.testing.assert_allclose(have["dense"][0], np.log1p(len(full)), rtol=1e-5)  # log_history_len
        ads = full[full["is_ad"]]
        known = oracle.known_clicks(ads, t)  # a click counts in the prior CTR only once known
        np.testing.assert_allclose(have["dense"][4], (known.sum() + 1.0) / (len(ads) + 50.0), rtol=1e-5)
        counts["pending_clicks"] += int(((ads["click"] == 1).to_numpy() & ~known).sum())
        h = full.tail(loader.spec.max_seq_len)
        clicked_conv = (h["conversion"] == 1).to_numpy()
        counts["pending_conversions"] += int((clicked_conv & (h["conversion_time"].to_numpy() >= t)).sum())
        counts["known_conversions"] += int((have["seq_action"] == 2).sum())
        lo, hi = oracle.bounds[user]
        user_rows = oracle.events.iloc[lo:hi]
        counts["ties_excluded"] += int(((user_rows["event_time"] == t) & (user_rows["event_id"] != eid)).sum())
        counts["checked"] += 1
        counts["elements"] += len(want["age"])
    return counts


def test_simulator_sequences_match_brute_force_and_never_leak(conv_dataset, conv_features):
    counts = check_against_brute_force(conv_dataset, conv_features, sample=600)
    assert counts["checked"] == 600 and counts["elements"] > 5_000
    # the sample holds clicks whose conversion was still in the future (action 1) and
    # conversions already known (action 2): both branches of the rule were exercised
    assert counts["pending_conversions"] > 0 and counts["known_conversions"] > 0


def test_feature_timestamps_predate_every_impression(conv_dataset, conv_features):
    from gem.features.feast_sources import attribute_time

    loader = FeatureLoader(conv_features, batch_size=4096, shuffle=False)
    oracle = BruteForce(conv_dataset, conv_features, loader.spec.max_seq_len)
    ex_ids = np.concatenate([b.example_id.numpy() for b in loader])
    times = oracle.events.set_index("event_id").loc[ex_ids, "event_time"].to_numpy()
    stamp_us = int(attribute_time(conv_dataset).timestamp() * 1_000_000)
    assert (times <= stamp_us).sum() == 0, "a Feast attribute row stamped at or after an impression"


@pytest.mark.realdata
def test_movielens_no_leakage_with_same_second_ties(tmp_path):
    from gem.data.adapters.movielens import convert_movielens
    from gem.features.build import build_features

    data = tmp_path / "ml"
    convert_movielens(require_real_data(MOVIELENS_DIR), data)
    out = tmp_path / "ml-features"
    # the last two weeks as the window; history from the dataset start
    build_features(data, out, tiny_cfg(max_seq_len=256), window_start="1998-04-09T00:00:00+00:00",
                   window_end="1998-04-23T00:00:00+00:00")
    counts = check_against_brute_force(data, out, sample=400)
    assert counts["checked"] > 100 and counts["elements"] > 1_000
    assert counts["ties_excluded"] > 0, "MovieLens same-second ratings should have been excluded somewhere"


@pytest.mark.realdata
def test_taobao_no_leakage(tmp_path):
    from gem.data.adapters.taobao import convert_taobao
    from gem.features.build import build_features

    data = tmp_path / "tb"
    convert_taobao(require_real_data(TAOBAO_CSV), data)
    out = tmp_path / "tb-features"
    build_features(data, out, tiny_cfg(max_seq_len=128))
    counts = check_against_brute_force(data, out, sample=500)
    assert counts["checked"] == 500 and counts["elements"] > 5_000
    assert counts["known_conversions"] + counts["pending_conversions"] > 0


def test_organic_examples_when_asked(conv_dataset, tmp_path):
    from gem.features.build import build_features

    out = tmp_path / "organic"
    manifest = build_features(conv_dataset, out, tiny_cfg(max_seq_len=32, include_organic=True),
                              window_start="2026-01-03T00:00:00Z")
    oracle = BruteForce(conv_dataset, out, 32)
    in_window = oracle.events["event_time"] >= 1767398400 * 1_000_000  # 2026-01-03
    assert manifest["counts"]["examples"] == int(in_window.sum())
    assert (~oracle.events.loc[in_window, "is_ad"]).sum() > 0
    counts = check_against_brute_force(conv_dataset, out, sample=150, seed=1)
    assert counts["checked"] == 150 and counts["elements"] > 1_000


def rewrite_events(src, dst, change) -> None:
    """Copy the contract dataset ``src`` to ``dst`` with ``change(frame) -> frame`` applied
    to every event file (pandas, contract columns)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from gem.data.contract import EVENTS_SCHEMA, event_files, with_optional_columns

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("_validation", ".gem-output"))
    for path in event_files(dst):
        frame = change(with_optional_columns(pq.read_table(path)).to_pandas())
        pq.write_table(pa.Table.from_pandas(frame, schema=EVENTS_SCHEMA, preserve_index=False), path)


@pytest.fixture(scope="module")
def delayed_dataset(tmp_path_factory):
    """Simulator events whose clicks become known hours after the exposure, with rows of
    every role: some impressions example-only, some organic rows history-only."""
    from gem.data.simulate import SimulatorConfig, simulate

    base = tmp_path_factory.mktemp("delayed") / "sim"
    simulate(SimulatorConfig(users=200, items=400, days=4, topics=8, advertisers=30, seed=5, click_bias=-2.0,
                             conversion_bias=0.5, click_delay_hours=6.0, workers=1), base, progress=False)
    out = base.parent / "roles"

    def roles(frame):
        ids = frame["event_id"].to_numpy()
        role = np.where(frame["is_ad"] & (ids % 7 == 0), "example",
                        np.where(~frame["is_ad"] & (ids % 5 == 0), "history", None))
        return frame.assign(role=role)

    rewrite_events(base, out, roles)
    return out


def test_delayed_clicks_and_row_roles_never_leak(delayed_dataset, tmp_path):
    """A click known only at click_time is hidden from every earlier example (sequence
    action, organic like/share, prior CTR); example-only rows appear in no history."""
    from gem.features.build import build_features

    out = tmp_path / "f"
    build_features(delayed_dataset, out, tiny_cfg(max_seq_len=48))
    counts = check_against_brute_force(delayed_dataset, out, sample=500)
    assert counts["checked"] == 500 and counts["elements"] > 3_000
    assert counts["pending_clicks"] > 0, "no click was pending at any sampled example: the rule was not exercised"
    oracle = BruteForce(delayed_dataset, out, 48)
    loader = FeatureLoader(out, batch_size=4096, shuffle=False)
    got = collect(loader)
    events = oracle.events.set_index("event_id")
    # every example-only ad row is an example; no history-only row is
    roles = events.loc[got.ids, "role"]
    assert (roles == "history").sum() == 0 and (roles == "example").sum() > 0
    assert set(events.index[(events["role"] == "example") & (events["event_time"] >= 0)]) <= set(got.ids.tolist())


def test_a_label_never_appears_before_its_time(delayed_dataset, tmp_path):
    """Directly: for every sampled example, each history element shown as clicked (action
    >= 1) is an event whose click_time is strictly before the example's time."""
    from gem.features.build import build_features

    out = tmp_path / "f"
    build_features(delayed_dataset, out, tiny_cfg(max_seq_len=48))
    loader = FeatureLoader(out, batch_size=1024, shuffle=False)
    got = collect(loader)
    oracle = BruteForce(delayed_dataset, out, 48)
    events = oracle.events.set_index("event_id")
    shown = early = 0
    for eid in got.ids[:400]:
        row = events.loc[int(eid)]
        h = oracle.history(int(row["user_id"]), int(row["event_time"])).tail(48)
        action = got[int(eid)]["seq_action"]
        assert len(action) == len(h)
        clicked = action >= 1
        shown += int(clicked.sum())
        early += int((h["click_time"].to_numpy()[clicked] >= row["event_time"]).sum())
    assert shown > 0 and early == 0


def test_label_blind_history(conv_dataset, tmp_path):
    from gem.features.build import build_features

    out = tmp_path / "blind"
    build_features(conv_dataset, out, tiny_cfg(max_seq_len=32, history_labels=False))
    loader = FeatureLoader(out, batch_size=4096, shuffle=False)
    assert loader.spec.history_labels is False
    got = collect(loader)
    assert len(got) > 0 and (got.seq["seq_action"] == 0).all()
    assert not np.isin(got.seq["seq_event_type"], [3, 4]).any()  # like/share reveal engagement
    ctr = got.dense[:, 4]
    ads = np.expm1(got.dense[:, 5])
    np.testing.assert_allclose(ctr, 1.0 / (ads + 50.0), rtol=1e-4)


@pytest.mark.realdata
def test_taobao_delayed_action_label_never_leaks(tmp_path):
    """Taobao with click = cart/fav/buy within 3 days of the page view, known at that time."""
    from gem.data.adapters.taobao import convert_taobao
    from gem.features.build import build_features

    data = tmp_path / "tb"
    convert_taobao(require_real_data(TAOBAO_CSV), data, label="action")
    out = tmp_path / "tb-features"
    build_features(data, out, tiny_cfg(max_seq_len=128))
    counts = check_against_brute_force(data, out, sample=400)
    assert counts["checked"] == 400 and counts["pending_clicks"] > 0
