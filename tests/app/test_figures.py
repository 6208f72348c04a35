"""Issue 41 item 3: figures a person compares carry their intervals: ROC bands,
calibration error bars, and the per-surface lift and student - teacher differences as
error bars on the pipeline's parent run."""

from __future__ import annotations

import numpy as np

from gem_app.stages.plots import (
    holdout_figure,
    reliability,
    reliability_interval,
    roc_band,
    roc_points,
    surfaces_figure,
)
from gem_app.stages.summary import _row


def _holdout(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    p = 1 / (1 + np.exp(-(x - 1)))
    return (rng.random(n) < p).astype(float), p


def test_the_roc_band_brackets_the_curve_and_narrows_with_rows():
    y, p = _holdout()
    fpr, lo, hi = roc_band(y, p, replicates=60)
    curve = roc_points(y, p, points=500)
    tpr = np.interp(fpr, curve["fpr"], curve["tpr"])
    inside = (lo - 0.01 <= tpr) & (tpr <= hi + 0.01)
    assert inside.mean() > 0.95 and (hi - lo)[10:90].min() > 0
    y_small, p_small = y[:400], p[:400]
    _, lo_small, hi_small = roc_band(y_small, p_small, replicates=60)
    assert (hi_small - lo_small)[10:90].mean() > 2 * (hi - lo)[10:90].mean()  # 10x fewer rows, ~3x wider
    assert all(len(a) == 0 for a in roc_band(np.zeros(50), p[:50]))  # one class: no band


def test_calibration_bins_carry_binomial_intervals():
    y, p = _holdout()
    pred, observed = reliability(y, p)
    half = reliability_interval(y, p)
    assert len(half) == len(pred) == 10
    n = len(y) // 10
    assert np.allclose(half, [1.96 * np.sqrt(r * (1 - r) / n) for r in observed], rtol=1e-3)
    fig = holdout_figure(y, {"challenger": p}, "student_feed")
    roc_ax, cal_ax = fig.axes
    assert roc_ax.collections  # the ROC's band
    assert cal_ax.containers and len(cal_ax.containers[0].lines[2][0].get_segments()) == 10  # an error bar per bin


def _summary_row(surface, lift, lo, hi, vs, vs_lo, vs_hi):
    teacher = {"metrics": {f"eval/auc/{surface}/click": 0.7, f"eval/ne/{surface}/click": 0.9}}
    verdict = {"challenger": {"vs_no_teacher_auc_lift": lift, "vs_no_teacher_auc_lift_lo": lo,
                              "vs_no_teacher_auc_lift_hi": hi}}
    return _row(teacher, {"surface": surface, "metrics": {"student": {"auc": 0.7 + vs}, "no_teacher": {"auc": 0.6}},
                          "lift": {"auc": lift}, "vs_teacher": {"auc": vs, "auc_lo": vs_lo, "auc_hi": vs_hi},
                          "gate": {"surfaces": [verdict]}, "model_name": f"student_{surface}", "version": "1"})


def test_the_parent_run_figure_shows_each_surface_with_its_interval():
    rows = [_summary_row("feed", 0.05, 0.0029, 0.09, -0.01, -0.03, 0.01),
            _summary_row("video", 0.02, -0.01, 0.05, 0.004, 0.001, 0.007)]
    assert rows[0]["lift_auc_lo"] == 0.0029 and rows[1]["lift_auc_hi"] == 0.05  # from the gate's verdict
    fig = surfaces_figure(rows)
    lift_ax, teacher_ax = fig.axes[:2]
    shown = [t.get_text() for t in lift_ax.texts]
    assert shown[0] == "+0.0500 [+0.0029, +0.0900]"  # a positive lower end never reads 0.00
    bars = [c.lines[2][0].get_segments()[0] for c in teacher_ax.containers]
    assert [tuple(np.round(seg[:, 0], 4)) for seg in bars] == [(-0.03, 0.01), (0.001, 0.007)]
    assert [t.get_text() for t in lift_ax.get_yticklabels()] == ["feed", "video"]


def test_the_parent_run_carries_the_run_s_headline_figures():
    from gem_app.stages.summary import headline

    rows = [{**_summary_row("feed", 0.05, 0.0029, 0.09, -0.01, -0.03, 0.01), "decision": "promote"},
            {**_summary_row("video", 0.02, -0.01, 0.05, 0.004, 0.001, 0.007), "decision": "keep"},
            {"surface": "stories", "student": "none trained", "decision": "not enough evidence"}]
    figures = headline({"metrics": {"eval/auc/all/click": 0.71, "eval/ne/all/click": 0.93}}, rows)
    assert figures["teacher/holdout_auc"] == 0.71 and figures["teacher/holdout_ne"] == 0.93
    assert figures["students/mean_auc"] == np.mean([0.69, 0.704])
    assert figures["students/mean_lift"] == np.mean([0.05, 0.02])
    assert (figures["decisions/promote"], figures["decisions/keep"], figures["decisions/not_enough_evidence"],
            figures["decisions/none_trained"]) == (1.0, 1.0, 1.0, 1.0)
