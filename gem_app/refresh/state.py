"""Continuous refresh: run one cycle per batch of newly arrived days, on a schedule.

- A lock file (``flock``) makes a second concurrent refresh refuse to start.
- State (``state.json``) records the last day a successful cycle covered; it is
  written atomically and only after the cycle succeeded, so a failed cycle is retried
  next time and, since promotion is the last step of a cycle, leaves the champion
  untouched.
- Catch-up policy for missed days: ``each`` runs one cycle per missed day in order;
  ``batch`` runs one cycle over all missed days (at most ``max_days_per_cycle``).
- Late and corrected data: the state keeps each processed day's content digest
  (``days``). A day up to the last processed one that changed or appeared (late, or
  older than the first) is always reported; ``late_data`` decides what happens:
  ``refuse`` (the default) stops the pass with a message naming the days and changes
  nothing; ``backfill`` runs the next cycle (or, with no new day, the last one again)
  with its windows rebuilt from the current data and the teacher continued from the
  earliest changed day, and the cycle's result says so (``backfill``). A processed day
  that was removed (e.g. by retention) is logged and forgotten: later cycles do not
  read it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gem.data.contract import day_dir, event_days
from gem.errors import MachineError, UserError
from gem.utils.atomic import write_json
from gem_app.locks import Busy, exclusive
from gem_app.stages.late_data import LATE_DATA_POLICIES, LateData, LateDataRefused, find_late_data  # noqa: F401 (re-exported: the refresh's names)

log = logging.getLogger(__name__)

CATCH_UP_POLICIES = ("each", "batch")
_INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


RefreshBusy = Busy  # another refresh holds the lock


@dataclass(kw_only=True)
class RefreshConfig:
    data: str  # a contract dataset that keeps receiving new day partitions
    state_dir: str = "runs/refresh"
    catch_up: str = "each"
    max_days_per_cycle: int = 7
    first_day: str | None = None  # first day to refresh when no state exists (default: newest day)
    late_data: str = "refuse"  # a changed or new day up to the last processed one: refuse | backfill

    def validate(self) -> "RefreshConfig":
        from gem.config import ConfigError

        if self.catch_up not in CATCH_UP_POLICIES:
            raise ConfigError(f"catch_up must be one of {CATCH_UP_POLICIES}, got {self.catch_up!r}")
        if self.late_data not in LATE_DATA_POLICIES:
            raise ConfigError(f"late_data must be one of {LATE_DATA_POLICIES}, got {self.late_data!r}")
        if self.max_days_per_cycle < 1:
            raise ConfigError(f"max_days_per_cycle must be >= 1, got {self.max_days_per_cycle}")
        if self.first_day is not None:
            try:
                dt.date.fromisoformat(self.first_day)
            except ValueError:
                raise ConfigError(f"first_day={self.first_day!r} is not a day YYYY-MM-DD") from None
        return self


def day_digests(data: Path, days: list[dt.date]) -> dict[str, str]:
    """Each day partition's content digest (its files' names and bytes)."""
    from gem.utils.digest import tree_digest

    return {d.isoformat(): tree_digest(day_dir(Path(data), d)) for d in days}


class IntervalError(UserError, ValueError):
    """A schedule interval that is not a positive number of s, m, h or d."""


def parse_interval(text: str) -> float:
    """'1d', '6h', '30m', '45s' -> seconds (> 0; IntervalError otherwise)."""
    match = _INTERVAL.match(text.strip())
    if not match:
        raise IntervalError(f"interval {text!r} must look like 1d, 6h, 30m or 45s")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise IntervalError(f"interval {text!r} must be longer than 0 (e.g. 1d, 6h, 30m or 45s)")
    return seconds


def interval(text: str) -> str:
    """argparse type of ``--every``: refused before any work (exit 2), returned as given."""
    import argparse

    try:
        parse_interval(text)
    except IntervalError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def refresh_lock(state_dir: Path):
    return exclusive(state_dir, "refresh", what="refresh")


def scheduler_lock(state_dir: Path):
    """Held by a ``refresh --every`` for its whole life (the pass lock only during a pass):
    a second scheduler of the workspace is refused, naming the first's pid."""
    return exclusive(state_dir, "scheduler", what="refresh scheduler (--every) of this workspace")


def available_days(data: Path) -> list[dt.date]:
    """The days with event Parquet files; a day folder whose name is not a real day is
    refused (ContractError naming it and the rule)."""
    return sorted(day for day, folder in event_days(Path(data)).items()
                  if any(p.suffix == ".parquet" and not p.name.startswith((".", "_")) for p in folder.iterdir()))


def read_state(state_dir: Path) -> dict:
    path = state_dir / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_state(state_dir: Path, state: dict) -> None:
    write_json(state, state_dir / "state.json")


def plan_cycles(cfg: RefreshConfig, state: dict, days: list[dt.date] | None = None) -> list[list[dt.date]]:
    """The day batches still to refresh, oldest first, under the catch-up policy."""
    days = available_days(Path(cfg.data)) if days is None else days
    if not days:
        return []
    if "last_day" in state:
        pending = [d for d in days if d > dt.date.fromisoformat(state["last_day"])]
    else:
        first = dt.date.fromisoformat(cfg.first_day) if cfg.first_day else days[-1]
        pending = [d for d in days if d >= first]
    if cfg.catch_up == "each":
        return [[d] for d in pending]
    return [pending[i: i + cfg.max_days_per_cycle] for i in range(0, len(pending), cfg.max_days_per_cycle)]


