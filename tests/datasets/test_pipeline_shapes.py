"""Unusual dataset shapes through the real `gem pipeline run --preset tiny`, each to a
summary. tests/app/test_e2e.py runs one dataset with one surface, no conversion, users
without attributes and ids written as strings; here a 3-year span with a few examples
a day (every 7th day), no conversion and every event of a user's day at the same
second runs, and an absent surface fails before any work. (test_matrix.py runs every shape alone through
the library stages.)"""

from __future__ import annotations

import json

import pytest

from gem.protocol import WindowError, Windows, check_windows, split_windows
from tests.datasets.pipeline_runs import completed, ingested, run_pipeline_cli, simulated
from tests.datasets.shapes import make_shapes


@pytest.fixture(scope="module")
def years(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("years")
    return make_shapes(simulated(tmp / "simulated"), tmp / "years", ["no_conversions", "three_years", "same_second"])


def test_one_day_windows_of_a_sparse_span_fail_saying_how_to_widen_them(years):
    with pytest.raises(WindowError, match=r"the (student|holdout) window .* holds \d+ example.*a day\): widen the "
                                          r"windows \(pipeline run --student-days N --holdout-days N\)"):
        check_windows(years, split_windows(years))


@pytest.mark.slow(minutes=4.5)
def test_three_years_at_the_same_second_without_conversions_run_to_a_summary(years, tmp_path):
    """Also issue 31: the default windows are sized by evidence (one-day windows cannot
    even hold both labels here), printed with their sizes, and a holdout of a handful of
    positives promotes nothing and shows no AUC as if it were a measurement."""
    workspace = tmp_path / "ws"
    proc = run_pipeline_cli(workspace, years)
    summary = completed(proc, workspace)
    ingest = ingested(workspace)
    assert set(ingest["evidence"]) == {"student window", "holdout window"}
    for text in ingest["evidence"].values():
        assert text.split(" ")[0] in proc.stdout + proc.stderr  # the span, on the terminal
    one_day = split_windows(years)
    assert ingest["windows"]["student_end"] < one_day.student_end  # wider than a day
    assert not any(row["promoted"] for row in summary["surfaces"])
    for row in summary["surfaces"]:  # issue 43: no student is distilled where the gate must refuse it
        if min(row["holdout_positives"], row["holdout_negatives"]) < 5:  # the tiny preset's gate floor
            assert row["student"] == "none trained" and row["decision"] == "not enough evidence", row
        else:  # evidence for the gate, too little for an AUC shown as a measurement
            assert row["student"] != "none trained" and row["decision"] != "promoted", row
    skipped = [r["surface"] for r in summary["surfaces"] if r["student"] == "none trained"]
    for surface in skipped:  # one line each on the terminal
        assert f"surface '{surface}': no student trained: " in proc.stderr
    table = (workspace / "summary.md").read_text()
    for row in summary["surfaces"]:
        line = next(line for line in table.splitlines() if line.startswith(f"| {row['surface']} |"))
        if row["holdout_positives"] < 10:  # gem.utils.evidence.MIN_AUC_EVIDENCE
            assert f"n/a ({int(row['holdout_positives'])} positives" in line
    planned, warnings = check_windows(years, Windows(**ingest["windows"]))
    served = sorted(r["surface"] for r in summary["surfaces"])
    assert planned and served == sorted(planned) == sorted(ingest["surfaces"])
    assert warnings  # messaging: no click in the student window
    for surface in {"feed", "video", "stories", "messaging"} - set(planned):  # said on the terminal, with its counts
        assert f"surface '{surface}' gets no student: it has student " in proc.stderr
    assert "no conversion in the data" in proc.stderr
    teacher = json.loads((workspace / "features" / "teacher" / "manifest.json").read_text())
    assert teacher["dataset"]["data_tasks"] == ["click"]
    assert not any("conversion" in k for k in summary["teacher"]["metrics"] if k.startswith("eval/auc"))
    # about 1,100 days of history in the teacher window: a few shards, not one per (bucket, day)
    assert teacher["counts"]["shards"] <= 2 * 2


def test_asking_for_a_surface_the_data_lacks_fails_before_any_work(years, tmp_path):
    workspace = tmp_path / "ws"
    proc = run_pipeline_cli(workspace, years, "--surfaces", "feed,search", timeout=120)
    assert proc.returncode == 2
    assert "surface(s) ['search'] not in the dataset; it has events on ['feed', 'video', 'stories', " \
           "'messaging']" in proc.stderr
    assert not (workspace / "kfp").exists() and not (workspace / "mlflow.db").exists()
