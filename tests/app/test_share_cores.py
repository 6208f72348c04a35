"""A loop's task run beside others by a local run takes its share of the cores for torch
(gem_app.components.runtime.share_cores); elsewhere torch keeps its own choice."""

from __future__ import annotations

import os

import torch

from gem_app.components.runtime import LOCAL_PARALLEL_ENV, share_cores


def test_a_local_loops_task_takes_its_share_of_the_cores(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv(LOCAL_PARALLEL_ENV, raising=False)
        share_cores()
        assert torch.get_num_threads() == before  # a cluster's pod, one process: unchanged
        monkeypatch.setenv(LOCAL_PARALLEL_ENV, "2")
        share_cores()
        assert torch.get_num_threads() == max(1, (os.cpu_count() or 1) // 2)
    finally:
        torch.set_num_threads(before)


def test_a_local_run_tells_its_tasks_how_many_run_at_once(tmp_path, monkeypatch):
    from gem_app.pipelines.local import LOCAL_LOOP_PARALLELISM, init_local

    monkeypatch.setenv(LOCAL_PARALLEL_ENV, "0")  # recorded: the test's process gets its own value back
    init_local(tmp_path / "kfp")
    assert os.environ[LOCAL_PARALLEL_ENV] == str(LOCAL_LOOP_PARALLELISM)
