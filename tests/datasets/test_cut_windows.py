"""`pipeline run --cut A --cut B`: the teacher / student / holdout windows at explicit
time cut points instead of the last days (gem.protocol.cut_windows via the ingest stage)."""

from __future__ import annotations

import datetime as dt

import pytest

from gem.data.contract import Manifest
from gem.protocol import cut_windows, split_windows


def test_ingest_cuts_the_windows_at_the_given_points(tiny_dataset, tmp_path):
    from gem_app.stages.context import RunContext
    from gem_app.stages.ingest import ingest, write_cuts

    manifest = Manifest.read(tiny_dataset)
    ws = tmp_path / "ws"
    ctx = RunContext(pipeline_run_id="cuts", tracking_root=str(ws))
    write_cuts(ws, ["2026-01-02T12:00:00Z", "2026-01-04"])  # what `pipeline run --cut` leaves for ingest
    cut = ingest(str(tiny_dataset), str(ws), "tiny", ctx, student_overlap_days=0)  # the windows as cut
    assert cut.windows == {"start": manifest.start.isoformat(), "teacher_end": "2026-01-02T12:00:00+00:00",
                           "student_start": "2026-01-02T12:00:00+00:00", "student_end": "2026-01-04T00:00:00+00:00",
                           "end": manifest.end.isoformat()}
    write_cuts(ws, None)  # a run without cut points: the last-days protocol, not the reused cut
    default = ingest(str(tiny_dataset), str(ws), "tiny", ctx, student_days=1, holdout_days=1, student_overlap_days=0)
    assert default.windows == split_windows(ws / "clean").as_dict() != cut.windows
    write_cuts(ws, ["2026-01-04", "2026-01-02"])
    with pytest.raises(ValueError, match="increasing"):
        ingest(str(tiny_dataset), str(ws), "tiny", ctx)


def test_cut_points_must_be_two_and_inside_the_data(tiny_dataset, capsys):
    from gem_app.cli import main

    with pytest.raises(ValueError, match="two time cut points"):
        cut_windows(tiny_dataset, ["2026-01-02"])
    with pytest.raises(ValueError, match="inside"):
        cut_windows(tiny_dataset, ["2025-12-01", "2026-01-02"])
    assert main(["pipeline", "run", "--data", str(tiny_dataset), "--cut", "2026-01-02"]) == 2
    assert "--cut twice" in capsys.readouterr().err


def test_the_students_window_can_overlap_the_teachers_last_days(tiny_dataset, tmp_path):
    """``pipeline run --student-overlap-days N``: the students' window starts N days before
    the teacher's end (never before the data's start); the teacher's window is unchanged."""
    from gem.protocol import ALL_TEACHER_DAYS, WindowError, overlap_students
    from gem_app.stages.context import RunContext
    from gem_app.stages.ingest import ingest

    ws = tmp_path / "ws"
    ctx = RunContext(pipeline_run_id="overlap", tracking_root=str(ws))
    plain = ingest(str(tiny_dataset), str(ws), "tiny", ctx, student_days=1, holdout_days=1,
                   student_overlap_days=0).windows
    assert plain["student_start"] == plain["teacher_end"]
    every_day = ingest(str(tiny_dataset), str(ws), "tiny", ctx, student_days=1, holdout_days=1).windows
    # the default: the teacher's every day
    assert every_day["student_start"] == every_day["start"] < plain["teacher_end"]
    overlapped = ingest(str(tiny_dataset), str(ws), "tiny", ctx, student_days=1, holdout_days=1,
                        student_overlap_days=1).windows
    assert {k: v for k, v in overlapped.items() if k != "student_start"} == \
        {k: v for k, v in plain.items() if k != "student_start"}
    teacher_end = dt.datetime.fromisoformat(plain["teacher_end"])
    assert overlapped["student_start"] == (teacher_end - dt.timedelta(days=1)).isoformat() > plain["start"]
    windows = split_windows(ws / "clean")
    assert overlap_students(windows, 0) == windows
    assert overlap_students(windows, 400).student_start == windows.start  # at most the whole teacher window
    assert overlap_students(windows, ALL_TEACHER_DAYS).student_start == windows.start
    with pytest.raises(WindowError, match="must be >= 0"):
        overlap_students(windows, -2)
