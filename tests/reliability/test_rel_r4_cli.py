"""Issue 42 (reliability round 4), cases 2 and 5-9: empty outputs, malformed and late day
folders, the refresh scheduler, the exit code of "already running", and the machine
failing a features build. Each test fails when its fix is removed (see cases_r4_cli.py)."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gem_app.cli import main

REPO = Path(__file__).resolve().parents[2]


# lines of logging and of Python's warnings (the libraries' chatter while importing), not a refusal's
_CHATTER = re.compile(r"^(\d{4}/\d\d/\d\d )?\d\d:\d\d:\d\d (DEBUG|INFO|WARNING) |^\S+:\d+: \w*Warning: |^  |"
                      r"^(\[rank\d+\]:)?[WI]\d{4} ")


def refusal_lines(err: str) -> list[str]:
    """The lines of ``err`` a refusal printed (logging and warnings left out)."""
    return [line for line in err.strip().splitlines() if line.strip() and not _CHATTER.match(line)]


def _refused(capsys, *names: str) -> str:
    """stderr of a refusal: one or two lines, the first ``error: ...``, naming ``names``."""
    err = capsys.readouterr().err
    lines = refusal_lines(err)
    assert 1 <= len(lines) <= 2 and "error: " in lines[0], err
    assert "Traceback" not in err, err
    for name in names:
        assert name in err, (name, err)
    return err


def _copy(dataset: Path, dest: Path) -> Path:
    shutil.copytree(dataset, dest, ignore=shutil.ignore_patterns(".*"))
    return dest


# -- case 2: nothing that produces results exits 0 with none ------------------------------


@pytest.mark.parametrize("cuts, part, names", [
    (["2030-01-01T00:00"], "test", ["part 'test'", "event time from 2030-01-01T00:00:00+00:00",
                                    "the window is [2026-01-01"]),
    (["2026-01-03T00:00"], "validation", ["part 'validation'", "parts ['train', 'test'] only"]),
], ids=["part-after-the-window", "validation-with-one-cut"])
def test_score_refuses_an_empty_part_naming_it_and_its_bounds(tiny_features, tiny_teacher, tmp_path, capsys,
                                                             cuts, part, names):
    """Case 2: `score --cut 2030-01-01T00:00 --part test` printed `scored 0 examples`,
    wrote an empty Parquet and exited 0 (also `--part validation` with one cut)."""
    out = tmp_path / "preds.parquet"
    args = ["score", "--model", str(tiny_teacher / "model"), "--features", str(tiny_features), "--out", str(out),
            *[a for c in cuts for a in ("--cut", c)], "--part", part]
    assert main(args) == 2
    _refused(capsys, str(tiny_features), *names)
    assert not out.exists()


def test_an_empty_result_is_written_only_when_asked_for(tiny_features, tiny_teacher, tmp_path, capsys):
    import pandas as pd

    out = tmp_path / "preds.parquet"
    assert main(["score", "--model", str(tiny_teacher / "model"), "--features", str(tiny_features), "--out", str(out),
                 "--cut", "2030-01-01T00:00", "--part", "test", "--allow-empty"]) == 0
    assert "scored 0 examples" in capsys.readouterr().out and len(pd.read_parquet(out)) == 0


def test_an_empty_features_window_and_an_empty_training_part_are_refused(tiny_dataset, tiny_features, tmp_path,
                                                                         capsys):
    """Item 2 applied to features windows and to train's split: a window without any
    event built 0 examples with exit 0; a training part without examples was a traceback."""
    out = tmp_path / "features"
    assert main(["features", "build", str(tiny_dataset), str(out), "--preset", "tiny", "--start", "2030-01-01",
                 "--end", "2030-01-02"]) == 2
    _refused(capsys, "[2030-01-01T00:00:00+00:00, 2030-01-02T00:00:00+00:00) holds no event", "--allow-empty")
    assert not (out / "manifest.json").exists()
    assert main(["train", "--features", str(tiny_features), "--out", str(tmp_path / "run"), "--cut", "2030-01-01",
                 "--set", "max_steps=1"]) == 2
    _refused(capsys, "no example in part 'test' of the split", "from 2030-01-01T00:00:00+00:00")


# -- cases 5 and 6: a malformed day folder, a day past the manifest's window_end ---------


def test_refresh_names_a_day_folder_that_is_not_a_day_in_one_line(tiny_dataset, tmp_path, capsys):
    """Case 5: `events/day=2026-02-30/` gave a traceback ending `ValueError: day is out of
    range for month`, exit 1, the folder never named."""
    data = _copy(tiny_dataset, tmp_path / "data")
    shutil.copytree(data / "events" / "day=2026-01-04", data / "events" / "day=2026-02-30")
    workspace = tmp_path / "ws"
    assert main(["refresh", "--data", str(data), "--workspace", str(workspace), "--preset", "tiny"]) == 2
    _refused(capsys, "events/day=2026-02-30", "day is out of range for month", "day=YYYY-MM-DD, a real calendar day")
    assert not workspace.exists()  # before any work
    from gem.data.contract import ContractError
    from gem_app.refresh.state import available_days

    with pytest.raises(ContractError, match="day=2026-02-30: not a day partition"):  # a scheduler's pass too
        available_days(data)


def test_a_day_past_window_end_is_named_with_the_way_on_before_any_work(tiny_dataset, tmp_path, capsys):
    """Case 6: a day past the manifest's window_end: 119 lines of nested tracebacks ending
    `18.2605% of rows quarantined`; the day and window_end never named."""
    data = _copy(tiny_dataset, tmp_path / "data")
    shutil.copytree(data / "events" / "day=2026-01-04", data / "events" / "day=2026-01-05")
    names = ["events/day=2026-01-05", "past the manifest's window_end 2026-01-05T00:00:00+00:00",
             "extend window_end to 2026-01-06T00:00:00+00:00"]
    workspace = tmp_path / "ws"
    assert main(["refresh", "--data", str(data), "--workspace", str(workspace), "--preset", "tiny"]) == 2
    assert len(refusal_lines(_refused(capsys, *names))) == 1
    assert main(["pipeline", "run", "--data", str(data), "--workspace", str(workspace), "--preset", "tiny"]) == 2
    _refused(capsys, *names)
    assert not workspace.exists()
    manifest = json.loads((data / "manifest.json").read_text())  # the way on: extend window_end
    manifest["window_end"] = "2026-01-06T00:00:00+00:00"
    (data / "manifest.json").write_text(json.dumps(manifest))
    from gem.data.contract import check_run_inputs

    check_run_inputs(data, [])


# -- case 7: the refresh scheduler's --every and one scheduler per workspace --------------


@pytest.mark.parametrize("every, rule", [("0s", "must be longer than 0"), ("1x", "must look like 1d, 6h, 30m")],
                         ids=["zero", "unknown-unit"])
def test_a_bad_every_is_refused_before_any_work(tiny_dataset, tmp_path, capsys, monkeypatch, every, rule):
    """Case 7: `--every 0s` ran a whole pass, then `ZeroDivisionError: float modulo`;
    `--every 1x` was a ValueError traceback."""
    from gem_app.refresh import state

    passes = []
    monkeypatch.setattr(state, "run_refresh", lambda *a, **k: passes.append(a) or [])
    with pytest.raises(SystemExit) as exit_:
        main(["refresh", "--data", str(tiny_dataset), "--workspace", str(tmp_path / "ws"), "--every", every,
              "--max-cycles", "1"])
    assert exit_.value.code == 2 and not passes
    err = capsys.readouterr().err
    assert "argument --every" in err and rule in err and "Traceback" not in err and len(refusal_lines(err)) == 1


def _quiet_state(data: Path, workspace: Path) -> None:
    """A refresh state with every day of ``data`` processed: a pass finds nothing to do."""
    from gem_app.refresh.state import available_days, day_digests

    days = available_days(data)
    workspace.mkdir(parents=True)
    (workspace / "state.json").write_text(json.dumps({"last_day": days[-1].isoformat(),
                                                      "days": day_digests(data, days)}))


def test_a_second_scheduler_of_a_workspace_is_refused_naming_the_first(tiny_dataset, tmp_path, capsys):
    """Case 7: two `refresh --every 1d` ran side by side on one workspace (the lock was
    held only during a pass). The first here is a real scheduler between its passes."""
    workspace = tmp_path / "ws"
    _quiet_state(tiny_dataset, workspace)
    first = subprocess.Popen([sys.executable, "-m", "gem", "refresh", "--data", str(tiny_dataset), "--workspace",
                              str(workspace), "--preset", "tiny", "--every", "1d"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(first.stderr.readline, "")), daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while not any("refresh: no new days" in line for line in lines):  # its first pass is over: it sleeps
            assert first.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "the first scheduler never finished its first pass"
            time.sleep(0.1)
        rc = main(["refresh", "--data", str(tiny_dataset), "--workspace", str(workspace), "--preset", "tiny",
                   "--every", "1d", "--max-cycles", "1"])
        assert rc == 2
        _refused(capsys, "another refresh scheduler", f"pid {first.pid}")
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)


# -- case 8: "already running" exits 2, as every refusal ---------------------------------


def _hold_locks(pipeline_ws: str, refresh_ws: str, ready, release) -> None:
    from gem_app.locks import exclusive
    from gem_app.refresh.state import refresh_lock

    with exclusive(pipeline_ws, "pipeline", what="pipeline run"), refresh_lock(Path(refresh_ws)):
        ready.set()
        release.wait(60)


def test_already_running_exits_2_in_pipeline_and_refresh_as_the_readme_says(tiny_dataset, tmp_path, capsys):
    """Case 8: `pipeline run` exited 1 and `refresh` 3 when another run held the
    workspace; the README says a refusal exits 2."""
    readme = (REPO / "README.md").read_text()
    assert "a workspace another run" in readme and "and exits 2" in readme
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    pipeline_ws, refresh_ws = tmp_path / "pipeline", tmp_path / "refresh"
    holder = ctx.Process(target=_hold_locks, args=(str(pipeline_ws), str(refresh_ws), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        assert main(["pipeline", "run", "--data", str(tiny_dataset), "--workspace", str(pipeline_ws),
                     "--preset", "tiny"]) == 2
        _refused(capsys, "another pipeline run is running", f"pid {holder.pid}")
        assert main(["refresh", "--data", str(tiny_dataset), "--workspace", str(refresh_ws), "--preset", "tiny"]) == 2
        _refused(capsys, "another refresh is running", f"pid {holder.pid}")
    finally:
        release.set()
        holder.join(30)


# -- case 9: the machine fails a features build -------------------------------------------


def _file_size_limit(limit: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_the_file_size_limit_in_a_features_build_is_one_line_and_leaves_nothing(tiny_dataset, tmp_path):
    """Case 9: `ulimit -f` reached during a features build: a 47-line traceback ending
    `OSError: [Errno 27] File too large`, a partial folder left behind."""
    out = tmp_path / "features"
    result = subprocess.run([sys.executable, "-m", "gem", "features", "build", str(tiny_dataset), str(out),
                             "--preset", "tiny"], cwd=REPO, capture_output=True, text=True,
                            preexec_fn=_file_size_limit(40 * 1024), timeout=300)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: features build stopped:") and "ulimit -f: 40,960 bytes" in last, last
    assert f"its unfinished folder {out} was removed" in last
    assert not out.exists()


def test_a_full_disk_in_a_rebuild_empties_the_folder_and_names_the_disk(tiny_dataset, tmp_path, capsys,
                                                                       monkeypatch):
    """Case 9, the disk full half-way through the shards of a rebuild: no earlier build's
    manifest nor any half-written shard is left for a rerun to trust."""
    import gem.features.shards as shards
    from gem.features.build import build_features
    from gem.utils.outputs import MARKER
    from tests.features.conftest import tiny_cfg

    out = tmp_path / "features"
    build_features(tiny_dataset, out, tiny_cfg(max_seq_len=8, num_buckets=1))
    assert (out / "manifest.json").is_file()
    written = []

    def full(table, path, *args, **kwargs):
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        written.append(path)
        return real(table, path, *args, **kwargs)

    real = shards.write_parquet
    monkeypatch.setattr(shards, "write_parquet", full)
    assert main(["features", "build", str(tiny_dataset), str(out), "--preset", "tiny", "--set", "max_seq_len=8",
                 "--set", "num_buckets=1"]) == 1
    err = _refused(capsys, "no space left on the device", "MiB free there", "free space on that disk",
                   f"the unfinished contents of {out} were removed")
    assert "shards" in err  # the file it was writing
    assert sorted(p.name for p in out.iterdir()) == [MARKER]
    monkeypatch.setattr(shards, "write_parquet", real)
    assert main(["features", "build", str(tiny_dataset), str(out), "--preset", "tiny", "--set", "max_seq_len=8",
                 "--set", "num_buckets=1"]) == 0  # the rerun builds it whole
    assert (out / "manifest.json").is_file()


def test_a_locked_or_unreachable_store_is_one_line_naming_it_exit_1(tmp_path, capsys, monkeypatch):
    """Item 5's machine failures beyond the disk: a SQLite store locked by another process,
    a tracking server that does not answer (gem.tracking names it), a full disk under a
    library's own error; a bug keeps its traceback."""
    import sqlite3

    import gem.data.simulate as simulate
    from gem.errors import machine_failure
    from gem.tracking import TrackingUnavailable

    def locked(*args, **kwargs):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(simulate, "simulate", locked)
    assert main(["data", "simulate", "--out", str(tmp_path / "d"), "--preset", "tiny"]) == 1
    _refused(capsys, "SQLite store is locked by another process", "wait for it to finish")
    unreachable = TrackingUnavailable("MLflow tracking server http://***@h:1 unreachable after 3 attempts; check it")
    assert machine_failure(unreachable) == str(unreachable)
    try:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            raise RuntimeError("writing the checkpoint failed") from exc
    except RuntimeError as wrapped:
        assert "no space left on the device" in machine_failure(wrapped, where=str(tmp_path))
    assert machine_failure(ValueError("a bug")) is None
    monkeypatch.setattr(simulate, "simulate", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["data", "simulate", "--out", str(tmp_path / "d"), "--preset", "tiny"])
