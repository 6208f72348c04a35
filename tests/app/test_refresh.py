"""Refresh scheduling: lock, catch-up policies, failure leaves state untouched."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import time
from pathlib import Path

import pytest

from gem.data.contract import day_dir
from gem_app.refresh.state import (
    RefreshBusy,
    RefreshConfig,
    parse_interval,
    plan_cycles,
    read_state,
    refresh_lock,
    run_every,
    run_refresh,
)

D0 = dt.date(2026, 1, 1)


def _dataset(root: Path, n_days: int) -> Path:
    for i in range(n_days):
        folder = day_dir(root, D0 + dt.timedelta(days=i))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "part-00000.parquet").write_bytes(b"x")
    return root


def _hold_lock(state_dir: str, ready, release) -> None:
    with refresh_lock(Path(state_dir)):
        ready.set()
        release.wait(10)


def test_second_concurrent_refresh_refuses(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        cfg = RefreshConfig(data=str(_dataset(tmp_path / "d", 2)), state_dir=str(tmp_path))
        with pytest.raises(RefreshBusy, match="another refresh is running \\(pid"):
            run_refresh(cfg, lambda days: {})
    finally:
        release.set()
        holder.join(10)
    assert run_refresh(cfg, lambda days: {"n": len(days)}) == [{"n": 1}]  # lock free again


def test_catch_up_policies(tmp_path):
    data = _dataset(tmp_path / "d", 5)
    state = {"last_day": D0.isoformat()}
    each = plan_cycles(RefreshConfig(data=str(data), catch_up="each"), state)
    assert each == [[D0 + dt.timedelta(days=i)] for i in range(1, 5)]
    batch = plan_cycles(RefreshConfig(data=str(data), catch_up="batch", max_days_per_cycle=3), state)
    assert batch == [[D0 + dt.timedelta(days=i) for i in (1, 2, 3)], [D0 + dt.timedelta(days=4)]]
    assert plan_cycles(RefreshConfig(data=str(data)), {}) == [[D0 + dt.timedelta(days=4)]]  # first run: newest day


def test_failed_cycle_keeps_state_and_is_retried(tmp_path):
    data = _dataset(tmp_path / "d", 3)
    cfg = RefreshConfig(data=str(data), state_dir=str(tmp_path / "s"), first_day=D0.isoformat())
    seen = []

    def flaky(days):
        seen.append(days[0])
        if days[0] == D0 + dt.timedelta(days=1):
            raise RuntimeError("training diverged")
        return {"ok": True}

    with pytest.raises(RuntimeError, match="diverged"):
        run_refresh(cfg, flaky)
    state = read_state(Path(cfg.state_dir))
    assert state["last_day"] == D0.isoformat() and state["last_failure"]["days"] == ["2026-01-02"]
    assert run_refresh(cfg, lambda days: {"ok": True}) == [{"ok": True}, {"ok": True}]
    assert read_state(Path(cfg.state_dir))["last_day"] == "2026-01-03"
    assert "last_failure" not in read_state(Path(cfg.state_dir))


def test_schedule_survives_failures_and_keeps_cadence():
    calls, sleeps = [], []

    def tick():
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise RuntimeError("boom")

    assert run_every(10.0, tick, max_ticks=3, sleep=sleeps.append) == 3
    assert len(calls) == 3 and len(sleeps) == 2 and all(0 < s <= 10.0 for s in sleeps)
    assert parse_interval("1d") == 86400 and parse_interval("30m") == 1800
    with pytest.raises(ValueError, match="must look like"):
        parse_interval("daily")


def test_dataset_view_follows_its_source_not_the_names_already_there(tmp_path):
    from gem.data.contract import EVENTS_DIR, ITEMS_FILE, USERS_FILE, Manifest
    from gem_app.refresh.cycle import dataset_until

    def source(name: str, n_days: int) -> Path:
        root = _dataset(tmp_path / name, n_days)
        for file in (USERS_FILE, ITEMS_FILE):
            (root / file).write_text(name)
        Manifest(name=name, source="test", window_start="2026-01-01T00:00:00+00:00",
                 window_end="2026-01-05T00:00:00+00:00").write(root)
        return root

    first, second, view = source("first", 4), source("second", 2), tmp_path / "view"
    dataset_until(first, D0 + dt.timedelta(days=3), view)
    dataset_until(second, D0 + dt.timedelta(days=1), view)  # the same folder, another source with fewer days
    assert (view / USERS_FILE).read_text() == "second" and (view / ITEMS_FILE).read_text() == "second"
    days = sorted(p for p in (view / EVENTS_DIR).iterdir())
    assert [p.resolve() for p in days] == [day_dir(second, D0 + dt.timedelta(days=i)).resolve() for i in range(2)]
    assert Manifest.read(view).window_end == "2026-01-03T00:00:00+00:00"
