"""Paired bootstrap statistics (students/stats.py): exact AUC/NE under weights, paired
intervals, and a ratio of lifts that refuses a denominator within noise of zero."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from students import stats


def _data(n=2000, seed=0, signal=1.0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(signal * x - 1.0)))).astype(float)
    users = rng.integers(0, n // 5, n)
    return x, y, users


def test_weighted_auc_and_ne_match_sklearn_with_duplicated_rows():
    x, y, _ = _data()
    scores = np.round(x, 1)  # ties
    assert stats.weighted_auc(y, scores, np.ones(len(y)))[0] == pytest.approx(roc_auc_score(y, scores))
    w = np.random.default_rng(1).poisson(1.0, len(y))
    rows = np.repeat(np.arange(len(y)), w)
    assert stats.weighted_auc(y, scores, w)[0] == pytest.approx(roc_auc_score(y[rows], scores[rows]))
    p = 1 / (1 + np.exp(-(x - 1.0)))
    base = y[rows].mean()
    ent = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    assert stats.weighted_ne(y, p, w)[0] == pytest.approx(log_loss(y[rows], p[rows]) / ent, rel=1e-6)


def test_sample_std_uses_ddof_1():
    assert stats.sample_std([1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert np.isnan(stats.sample_std([1.0]))


def test_paired_interval_covers_zero_for_equal_models_and_excludes_it_for_a_better_one():
    x, y, users = _data()
    w = stats.user_weights(users, n=300, seed=0)
    rows = np.arange(len(y))
    good = 1 / (1 + np.exp(-x))
    noisy = 1 / (1 + np.exp(-(x + np.random.default_rng(2).normal(scale=2.0, size=len(x)))))
    same = stats.paired_difference([(rows, y, good, good)], w, "auc")
    assert same["mean"] == 0 and same["lo"] == same["hi"] == 0 and not same["excludes_zero"]
    better = stats.paired_difference([(rows, y, good, noisy)], w, "auc")
    assert better["lo"] > 0 and better["excludes_zero"]
    ne = stats.paired_difference([(rows, y, good, noisy)], w, "ne")
    assert ne["lo"] > 0  # lower NE is better: the lift is positive


def test_ratio_of_lifts_only_where_the_denominator_excludes_zero():
    rng = np.random.default_rng(0)
    num = (0.02, rng.normal(0.02, 0.002, 500))
    assert not stats.ratio_of_lifts(num, (0.001, rng.normal(0.001, 0.003, 500)))["defined"]
    ratio = stats.ratio_of_lifts(num, (0.01, rng.normal(0.01, 0.001, 500)))
    assert ratio["defined"] and ratio["mean"] == pytest.approx(2.0) and ratio["lo"] < 2.0 < ratio["hi"]
