"""Issue 42 item 5: every refusal of a user's input or setting, in every command, is one or
two lines naming the thing and the rule, exit 2, no traceback (without --debug).

A walk over each command's inputs (files, manifests, options, split files, schedules):
each case runs ``python -m gem``'s main() in this process and checks its exit code and
stderr; ``test_refusals_through_the_real_entry_point`` runs a few as processes and greps
their whole output for a traceback. The cases a traceback (or exit 0) answered before
round 4 are registered in cases_r4_cli.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gem_app.cli import main
from tests.reliability.test_rel_r4_cli import refusal_lines

REPO = Path(__file__).resolve().parents[2]
@pytest.fixture(scope="module")
def inputs(tiny_dataset, tiny_features, tiny_teacher, tmp_path_factory) -> dict[str, str]:
    """Paths the refusals name: good inputs, and one bad input of each kind."""
    root = tmp_path_factory.mktemp("refusals")
    bad_day = shutil.copytree(tiny_dataset, root / "bad_day", ignore=shutil.ignore_patterns(".*"))
    shutil.copytree(bad_day / "events" / "day=2026-01-04", bad_day / "events" / "day=2026-02-30")
    late_day = shutil.copytree(tiny_dataset, root / "late_day", ignore=shutil.ignore_patterns(".*"))
    shutil.copytree(late_day / "events" / "day=2026-01-04", late_day / "events" / "day=2026-01-05")
    (root / "foreign").mkdir()
    (root / "foreign" / "notes.txt").write_text("someone's notes\n")
    pd.DataFrame({"example_id": [1, 2], "wrong": [1, 2]}).to_parquet(root / "split_columns.parquet")
    pd.DataFrame({"example_id": [1, 2], "part": ["train", "bogus"]}).to_parquet(root / "split_part.parquet")
    pd.DataFrame({"example_id": [1, 1], "part": ["train", "test"]}).to_parquet(root / "split_twice.parquet")
    (root / "split_unreadable.parquet").write_text("not parquet")
    return {"data": str(tiny_dataset), "features": str(tiny_features), "model": str(tiny_teacher / "model"),
            "teacher": str(tiny_teacher), "bad_day": str(bad_day), "late_day": str(late_day),
            "foreign": str(root / "foreign"), "nowhere": str(root / "nowhere"), "out": str(root / "out"),
            **{f"split_{k}": str(root / f"split_{k}.parquet") for k in ("columns", "part", "twice", "unreadable")}}


# (command line with {placeholders} of ``inputs``, what the refusal must name)
REFUSALS = {
    # data
    "data-simulate-foreign-out": ("data simulate --out {foreign} --preset tiny", "not written by gem"),
    "data-simulate-bad-setting": ("data simulate --out {out}/sim --set days=0", "days=0: must be >= 1"),
    "data-validate-missing": ("data validate {nowhere}", "not a dataset directory"),
    "data-validate-bad-day": ("data validate {bad_day}", "day=2026-02-30"),
    "data-convert-missing": ("data convert movielens {nowhere} {out}/ml", "u.data: missing"),
    # features
    "features-missing-dataset": ("features build {nowhere} {out}/f", "manifest.json: missing"),
    "features-foreign-out": ("features build {data} {foreign} --preset tiny", "not written by gem"),
    "features-start-after-end": ("features build {data} {out}/f --preset tiny --start 2026-01-03 --end 2026-01-02",
                                 "must be before its end"),
    "features-empty-window": ("features build {data} {out}/f --preset tiny --start 2030-01-01 --end 2030-01-02",
                              "holds no event"),
    "features-missing-previous": ("features build {data} {out}/f --preset tiny --previous {nowhere}/report.json",
                                  "no features report"),
    "features-bad-day": ("features build {bad_day} {out}/f --preset tiny", "day=2026-02-30"),
    "features-unknown-preset": ("features build {data} {out}/f --preset nope", "unknown features preset 'nope'"),
    "features-bad-time": ("features build {data} {out}/f --start 2026-13-01", "argument --start"),
    "features-materialize-no-repo": ("features materialize --end 2026-01-02 --repo {nowhere}", "not a Feast repo"),
    # train
    "train-not-a-features-window": ("train --features {data} --out {out}/t", "not a features manifest"),
    "train-split-columns": ("train --features {features} --out {out}/t --split-file {split_columns}",
                            "columns ['example_id', 'wrong']"),
    "train-split-part": ("train --features {features} --out {out}/t --split-file {split_part}",
                         "field part = 'bogus'"),
    "train-split-twice": ("train --features {features} --out {out}/t --split-file {split_twice}", "listed twice"),
    "train-split-unreadable": ("train --features {features} --out {out}/t --split-file {split_unreadable}",
                               "not readable"),
    "train-cut-and-split": ("train --features {features} --out {out}/t --cut 2026-01-03 --split-file "
                            "{split_part}", "not both"),
    "train-empty-part": ("train --features {features} --out {out}/t --cut 2030-01-01", "no example in part 'test'"),
    "train-missing-init": ("train --features {features} --out {out}/t --init-from {nowhere}", "no such folder"),
    # score
    "score-empty-part": ("score --model {model} --features {features} --out {out}/p.parquet --cut 2030-01-01 "
                         "--part test", "no example in part 'test'"),
    "score-part-without-split": ("score --model {model} --features {features} --out {out}/p.parquet --part test",
                                 "needs --cut or --split-file"),
    "score-three-cuts": ("score --model {model} --features {features} --out {out}/p.parquet --cut 2026-01-02 "
                         "--cut 2026-01-03 --cut 2026-01-04 --part test", "once (train/test) or twice"),
    "score-out-is-a-folder": ("score --model {model} --features {features} --out {foreign} --cut 2026-01-03 "
                              "--part test", "a folder"),
    "score-split-part": ("score --model {model} --features {features} --out {out}/p.parquet --split-file "
                         "{split_part} --part test", "field part = 'bogus'"),
    "score-missing-model": ("score --model {nowhere} --features {features} --out {out}/p.parquet", "no such folder"),
    # knowledge
    "knowledge-empty-window": ("knowledge generate --model {model} --data {features} --out {out}/k --start "
                               "2030-01-01", "no example in [2030-01-01"),
    "knowledge-foreign-out": ("knowledge generate --model {model} --data {features} --out {foreign}",
                              "not written by gem"),
    # distill
    "distill-unknown-surface": ("distill --train {features} --eval {features} --repo {nowhere} --teacher {teacher} "
                                "--out {out}/d --surfaces nope", "--surfaces: ['nope']"),
    "distill-overlapping-windows": ("distill --train {features} --eval {features} --repo {nowhere} --teacher "
                                    "{teacher} --out {out}/d", "overlap"),
    "distill-missing-eval": ("distill --train {features} --eval {nowhere} --repo {nowhere} --teacher {teacher} "
                             "--out {out}/d", "not a finished features build"),
    "distill-dataset-as-window": ("distill --train {data} --eval {features} --repo {nowhere} --teacher {teacher} "
                                  "--out {out}/d", "not a features manifest"),
    # pipeline
    "pipeline-bad-day": ("pipeline run --data {bad_day} --workspace {out}/p --preset tiny", "day=2026-02-30"),
    "pipeline-day-past-window": ("pipeline run --data {late_day} --workspace {out}/p --preset tiny",
                                 "past the manifest's window_end"),
    "pipeline-cuts-outside": ("pipeline run --data {data} --workspace {out}/p --preset tiny --cut 2020-01-03 --cut "
                              "2030-01-02", "must be increasing and inside"),
    "pipeline-one-cut": ("pipeline run --data {data} --workspace {out}/p --cut 2026-01-02", "--cut twice"),
    "pipeline-unknown-gate": ("pipeline run --data {data} --workspace {out}/p --gate nope=1", "unknown gate"),
    "pipeline-unknown-surface": ("pipeline run --data {data} --workspace {out}/p --surfaces nope", "['nope']"),
    "pipeline-negative-days": ("pipeline run --student-days -1", "argument --student-days"),
    # refresh
    "refresh-no-data": ("refresh --workspace {out}/r", "--data is required"),
    "refresh-max-cycles-alone": ("refresh --data {data} --workspace {out}/r --max-cycles 2", "give --every too"),
    "refresh-bad-day": ("refresh --data {bad_day} --workspace {out}/r", "day=2026-02-30"),
    "refresh-day-past-window": ("refresh --data {late_day} --workspace {out}/r", "past the manifest's window_end"),
    "refresh-every-zero": ("refresh --data {data} --workspace {out}/r --every 0s", "argument --every"),
    "refresh-every-unit": ("refresh --data {data} --workspace {out}/r --every 1x", "argument --every"),
    "refresh-first-day": ("refresh --data {data} --workspace {out}/r --first-day yesterday", "argument --first-day"),
    "refresh-missing-package": ("refresh schedule --host http://127.0.0.1:9 --package {nowhere}.yaml", "not found"),
}


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse's refusals
        return exit_.code


@pytest.mark.parametrize("case", list(REFUSALS))
def test_every_refusal_is_one_or_two_lines_exit_2_without_a_traceback(case, inputs, capsys):
    line, names = REFUSALS[case]
    argv = [part.format(**inputs) for part in line.split()]
    rc = _run(argv)
    captured = capsys.readouterr()
    err = captured.err
    lines = refusal_lines(err)
    assert rc == 2, (rc, err)
    assert "Traceback" not in err + captured.out, err
    assert 1 <= len(lines) <= 2 and "error: " in lines[0], err
    assert names in err, (names, err)
    if "--workspace" in argv:  # refused before any work
        assert not Path(argv[argv.index("--workspace") + 1]).exists()


def test_refusals_through_the_real_entry_point(inputs, tmp_path):
    """The same rule for the processes a user runs: the whole output of each run, grepped."""
    for case in ("features-bad-day", "pipeline-day-past-window", "refresh-every-zero"):
        line, names = REFUSALS[case]
        result = subprocess.run([sys.executable, "-m", "gem", *[p.format(**inputs) for p in line.split()]],
                                cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, (case, result.stderr)
        assert "Traceback" not in result.stdout + result.stderr, (case, result.stderr)
        assert names in result.stderr, (case, result.stderr)
    debug = subprocess.run([sys.executable, "-m", "gem", "refresh", "--data", inputs["bad_day"], "--workspace",
                            str(tmp_path / "r"), "--debug"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert debug.returncode != 0 and "Traceback" in debug.stderr  # --debug shows it


def test_a_scheduler_states_a_refused_pass_in_one_line_and_keeps_its_schedule(inputs, tmp_path, caplog,
                                                                             monkeypatch):
    """A day that arrives past window_end while `refresh --every` runs: its pass is refused
    in one line naming the day and the way on, and the scheduler goes on."""
    import logging

    import gem.data.contract as contract
    from gem_app.refresh import state

    monkeypatch.setattr(state, "run_refresh", lambda *a, **k: pytest.fail("a pass ran on refused data"))
    real, calls = contract.check_run_inputs, []

    def day_arrives(data, surfaces):  # the check before any work passes; the day arrives before the first pass
        calls.append(data)
        return real(inputs["late_day"] if len(calls) > 1 else data, surfaces)

    monkeypatch.setattr(contract, "check_run_inputs", day_arrives)
    with caplog.at_level(logging.INFO):
        assert main(["refresh", "--data", inputs["data"], "--workspace", str(tmp_path / "r"), "--every", "1d",
                     "--max-cycles", "1"]) == 0
    refused = [r for r in caplog.records if "window_end" in r.getMessage()]
    assert len(refused) == 1 and "\n" not in refused[0].getMessage() and not refused[0].exc_info
    assert "day=2026-01-05" in refused[0].getMessage() and "extend window_end" in refused[0].getMessage()


def _failing_pipeline(*raised: str):
    """A stand-in for gem_pipeline whose ingest task fails with ``raised`` (the lines kfp
    prints of a task's traceback, indented as it indents them)."""

    def make(_root, refresh=False):
        def run(**params):
            print("08:17:01.812 - INFO - Executing task 'ingest'")
            print("    Traceback (most recent call last):")
            print('      File "/work/main/gem_app/stages/ingest.py", line 165, in ingest')
            print("        chosen = evidence_windows(ws / 'clean', proof)")
            for line in raised:
                print(f"    {line}")
            print("08:17:14.513 - ERROR - Task 'ingest' finished with status FAILURE")
            raise RuntimeError("Pipeline 'gem-pipeline' finished with status FAILURE. Inner task failed: 'ingest'.")

        return run

    return make


@pytest.mark.parametrize("raised, rc, names", [
    (["gem.protocol.WindowError: /ws/clean: no surface reaches >= 200 examples in both the student and the "
      "holdout window. Lower the evidence"], 2, ["no surface reaches >= 200 examples", "ingest refused it"]),
    (["OSError: [Errno 28] No space left on device"], 1, ["no space left on the device", "free space",
                                                          "the pipeline's ingest"]),
], ids=["refused", "disk-full"])
def test_a_step_refusing_its_input_is_the_runs_refusal_not_40_lines_of_its_log(inputs, tmp_path, capfd,
                                                                               monkeypatch, raised, rc, names):
    """A refusal raised inside a pipeline task (its own process: a window the data cannot
    fill, by `pipeline run` and by `refresh`) printed the task's last 40 lines and exit 1."""
    import gem_app.pipelines.gem_pipeline as gem_pipeline

    monkeypatch.setattr(gem_pipeline, "make_gem_pipeline", _failing_pipeline(*raised))
    workspace = tmp_path / "ws"
    assert main(["pipeline", "run", "--data", inputs["data"], "--workspace", str(workspace), "--preset", "tiny"]) == rc
    captured = capfd.readouterr()
    lines = refusal_lines(captured.err)
    assert 1 <= len(lines) <= 2 and lines[0].startswith("error: ") and "Traceback" not in captured.err, captured.err
    for name in names:
        assert name in captured.err, (name, captured.err)
    assert "refused its input" in captured.out or "stopped by the machine" in captured.out


def test_a_step_failing_with_a_bug_still_shows_its_last_lines(inputs, tmp_path, capfd, monkeypatch):
    import gem_app.pipelines.gem_pipeline as gem_pipeline

    monkeypatch.setattr(gem_pipeline, "make_gem_pipeline", _failing_pipeline("ZeroDivisionError: division by zero"))
    assert main(["pipeline", "run", "--data", inputs["data"], "--workspace", str(tmp_path / "ws"),
                 "--preset", "tiny"]) == 1
    err = capfd.readouterr().err
    assert "ingest failed" in err and "ZeroDivisionError: division by zero" in err and "Traceback" in err
