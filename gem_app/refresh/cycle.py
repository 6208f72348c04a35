"""One refresh cycle, locally: the accumulated dataset cut at the newest day, then the
refresh pipeline (or, before any champion teacher exists, the full gem_pipeline)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from gem.data.contract import EVENTS_DIR, ITEMS_FILE, USERS_FILE, Manifest, event_days
from gem_app.stages.late_data import backfill_teacher_days  # noqa: F401 (re-exported)


def _link(source: Path, link: Path) -> None:
    """``link`` -> ``source``; an existing link to anything else is replaced (a view is
    never kept because a name exists)."""
    if link.is_symlink() and link.resolve() == source.resolve():
        return
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.exists():
        raise FileExistsError(f"{link}: a real folder where the dataset view needs a link to {source}")
    os.symlink(source.resolve(), link)


def dataset_until(data: Path, last_day: dt.date, out: Path) -> Path:
    """A view of ``data`` with the day partitions up to ``last_day`` (symlinks, no copy)."""
    manifest = Manifest.read(data)
    (out / EVENTS_DIR).mkdir(parents=True, exist_ok=True)
    for name in (USERS_FILE, ITEMS_FILE):
        _link(data / name, out / name)
    days = {folder.name: folder for day, folder in event_days(data).items() if day <= last_day}
    for link in (out / EVENTS_DIR).iterdir():  # days of an earlier view: cut later, or another source
        if link.is_symlink() and link.name not in days:
            link.unlink()
    for name, folder in sorted(days.items()):
        _link(folder, out / EVENTS_DIR / name)
    end = dt.datetime.combine(last_day + dt.timedelta(days=1), dt.time(), tzinfo=dt.timezone.utc)
    manifest.window_end = min(manifest.end, end).isoformat()
    manifest.write(out)
    return out


def has_champion_teacher(tracking_root: Path) -> bool:
    """Whether a champion teacher exists (after undoing a promotion commit an earlier,
    killed cycle left half-done: its champion never was)."""
    from gem import registry, tracking
    from gem_app.promotion import recover

    tracking.configure(tracking_root, experiment=registry.EXPERIMENT)
    recover(Path(tracking_root) / ".runs")
    return registry.champion_version(registry.TEACHER_MODEL) is not None


def run_cycle(days: list[dt.date], *, data: Path, workspace: Path, params: dict,
              backfill: dict | None = None) -> dict:
    """One cycle over ``days``. With ``backfill`` (late or corrected earlier days, see
    gem_app.refresh.state): every window is rebuilt from the current data (reuse is by
    content) and the teacher continues from the earliest of those days."""
    from gem_app.pipelines.local import run_pipeline

    name = days[-1].isoformat() + ("-backfill" if backfill and backfill.get("recycle") else "")
    cycle = workspace / "cycles" / name
    view = dataset_until(data, days[-1], cycle / "input")
    refresh = has_champion_teacher(workspace)
    extra = {}
    if backfill and refresh:
        extra["teacher_days"] = backfill_teacher_days(view, days[-1], dt.date.fromisoformat(backfill["from"]))
    # late data is checked here against state.json (gem_app.refresh.state), not in the pipeline
    summary = run_pipeline(cycle, refresh=refresh, tracking_root=str(workspace.resolve()),
                           data=str(view.resolve()), run_id=f"refresh-{name}", late_data="", **params, **extra)
    result = {"days": [d.isoformat() for d in days], "mode": "refresh" if refresh else "full",
              "promoted": {row["surface"]: row["promoted"] for row in summary["surfaces"]},
              "summary": str(cycle / "summary.json")}
    if backfill:
        result["backfill"] = {"late_days": sorted({*backfill["changed"], *backfill["added"]}),
                              "windows_rebuilt": ["teacher", "student", "holdout"],
                              "teacher_days": extra.get("teacher_days", "all (full pipeline)")}
    return result


def read_summary(cycle_dir: Path) -> dict:
    return json.loads((cycle_dir / "summary.json").read_text())
