"""Issue 28, item 3: refresh never ignores late, corrected or older data in silence.
Before, after a cycle, 1,743 late events added to an earlier day, a day rewritten with
every label flipped, or a day older than the first all gave "refresh: no new days", rc 0.
Now the state keeps each processed day's digest; such a day is reported and refused
(late_data=refuse, the default) or backfilled (late_data=backfill)."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from gem.data.contract import Manifest, day_dir
from gem_app.refresh.state import LateDataRefused, RefreshConfig, available_days, read_state, run_refresh


@pytest.fixture()
def data(tiny_dataset, tmp_path):
    out = tmp_path / "incoming"
    shutil.copytree(tiny_dataset, out, ignore=shutil.ignore_patterns("_validation"))
    return out


def _days(data):
    return Manifest.read(data).days()


class Cycles:
    """Records each cycle it is asked to run (the real one runs the whole pipeline)."""

    def __init__(self):
        self.calls = []

    def __call__(self, days, backfill=None):
        self.calls.append((days, backfill))
        return {"days": [d.isoformat() for d in days]}


def _processed(data, tmp_path, **cfg):
    """State after a successful pass over every day of ``data``."""
    cfg = RefreshConfig(data=str(data), state_dir=str(tmp_path / "state"), first_day=_days(data)[0].isoformat(),
                        **cfg)
    cycles = Cycles()
    run_refresh(cfg, cycles)
    present = len(available_days(data))
    assert len(cycles.calls) == present and len(read_state(tmp_path / "state")["days"]) == present
    return cfg


def _late_events(data, day):
    """Events added to an earlier day in a new file (a late delivery)."""
    first = sorted(day_dir(data, day).glob("*.parquet"))[0]
    table = pq.read_table(first)
    late = table.set_column(0, "event_id", pc.add(table.column("event_id"), 10**12))
    pq.write_table(late, first.with_name("part-late.parquet"))
    return late.num_rows


def _flip_labels(data, day):
    for path in day_dir(data, day).glob("*.parquet"):
        table = pq.read_table(path)
        click = table.column("click")
        flipped = pc.subtract(pa.scalar(1, click.type), click)
        pq.write_table(table.set_column(table.schema.get_field_index("click"), "click", flipped), path)


def _older_day(data):
    """A day before the first, inside the manifest's window (moved one day earlier)."""
    manifest = Manifest.read(data)
    first = manifest.days()[0]
    older = first - dt.timedelta(days=1)
    manifest.window_start = dt.datetime.combine(older, dt.time(), tzinfo=dt.timezone.utc).isoformat()
    manifest.write(data)
    source = sorted(day_dir(data, first).glob("*.parquet"))[0]
    table = pq.read_table(source)
    shifted = pc.subtract(table.column("event_time"), pa.scalar(dt.timedelta(days=1)))
    table = table.set_column(table.schema.get_field_index("event_time"), "event_time", shifted)
    day_dir(data, older).mkdir(parents=True)
    pq.write_table(table, day_dir(data, older) / source.name)
    return older


@pytest.mark.parametrize("change", ["late-events", "labels-flipped", "older-day"])
def test_late_or_corrected_days_are_reported_and_refused_by_default(data, tmp_path, change, caplog):
    cfg = _processed(data, tmp_path)
    days = _days(data)
    if change == "late-events":
        assert _late_events(data, days[1]) > 0
        named, kind = days[1], "changed"
    elif change == "labels-flipped":
        _flip_labels(data, days[2])
        named, kind = days[2], "changed"
    else:
        named, kind = _older_day(data), "new"
    cycles = Cycles()
    with pytest.raises(LateDataRefused, match=f"{kind} {named.isoformat()}.*--late-data backfill"):
        run_refresh(cfg, cycles)
    assert cycles.calls == []  # nothing was run
    state = read_state(tmp_path / "state")
    assert state["late_data"][{"changed": "changed", "new": "added"}[kind]] == [named.isoformat()]
    assert f"{kind} {named.isoformat()}" in caplog.text
    with pytest.raises(LateDataRefused):  # still refused next time: never forgotten in silence
        run_refresh(cfg, cycles)


def test_backfill_reruns_the_last_cycle_with_the_corrected_days_then_goes_quiet(data, tmp_path):
    cfg = _processed(data, tmp_path)
    days = _days(data)
    _flip_labels(data, days[1])
    _late_events(data, days[2])
    cycles = Cycles()
    backfill = RefreshConfig(**{**cfg.__dict__, "late_data": "backfill"})
    results = run_refresh(backfill, cycles)
    assert len(results) == 1 and len(cycles.calls) == 1
    ran, info = cycles.calls[0]
    assert ran == [days[-1]]  # no new day: the last cycle again, on the corrected data
    assert info["changed"] == [days[1].isoformat(), days[2].isoformat()] and info["from"] == days[1].isoformat()
    assert info["recycle"] is True
    state = read_state(tmp_path / "state")
    assert "late_data" not in state and state["history"][-1]["backfill"]["from"] == days[1].isoformat()
    assert run_refresh(cfg, cycles) == [] and len(cycles.calls) == 1  # recorded: nothing late any more


