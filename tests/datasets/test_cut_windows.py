"""`pipeline run --cut A --cut B`: the teacher / student / holdout windows at explicit
time cut points instead of the last days (gem.protocol.cut_windows via the ingest stage)."""

from __future__ import annotations

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
    cut = ingest(str(tiny_dataset), str(ws), "tiny", ctx)
    assert cut.windows == {"start": manifest.start.isoformat(), "teacher_end": "2026-01-02T12:00:00+00:00",
                           "student_end": "2026-01-04T00:00:00+00:00", "end": manifest.end.isoformat()}
    write_cuts(ws, None)  # a run without cut points: the last-days protocol, not the reused cut
    default = ingest(str(tiny_dataset), str(ws), "tiny", ctx, student_days=1, holdout_days=1)
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
