"""The application's side of issue 16: reuse by content, degenerate surfaces, the failing
step's error on stderr, unique run ids and one pipeline run per workspace."""

from __future__ import annotations

import io
import math
import multiprocessing
import shutil
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gem_app.locks import Busy, exclusive
from gem_app.pipelines.console import PipelineConsole
from gem_app.pipelines.local import new_run_id
from gem_app.promotion import GateConfig, compare
from gem_app.stages.context import RunContext
from gem_app.stages.distill import gate_metrics
from gem_app.stages.ingest import ingest


def test_ingest_reruns_when_a_file_of_the_dataset_changes_in_place(tiny_dataset, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_dataset, data)
    ctx = RunContext(pipeline_run_id="reuse", tracking_root=str(tmp_path / "ws"))
    days = {"student_days": 1, "holdout_days": 1}
    first = ingest(str(data), str(tmp_path / "ws"), "tiny", ctx, **days)
    assert ingest(str(data), str(tmp_path / "ws"), "tiny", ctx, **days) == first  # unchanged: reused
    users = data / "users.parquet"
    table = pq.read_table(users)
    country = table.column("country").to_pylist()
    country[0] = "zz" if country[0] != "zz" else "yy"
    pq.write_table(table.set_column(table.schema.get_field_index("country"), "country", pa.array(country)), users)
    second = ingest(str(data), str(tmp_path / "ws"), "tiny", ctx, **days)
    assert second.data_digest != first.data_digest


def test_feast_materialize_is_reused_only_for_the_same_data_and_end(tiny_dataset, tmp_path):
    from gem.data.contract import Manifest
    from gem.utils.digest import tree_digest
    from gem_app.stages.features import MATERIALIZED_RECORD, feast_materialize

    ctx = RunContext(pipeline_run_id="reuse", tracking_root=str(tmp_path / "ws"))
    repo, end = tmp_path / "ws" / "feast", Manifest.read(tiny_dataset).end.isoformat()
    digest = tree_digest(tiny_dataset)
    first = feast_materialize(str(tiny_dataset), str(repo), end, ctx, data_digest=digest)
    recorded = (repo / MATERIALIZED_RECORD).stat().st_mtime_ns
    assert feast_materialize(str(tiny_dataset), str(repo), end, ctx, data_digest=digest) == first
    assert (repo / MATERIALIZED_RECORD).stat().st_mtime_ns == recorded  # reused, not materialized again
    feast_materialize(str(tiny_dataset), str(repo), end, ctx, data_digest="another dataset")
    assert (repo / MATERIALIZED_RECORD).stat().st_mtime_ns != recorded


def test_a_surface_without_holdout_clicks_is_reported_not_crashed_on():
    figures = gate_metrics({"auc/all/click": 0.6})  # no "auc/click": the surface had no positive
    assert math.isnan(figures["auc"]) and math.isnan(figures["ne"])
    promote, verdicts = compare({"stories": figures}, None, GateConfig())
    assert not promote and not verdicts[0].wins


def test_the_failing_step_prints_its_last_lines_on_stderr(tmp_path, monkeypatch):
    err, out = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.__stderr__", err)
    from rich.console import Console

    with PipelineConsole(tmp_path, console=Console(file=out)) as console:
        console.write("12:00:00 - INFO - Executing task 'ingest'\n")
        console.write("    ValueError: data/events: click=2 in row 7 (rule: click is 0 or 1)\n")
        console.write("12:00:01 - ERROR - Task 'ingest' finished with status FAILURE\n")
    assert console.failed is not None and console.failed.name == "ingest"
    assert "ingest failed" in err.getvalue() and "click=2 in row 7" in err.getvalue()
    assert "click=2 in row 7" in (tmp_path / "logs" / "001-ingest.log").read_text()


_STEPS = """
import json, sys, warnings
from gem.utils.progress import EVENT_PREFIX
from gem_app.pipelines.console import PipelineConsole
with PipelineConsole(sys.argv[1]):
    for task in ("ingest", "train"):
        print(f"12:00:00 - INFO - Executing task '{task}'")
        print('executor input: {"inputs": {}}')
        for n in range(0, 50, 10):
            print(EVENT_PREFIX + json.dumps({"kind": "progress", "desc": task, "n": n, "total": 50}))
        print(EVENT_PREFIX + json.dumps({"kind": "figure", "name": "examples", "value": 1200}))
        warnings.warn("a thread's stray warning")
        print(f"12:00:01 - INFO - Task '{task}' finished with status SUCCESS")
"""


def test_on_a_terminal_the_console_shows_step_lines_and_no_chatter(tmp_path):
    # issue 41: rich's live display took sys.stdout over on a TTY, so a person typing
    # `make run` saw every task's chatter and no step line (redirected output was fine)
    from tests.terminal import run_in_terminal

    screen = run_in_terminal([sys.executable, "-c", _STEPS, str(tmp_path)], timeout=60)
    assert screen.returncode == 0, screen.text
    assert len(screen.lines) == 2, screen.text
    assert screen.lines[0].startswith("✓ ingest") and screen.lines[1].startswith("✓ train"), screen.text
    assert "examples 1,200" in screen.lines[0]
    logged = (tmp_path / "logs" / "001-ingest.log").read_text()  # (python warns once per place)
    assert "executor input" in logged and "stray warning" in logged


def test_a_running_step_s_log_is_readable_line_by_line(tmp_path):
    # `tail -f logs/NNN-train.log` follows a long step: each line reaches the file as it is
    # written, not when a buffer fills (a 55-minute training step showed nothing for 15)
    from rich.console import Console

    with PipelineConsole(tmp_path, console=Console(file=io.StringIO())) as console:
        console.write("12:00:00 - INFO - Executing task 'train'\n")
        console.write("step 5 epoch 0 loss 0.69\n")
        assert "step 5 epoch 0" in (tmp_path / "logs" / "001-train.log").read_text()
        console.write("12:00:01 - INFO - Task 'train' finished with status SUCCESS\n")


def test_run_ids_are_unique_within_a_second():
    ids = {new_run_id() for _ in range(200)}
    assert len(ids) == 200


def _hold(folder: str, ready, release) -> None:
    with exclusive(folder, "pipeline", what="pipeline run"):
        ready.set()
        release.wait(30)


def test_a_second_pipeline_run_on_one_workspace_refuses(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(Busy, match="another pipeline run is running"):
            with exclusive(tmp_path, "pipeline", what="pipeline run"):
                pass
    finally:
        release.set()
        holder.join(10)
    with exclusive(tmp_path, "pipeline", what="pipeline run"):  # free again
        pass