def test_backfill_rides_on_the_next_new_day(data, tmp_path):
    last = _days(data)[-1]
    shutil.move(day_dir(data, last), tmp_path / "held-back")
    cfg = _processed(data, tmp_path)
    shutil.move(tmp_path / "held-back", day_dir(data, last))
    _late_events(data, _days(data)[0])
    cycles = Cycles()
    run_refresh(RefreshConfig(**{**cfg.__dict__, "late_data": "backfill"}), cycles)
    assert [c[0] for c in cycles.calls] == [[last]]
    assert cycles.calls[0][1]["changed"] == [_days(data)[0].isoformat()] and cycles.calls[0][1]["recycle"] is False


def test_a_removed_day_is_reported_and_forgotten_not_refused(data, tmp_path, caplog):
    cfg = _processed(data, tmp_path)
    first = _days(data)[0]
    shutil.rmtree(day_dir(data, first))
    assert run_refresh(cfg, Cycles()) == []
    assert f"processed day(s) {first.isoformat()} are no longer in" in caplog.text
    assert first.isoformat() not in read_state(tmp_path / "state")["days"]


def test_cli_refuses_late_data_in_one_line_with_exit_2(data, tmp_path, capsys):
    from gem_app.cli import main

    workspace = tmp_path / "ws"
    _processed(data, tmp_path)
    workspace.mkdir()
    shutil.copy(tmp_path / "state" / "state.json", workspace / "state.json")
    _flip_labels(data, _days(data)[1])
    rc = main(["refresh", "--data", str(data), "--workspace", str(workspace), "--preset", "tiny"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert f"changed {_days(data)[1].isoformat()}" in err and "--late-data backfill" in err
    assert not (workspace / "cycles").exists()


def test_a_state_from_before_day_digests_adopts_them_without_a_false_alarm(data, tmp_path):
    cfg = _processed(data, tmp_path)
    path = tmp_path / "state" / "state.json"
    state = json.loads(path.read_text())
    del state["days"]
    path.write_text(json.dumps(state))
    assert run_refresh(cfg, Cycles()) == []
    assert len(read_state(tmp_path / "state")["days"]) == len(_days(data))


def test_a_backfill_teacher_window_reaches_back_to_the_earliest_late_day(data, tmp_path):
    from gem_app.refresh.cycle import backfill_teacher_days, dataset_until

    days = _days(data)  # 4 days: a cycle at the last one trains the teacher on days[:2] at most
    view = dataset_until(data, days[-1], tmp_path / "view")
    assert backfill_teacher_days(view, days[-1], days[1]) == 1  # the usual one day
    assert backfill_teacher_days(view, days[-1], days[0]) == 2
    assert backfill_teacher_days(view, days[-1], days[-1]) == 1  # the holdout day itself: rebuilt anyway
    assert backfill_teacher_days(view, days[-1], days[0] - dt.timedelta(days=9)) == 2  # not before the data


# -- the recurring refresh pipeline on a cluster: no state.json, the last commit's record --
def _ingest(data, tmp_path, late_data):
    from gem_app.stages.context import RunContext
    from gem_app.stages.ingest import ingest

    ctx = RunContext(pipeline_run_id="late", tracking_root=str(tmp_path / "store"))
    ctx.configure()
    return ingest(str(data), str(tmp_path / "ws"), "tiny", ctx, student_days=1, holdout_days=1, teacher_days=1,
                  late_data=late_data)


def test_the_refresh_pipeline_refuses_or_backfills_days_changed_since_the_last_commit(data, tmp_path):
    """The compiled refresh pipeline (late_data=refuse by default) keeps no state.json:
    its ingest compares the data with the days the last committed run recorded."""
    from gem.data.contract import DatasetHandle
    from gem_app.stages.late_data import committed_days, read_days, record_committed_days

    assert not _ingest(data, tmp_path, "refuse").late_data  # nothing recorded yet: nothing late
    record_committed_days(tmp_path / "store", data, DatasetHandle.open(data).day_digests())
    assert not _ingest(data, tmp_path, "refuse").late_data  # as committed
    days = _days(data)
    assert _late_events(data, days[0]) > 0
    with pytest.raises(LateDataRefused, match=f"changed {days[0].isoformat()}.*late_data=backfill"):
        _ingest(data, tmp_path, "refuse")
    result = _ingest(data, tmp_path, "backfill")
    assert result.late_data["changed"] == [days[0].isoformat()]
    # the teacher window reaches back to it: [days[0], the student window's first day)
    assert result.late_data["teacher_days"] == (days[-2] - days[0]).days > 1
    assert result.windows["start"][:10] == days[0].isoformat()
    assert read_days(result.days) == DatasetHandle.open(data).day_digests()  # the file the commit reads
    assert committed_days(tmp_path / "store", data)["days"][days[0].isoformat()] != read_days(result.days)[
        days[0].isoformat()]


def test_the_commit_records_the_days_the_run_read(data, tmp_path):
    """promote (the run's commit) records them; a run that fails never reaches it."""
    from gem.data.contract import DatasetHandle
    from gem_app.stages.context import RunContext
    from gem_app.stages.gate import promote
    from gem_app.stages.late_data import committed_days, write_days

    ctx = RunContext(pipeline_run_id="commit", tracking_root=str(tmp_path / "store"))
    digests = DatasetHandle.open(data).day_digests()
    assert len(digests) == len(_days(data))
    promote({}, [], ctx, data=str(data), data_days=write_days(tmp_path / "ws", digests))
    recorded = committed_days(tmp_path / "store", data)
    assert recorded["days"] == digests and recorded["last_day"] == _days(data)[-1].isoformat()