def _late_data_plan(cfg: RefreshConfig, state: dict, state_dir: Path, digests: dict[str, str],
                    plan: list[list[dt.date]]) -> tuple[list[list[dt.date]], dict | None]:
    """Report late or corrected days; refuse them, or fold a backfill into the plan."""
    late = find_late_data(state, digests)
    if late.removed:
        log.warning("refresh: processed day(s) %s are no longer in %s; forgotten (later cycles do not read them)",
                    ", ".join(late.removed), cfg.data)
        state["days"] = {d: v for d, v in state["days"].items() if d not in late.removed}
        _write_state(state_dir, state)
    if not late:
        return plan, None
    log.warning("refresh: %s (late_data=%s)", late.describe(), cfg.late_data)
    if cfg.late_data == "refuse":
        state["late_data"] = {**late.as_dict(), "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        _write_state(state_dir, state)
        raise LateDataRefused(
            f"refresh of {cfg.data}: {late.describe()}. Nothing was run (late_data=refuse, the default): rerun with "
            "--late-data backfill to rebuild the windows they touch, or restore those days")
    backfill = {**late.as_dict(), "from": late.days[0], "recycle": not plan}
    if not plan:  # no new day: the last cycle again, on the corrected data
        plan = [[dt.date.fromisoformat(state["last_day"])]]
    return plan, backfill


def run_refresh(cfg: RefreshConfig, cycle: Callable[..., dict]) -> list[dict]:
    """Run every pending cycle under the lock; stop at the first failure (state keeps the
    last successful day, so the next run retries from there). Late or corrected days
    (see the module docstring) are refused, or backfilled by the first cycle, which is
    then called as ``cycle(days, backfill={...})``."""
    cfg.validate()
    state_dir = Path(cfg.state_dir)
    results = []
    with refresh_lock(state_dir):
        state = read_state(state_dir)
        available = available_days(Path(cfg.data))
        digests = day_digests(Path(cfg.data), available)
        if "last_day" in state and "days" not in state:  # a state from before digests were kept
            state["days"] = {d: v for d, v in digests.items() if d <= state["last_day"]}
            _write_state(state_dir, state)
            log.info("refresh: recorded the digests of %d processed days (first pass with them)", len(state["days"]))
        plan, backfill = _late_data_plan(cfg, state, state_dir, digests, plan_cycles(cfg, state, available))
        if not plan:
            log.info("refresh: no new days in %s (last processed %s, %d days unchanged)", cfg.data,
                     state.get("last_day"), len(state.get("days", {})))
        for days in plan:
            started = time.perf_counter()
            log.info("refresh: cycle for %s%s", ", ".join(d.isoformat() for d in days),
                     f" with a backfill from {backfill['from']}" if backfill else "")
            try:
                result = cycle(days, backfill=backfill) if backfill else cycle(days)
            except Exception as exc:
                if not isinstance(exc, (UserError, MachineError)):  # those: one line from the caller
                    log.exception("refresh: cycle for %s failed; state stays at %s", days, state.get("last_day"))
                state["last_failure"] = {"days": [d.isoformat() for d in days],
                                         "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
                _write_state(state_dir, state)
                raise
            state["last_day"] = max(days[-1].isoformat(), state.get("last_day", ""))
            state["days"] = {d: v for d, v in {**state.get("days", {}), **digests}.items()
                             if d <= state["last_day"] and d in digests}
            state.pop("last_failure", None)
            state.pop("late_data", None)
            state.setdefault("history", []).append(
                {"days": [d.isoformat() for d in days], "seconds": round(time.perf_counter() - started, 2),
                 "result": result, **({"backfill": backfill} if backfill else {})})
            backfill = None
            _write_state(state_dir, state)
            results.append(result)
    return results


def run_every(interval_s: float, tick: Callable[[], object], *, max_ticks: int | None = None,
              sleep: Callable[[float], None] = time.sleep) -> int:
    """Call ``tick`` now and then every ``interval_s`` (aligned to the start time, so a
    slow cycle does not drift the schedule and missed ticks are not replayed in a
    burst). A failing tick is logged and the schedule continues. Returns ticks run."""
    start = time.monotonic()
    ticks = 0
    while max_ticks is None or ticks < max_ticks:
        try:
            tick()
        except RefreshBusy as exc:
            log.warning("refresh: %s", exc)
        except (UserError, MachineError) as exc:  # a refused input, the machine: its message says it all
            log.error("refresh: %s", exc)
        except Exception:  # noqa: BLE001 - the schedule must survive one bad cycle
            log.exception("refresh: tick failed; next one on schedule")
        ticks += 1
        if max_ticks is not None and ticks >= max_ticks:
            break
        elapsed = time.monotonic() - start
        sleep(interval_s - (elapsed % interval_s))
    return ticks
