"""Lifts with intervals: every reported difference is paired on the same evaluation rows.

One ``Evidence`` per world (one evaluation table): the bootstrap reweights evaluation
users (a Poisson(1) count per user shared by all their rows, students/stats.py) and, in
the same replicate, resamples the (teacher, seed) runs being averaged (a multinomial
count per run), so an interval reflects both the evaluation sample and the training
randomness of students and teachers. A run's lift is the mean over surfaces of the
per-surface metric difference (AUC: a - b; NE: b - a, so positive is better; NE
replicates divide the replicate's log loss by the evaluation rows' base-rate entropy,
students.stats.weighted_ne(fixed_base=True)); runs are matched by (teacher, seed) (by
seed against a teacher-free arm).

    ev = Evidence(labels, users, n=1000, seed=0)
    ev.add("kd", "t0", 0, {"feed": (index, probs), ...})
    ev.lift("kd", "no_teacher", "auc")  # {"mean", "lo", "hi", "excludes_zero", "sd_runs", ...}
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from students.stats import METRICS, REPLICATE_METRICS, interval, ratio_of_lifts, sample_std, user_weights


@lru_cache(maxsize=64)
def run_counts(runs: int, replicates: int, seed: int = 7) -> np.ndarray:
    """(R, P) multinomial resampling counts of P runs, the same for every difference over
    P runs (so two lifts over the same runs share their replicates, e.g. for a ratio)."""
    rng = np.random.default_rng(seed + runs)
    return rng.multinomial(runs, np.full(runs, 1.0 / runs), size=replicates).astype(np.float64)


class Evidence:
    def __init__(self, labels: np.ndarray, users: np.ndarray, *, n: int = 1000, seed: int = 0, level: float = 0.95):
        self.labels = np.asarray(labels, dtype=np.float64)
        self.weights = user_weights(users, n, seed)
        self.n, self.level = n, level
        self.runs: dict[str, dict[tuple[str | None, int], dict[str, tuple[np.ndarray, np.ndarray]]]] = {}
        self._cache: dict = {}

    def add(self, arm: str, teacher: str | None, seed: int, surfaces: dict[str, tuple[np.ndarray, np.ndarray]]):
        self.runs.setdefault(arm, {})[(teacher, seed)] = surfaces

    def metric(self, arm: str, key: tuple, surface: str, metric: str) -> tuple[float, np.ndarray]:
        """(point, (R,) replicates) of one run's metric on one surface."""
        ck = (arm, key, surface, metric)
        if ck not in self._cache:
            index, probs = self.runs[arm][key][surface]
            y = self.labels[index]
            point = float(METRICS[metric](y, probs, np.ones(len(y)))[0])
            self._cache[ck] = (point, REPLICATE_METRICS[metric](y, probs, self.weights[:, index]))
        return self._cache[ck]

    def pairs(self, a: str, b: str) -> list[tuple[tuple, tuple]]:
        """Matched (key of a, key of b): same (teacher, seed), or same seed where b is teacher-free."""
        out = []
        for key in sorted(self.runs[a], key=str):
            teacher, seed = key
            match = key if key in self.runs[b] else (None, seed) if (None, seed) in self.runs[b] else None
            if match is None and teacher is None:  # a teacher-free, b not: not comparable run by run
                continue
            if match is not None:
                out.append((key, match))
        return out

    def _per_run(self, a: str, b: str, metric: str, surfaces: list[str] | None = None):
        points, reps = [], []
        for ka, kb in self.pairs(a, b):
            names = [s for s in (surfaces or sorted(self.runs[a][ka]))
                     if s in self.runs[a][ka] and s in self.runs[b][kb]]
            p_sum, r_sum, count = 0.0, np.zeros(self.n), 0
            for s in names:
                pa, ra = self.metric(a, ka, s, metric)
                pb, rb = self.metric(b, kb, s, metric)
                if not (math.isfinite(pa) and math.isfinite(pb)):
                    continue  # a surface without positives in the evaluation window
                d = pa - pb if metric == "auc" else pb - pa
                p_sum += d
                r_sum += np.nan_to_num((ra - rb) if metric == "auc" else (rb - ra))
                count += 1
            if count:
                points.append(p_sum / count)
                reps.append(r_sum / count)
        return np.asarray(points), (np.stack(reps, axis=1) if reps else np.zeros((self.n, 0)))

    def lift_replicates(self, a: str, b: str, metric: str, surfaces: list[str] | None = None
                        ) -> tuple[float, np.ndarray, np.ndarray]:
        """(point, (R,) replicates, per-run points) of the mean over matched runs."""
        points, reps = self._per_run(a, b, metric, surfaces)
        if not len(points):
            return math.nan, np.full(self.n, np.nan), points
        counts = run_counts(len(points), self.n)
        return float(points.mean()), (reps * counts).sum(axis=1) / len(points), points

    def lift(self, a: str, b: str, metric: str, surfaces: list[str] | None = None) -> dict:
        point, reps, per_run = self.lift_replicates(a, b, metric, surfaces)
        lo, hi = interval(reps, self.level)
        return {"mean": point, "lo": lo, "hi": hi, "excludes_zero": bool(lo > 0 or hi < 0),
                "sd_runs": sample_std(per_run.tolist()), "runs": int(len(per_run)),
                "per_run": [round(float(v), 6) for v in per_run]}

    def ratio(self, num: tuple[str, str], den: tuple[str, str], metric: str) -> dict:
        """lift(num) / lift(den), over the same runs, defined only where the denominator's
        interval excludes zero on the positive side (students.stats.ratio_of_lifts)."""
        n_point, n_reps, n_runs = self.lift_replicates(*num, metric)
        d_point, d_reps, d_runs = self.lift_replicates(*den, metric)
        if len(n_runs) != len(d_runs):
            return {"defined": False, "why": f"{len(n_runs)} runs against {len(d_runs)}: not paired"}
        out = ratio_of_lifts((n_point, n_reps), (d_point, d_reps), self.level)
        return {**out, "numerator": f"{num[0]} - {num[1]}", "denominator": f"{den[0]} - {den[1]}"}

    def absolute(self, arm: str, metric: str, surfaces: list[str] | None = None) -> float:
        """The arm's metric, mean over surfaces (``surfaces``: only those) then runs (a level, for the tables)."""
        values = []
        for key, ran in self.runs.get(arm, {}).items():
            points = [self.metric(arm, key, s, metric)[0] for s in sorted(ran) if surfaces is None or s in surfaces]
            points = [p for p in points if math.isfinite(p)]
            if points:
                values.append(float(np.mean(points)))
        return float(np.mean(values)) if values else math.nan
