"""Windows by evidence (gem.protocol.evidence_windows, issue 31) on a log with a dense
past and a sparse recent tail, and a narrow window's features build reading only the
day files it needs, each once, with the profile read from its cache."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from gem.data.profile import US_PER_DAY, daily_counts
from gem.protocol import Evidence, WindowError, evidence_windows, split_windows
from tests.datasets.pipeline_runs import simulated
from tests.datasets.shapes import make_shapes


@pytest.fixture(scope="module")
def tail(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tail")
    return make_shapes(simulated(tmp / "simulated"), tmp / "tail", ["sparse_tail"])


def _day(iso: str) -> int:
    return (dt.date.fromisoformat(iso[:10]) - dt.date(1970, 1, 1)).days


def test_windows_grow_until_every_surface_they_serve_has_its_evidence(tail):
    evidence = Evidence(examples=30, positives=2, max_share=0.25)
    choice = evidence_windows(tail, evidence)
    w = choice.windows
    # the last day holds a handful of rows: one-day windows would judge on almost nothing
    last_days = split_windows(tail)
    assert w.student_end < last_days.student_end and w.teacher_end < last_days.teacher_end
    counts = daily_counts(tail)
    total = int(counts.examples.sum())
    for name, (lo, hi) in (("student", (w.teacher_end, w.student_end)), ("holdout", (w.student_end, w.end))):
        part = counts.between(_day(lo), _day(hi))
        assert part.examples.sum() <= evidence.max_share * total + part.examples.sum(axis=1).max()
        for surface in choice.surfaces:
            i = counts.declared.index(surface)
            n, c = int(part.examples[:, i].sum()), int(part.clicks[:, i].sum())
            assert n >= 30 and 2 <= c <= n - 2, (name, surface, n, c)
            assert choice.sizes[name][surface] == {"examples": n, "clicks": c}
        # the shortest such span: one day less and some served surface falls short
        shorter = counts.between(_day(lo) + 1, _day(hi))
        short = [s for s in choice.surfaces if not (
            shorter.examples[:, counts.declared.index(s)].sum() >= 30
            and 2 <= shorter.clicks[:, counts.declared.index(s)].sum()
            <= shorter.examples[:, counts.declared.index(s)].sum() - 2)]
        assert short or shorter.days.size < part.days.size - 1, name
    lines = choice.lines()
    assert set(lines) == {"student window", "holdout window"} and "examples" in lines["holdout window"]
    for surface in set(counts.declared) - set(choice.surfaces):  # left out, saying what it has and needs
        assert any(f"surface {surface!r} gets no student: it has student" in text and "needs >= 30 examples" in text
                   for text in choice.warnings)


def test_a_fixed_window_and_an_impossible_minimum(tail):
    fixed = evidence_windows(tail, Evidence(examples=30, positives=2), holdout_days=30)
    assert _day(fixed.windows.end) - _day(fixed.windows.student_end) <= 31
    with pytest.raises(WindowError, match="no surface reaches >= 100000 examples"):
        evidence_windows(tail, Evidence(examples=100_000, positives=2))
    with pytest.raises(ValueError, match="unknown setting"):
        Evidence.from_dict({"clicks": 3})
    assert Evidence.from_dict({"examples": 50.0}).examples == 50  # kfp hands ints over as floats


def test_a_narrow_window_reads_only_its_days_once_and_the_cached_profile(tail, tmp_path, monkeypatch):
    from gem.data import profile as profile_module
    from gem.features import staging
    from gem.features.build import build_features
    from gem.features.config import FeaturesConfig

    counts = daily_counts(tail)  # what ingest leaves: the profile cached beside the data
    scans, days_read = [], []
    real_scan, real_read_day = profile_module._read_events, staging.read_day
    monkeypatch.setattr(profile_module, "_read_events", lambda files: scans.append(len(files)) or real_scan(files))
    monkeypatch.setattr(staging, "read_day", lambda data, day: days_read.append(day) or real_read_day(data, day))
    first = int(counts.days[0])
    start, end = (dt.date(1970, 1, 1) + dt.timedelta(days=first + d) for d in (1, 3))  # an early, narrow window
    build_features(tail, tmp_path / "features", FeaturesConfig(max_seq_len=8, num_buckets=2, workers=1),
                   window_start=f"{start}T00:00:00+00:00", window_end=f"{end}T00:00:00+00:00")
    wanted = sorted(str(dt.date(1970, 1, 1) + dt.timedelta(days=int(d))) for d in counts.days
                    if d * US_PER_DAY < (first + 3) * US_PER_DAY)
    assert sorted(days_read) == wanted  # the days up to the window's end, each once (histories included)
    assert len(wanted) == 3 < len(counts.days)  # not the tail's days
    assert scans == []  # no event file read for the profile: the cached daily counts
    assert np.array_equal(daily_counts(tail).examples, counts.examples)
