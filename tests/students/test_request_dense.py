"""Train/serve parity of a student's dense inputs: the counters, the user's prior ad
click rate and the hour a scorer computes from the Feast online store at an example's
instant are the features training read for that example from its shard."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import torch

from students.config import StudentModelConfig
from students.request_dense import SERVABLE

# log_history_len is left out of the comparison: the online recent-behaviour view is the
# export's (the data's end), not the example's instant
COMPARED = [n for n in SERVABLE if n != "log_history_len"]


@pytest.fixture(scope="module")
def counted(world, tmp_path_factory):
    """A counters features window (the eval window, the teacher's vocabularies) and its table."""
    from gem.features import build_features
    from gem.features.config import FeaturesConfig
    from students.data import load_table
    from tests.students.fixtures import WINDOWS

    out = tmp_path_factory.mktemp("counted") / "features"
    lo, hi = WINDOWS["eval"]
    build_features(world.data, out, FeaturesConfig(max_seq_len=16, num_buckets=1, workers=1, counters=True,
                                                   vocab_from=str(world.features["teacher"])),
                   window_start=lo, window_end=hi)
    cfg = StudentModelConfig(dense_features=list(SERVABLE), history_len=4)
    table, spec = load_table(out, cfg)
    return out, table, spec, cfg


def _student(spec, cfg):
    from students.distill import cardinalities
    from students.model import VerticalStudent

    torch.manual_seed(0)
    return VerticalStudent(cfg, cardinalities(spec, cfg), len(cfg.dense_features), 0, len(spec.surfaces))


def _examples(table, count: int) -> list[int]:
    """Rows late in the window whose user, item and item category all have counts."""
    dense = table.dense.numpy()
    names = list(SERVABLE)
    seen = (dense[:, names.index("cnt_item_all_share")] > 0) & (dense[:, names.index("cnt_user_all_share")] > 0) \
        & (dense[:, names.index("cnt_item_1d_trend")] != 0) & (table.item_raw.numpy() >= 0)
    rows = np.flatnonzero(seen)
    assert len(rows) >= count, "the tiny world has too few examples with counts"
    return [int(r) for r in rows[-count:]]


def test_scorer_serves_the_counters_training_read(world, counted, tmp_path):
    from gem.features.feast_repo import apply, materialize
    from gem.features.feast_sources import export
    from gem.knowledge.feast import DEFAULT_REPO, prepare_repo
    from students.serving import Scorer

    features, table, spec, cfg = counted
    model = _student(spec, cfg)
    repo = prepare_repo(tmp_path / "feast", world.data)
    checked = 0
    for r in _examples(table, 2):
        t = dt.datetime.fromtimestamp(int(table.event_time_us[r]) / 1e6, tz=dt.timezone.utc)
        export(world.data, repo, parts=("counters",), counters_at=t)  # the counts as of the example's instant
        apply(repo, definitions_repo=DEFAULT_REPO)
        materialize(repo, t + dt.timedelta(seconds=1))
        surface = table.surfaces[int(table.surface[r])]
        scorer = Scorer(model, repo, features, surface=surface)
        item, other = int(table.item_raw[r]), int(table.item_raw[0])
        x = scorer.inputs(int(table.user_raw[r]), [item, other], t)
        for j, name in enumerate(SERVABLE):
            if name in COMPARED:
                assert x.dense[0, j].item() == pytest.approx(table.dense[r, j].item(), abs=1e-5), (r, name)
        assert torch.equal(x.sparse[0], table.sparse[r])  # the ids too
        assert x.dense[0, list(SERVABLE).index("cnt_item_all_share")] > 0  # not served as 0
        checked += 1
    assert checked == 2


def test_counters_are_cached_per_item_and_refreshed(world, counted, tmp_path):
    from gem.features.feast_repo import apply, materialize
    from gem.knowledge.feast import DEFAULT_REPO, prepare_repo
    from students.serving import Scorer

    features, table, spec, cfg = counted
    model = _student(spec, cfg)
    repo = prepare_repo(tmp_path / "feast", world.data)
    apply(repo, definitions_repo=DEFAULT_REPO)
    end = dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc)
    materialize(repo, end)
    items = sorted({int(i) for i in table.item_raw.tolist() if i >= 0})[:12] + [10**9]  # the last one is unknown
    user = int(table.user_raw[-1])
    fresh = Scorer(model, repo, features, surface="feed")
    cached = Scorer(model, repo, features, surface="feed", cache_items=True)
    a, b = fresh.inputs(user, items, end), cached.inputs(user, items, end)
    assert torch.equal(a.dense, b.dense)
    share = list(SERVABLE).index("cnt_item_all_share")
    assert a.dense[:-1, share].gt(0).any() and a.dense[-1, share] == 0  # an unseen item reads no counts
    cached._item_counters[:] = 0
    cached.refresh_items(end)
    assert torch.equal(cached.inputs(user, items, end).dense, a.dense)


def test_a_feature_the_scorer_cannot_compute_is_refused(world, counted, tmp_path):
    from gem.knowledge.feast import prepare_repo
    from students.request_dense import check_servable
    from students.serving import Scorer

    features, _, spec, _ = counted
    check_servable(list(SERVABLE))
    cfg = StudentModelConfig(dense_features=["log_history_len", "log_seconds_since_last_event"], history_len=4)
    model = _student(spec, cfg)
    with pytest.raises(ValueError, match="log_seconds_since_last_event.*cannot be computed at request time"):
        Scorer(model, prepare_repo(tmp_path / "feast"), features, surface="feed")
