"""Statistics for transfer claims: sample spreads and paired bootstrap intervals.

Every reported difference (method minus no-teacher, adapter minus KD, ...) is a
*paired* difference: both arms are scored on the same evaluation rows, and one
bootstrap replicate reweights those rows for both arms at once. Rows are resampled by
evaluation *user* (Poisson(1) weight per user, shared by all of that user's rows), so
the interval accounts for users contributing many impressions.

    w = user_weights(user_ids, n=1000, seed=0)                  # (R, N) row weights
    d = paired_difference([(labels, a, b)], w, metric="auc")     # {"mean", "lo", "hi", ...}

A run is one (labels, predictions_a, predictions_b) triple on one group of rows (a
surface of one seed's evaluation); several runs are averaged, replicate by replicate,
so a seed- and surface-averaged lift gets one interval.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

EPS = 1e-7


def sample_std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1); NaN for fewer than two values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    return float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")


def user_weights(users: np.ndarray, n: int = 1000, seed: int = 0) -> np.ndarray:
    """(n, N) bootstrap row weights: a Poisson(1) count per distinct user, shared by the
    user's rows (the cluster bootstrap over users)."""
    _, inverse = np.unique(np.asarray(users), return_inverse=True)
    rng = np.random.default_rng(seed)
    per_user = rng.poisson(1.0, size=(n, int(inverse.max()) + 1 if len(inverse) else 0)).astype(np.float64)
    return per_user[:, inverse]


def weighted_auc(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUC of ``scores`` under each row of ``weights`` ((R, N) or (N,)), ties counted
    half: sum over positives of the weighted negatives ranked below. NaN where a
    replicate has no positive or no negative weight."""
    y = np.asarray(labels) > 0.5
    s = np.asarray(scores, dtype=np.float64)
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    order = np.argsort(s, kind="stable")
    s, y, w = s[order], y[order], w[:, order]
    if len(s) == 0:
        return np.full(w.shape[0], np.nan)
    starts = np.r_[0, np.flatnonzero(np.diff(s)) + 1]  # first row of each distinct score
    pos = np.add.reduceat(w * y, starts, axis=1)
    neg = np.add.reduceat(w * ~y, starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg
    num = (pos * (below + 0.5 * neg)).sum(axis=1)
    den = pos.sum(axis=1) * neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def weighted_ne(labels: np.ndarray, probs: np.ndarray, weights: np.ndarray, *, fixed_base: bool = False
                ) -> np.ndarray:
    """Normalized entropy (log loss / entropy of the base rate) per replicate. The base
    rate is the replicate's own (weighted), or with ``fixed_base`` the unweighted one of
    all rows: the replicate's log loss over one entropy. Differences of NE between two
    models then stay finite when a replicate happens to keep few positives (its own
    entropy near 0 would blow both up); point estimates (unit weights) are the same."""
    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), EPS, 1 - EPS)
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    total = w.sum(axis=1)
    loss = -(w * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.full(len(total), y.mean() if len(y) else np.nan) if fixed_base else (w * y).sum(axis=1) / total
        base = np.clip(rate, EPS, 1 - EPS)
        entropy = -(base * np.log(base) + (1 - base) * np.log(1 - base)) * total
        ok = (total > 0) & (entropy > 0) & np.isfinite(rate) & (rate > 0) & (rate < 1)
        return np.where(ok, loss / np.where(entropy > 0, entropy, 1.0), np.nan)


def _ne_fixed(labels, probs, weights):
    return weighted_ne(labels, probs, weights, fixed_base=True)


METRICS = {"auc": weighted_auc, "ne": weighted_ne}
REPLICATE_METRICS = {"auc": weighted_auc, "ne": _ne_fixed}  # what paired differences resample


def _lift(metric: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a better than b is positive: AUC a - b, NE b - a."""
    return a - b if metric == "auc" else b - a


def interval(replicates: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    r = np.asarray(replicates, dtype=np.float64)
    r = r[np.isfinite(r)]
    if not len(r):
        return float("nan"), float("nan")
    lo, hi = np.percentile(r, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def paired_replicates(runs: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], weights: np.ndarray,
                      metric: str = "auc") -> tuple[float, np.ndarray]:
    """Point estimate and (R,) replicates of the mean over ``runs`` of the lift of a over
    b. Each run: (row index into the weights' columns, labels, probs_a, probs_b)."""
    fn, rep_fn = METRICS[metric], REPLICATE_METRICS[metric]
    point, reps, count = 0.0, np.zeros(weights.shape[0]), 0
    for rows, labels, a, b in runs:
        w = weights[:, rows]
        ones = np.ones((1, len(rows)))
        p = _lift(metric, fn(labels, a, ones), fn(labels, b, ones))[0]
        if not math.isfinite(p):
            continue
        point += p
        reps += _lift(metric, rep_fn(labels, a, w), rep_fn(labels, b, w))
        count += 1
    if not count:
        return float("nan"), np.full(weights.shape[0], np.nan)
    return point / count, reps / count


def summary(point: float, replicates: np.ndarray, level: float = 0.95) -> dict:
    lo, hi = interval(replicates, level)
    return {"mean": point, "lo": lo, "hi": hi, "excludes_zero": bool(lo > 0 or hi < 0)}


def paired_difference(runs, weights: np.ndarray, metric: str = "auc", level: float = 0.95) -> dict:
    """``{"mean", "lo", "hi", "excludes_zero"}`` of the run-averaged paired lift of a over b."""
    point, reps = paired_replicates(runs, weights, metric)
    return summary(point, reps, level)


def ratio_of_lifts(num: tuple[float, np.ndarray], den: tuple[float, np.ndarray], level: float = 0.95) -> dict:
    """num / den with a bootstrap interval, defined only where the denominator's interval
    excludes zero on the positive side (a ratio over a lift within noise of zero is not a
    measurement): otherwise ``{"defined": False, "why": ...}``."""
    dlo, dhi = interval(den[1], level)
    if not (dlo > 0):
        return {"defined": False, "why": f"denominator's {level:.0%} interval [{dlo:.4f}, {dhi:.4f}] "
                                          "does not exclude zero on the positive side"}
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = num[1] / den[1]
    lo, hi = interval(reps, level)
    return {"defined": True, "mean": num[0] / den[0], "lo": lo, "hi": hi}
