"""Continuous refresh: run one cycle per batch of newly arrived days, on a schedule.

- A lock file (``flock``) makes a second concurrent refresh refuse to start.
- State (``state.json``) records the last day a successful cycle covered; it is
  written atomically and only after the cycle succeeded, so a failed cycle is retried
  next time and, since promotion is the last step of a cycle, leaves the champion
  untouched.
- Catch-up policy for missed days: ``each`` runs one cycle per missed day in order;
  ``batch`` runs one cycle over all missed days (at most ``max_days_per_cycle``).
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

from gem.data.contract import DAY_PARTITION, EVENTS_DIR
from gem.utils.atomic import write_json
from gem_app.locks import Busy, exclusive

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

    def validate(self) -> "RefreshConfig":
        if self.catch_up not in CATCH_UP_POLICIES:
            raise ValueError(f"catch_up must be one of {CATCH_UP_POLICIES}, got {self.catch_up!r}")
        if self.max_days_per_cycle < 1:
            raise ValueError(f"max_days_per_cycle must be >= 1, got {self.max_days_per_cycle}")
        return self


def parse_interval(text: str) -> float:
    """'1d', '6h', '30m', '45s' -> seconds."""
    match = _INTERVAL.match(text.strip())
    if not match:
        raise ValueError(f"interval {text!r} must look like 1d, 6h, 30m or 45s")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def refresh_lock(state_dir: Path):
    return exclusive(state_dir, "refresh", what="refresh")


def available_days(data: Path) -> list[dt.date]:
    days = []
    for folder in (Path(data) / EVENTS_DIR).glob(f"{DAY_PARTITION}=*"):
        if any(p.suffix == ".parquet" and not p.name.startswith((".", "_")) for p in folder.iterdir()):
            days.append(dt.date.fromisoformat(folder.name.split("=", 1)[1]))
    return sorted(days)


def read_state(state_dir: Path) -> dict:
    path = state_dir / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_state(state_dir: Path, state: dict) -> None:
    write_json(state, state_dir / "state.json")


def plan_cycles(cfg: RefreshConfig, state: dict) -> list[list[dt.date]]:
    """The day batches still to refresh, oldest first, under the catch-up policy."""
    days = available_days(Path(cfg.data))
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


def run_refresh(cfg: RefreshConfig, cycle: Callable[[list[dt.date]], dict]) -> list[dict]:
    """Run every pending cycle under the lock; stop at the first failure (state keeps the
    last successful day, so the next run retries from there)."""
    cfg.validate()
    state_dir = Path(cfg.state_dir)
    results = []
    with refresh_lock(state_dir):
        state = read_state(state_dir)
        plan = plan_cycles(cfg, state)
        if not plan:
            log.info("refresh: no new days in %s", cfg.data)
        for days in plan:
            started = time.perf_counter()
            log.info("refresh: cycle for %s", ", ".join(d.isoformat() for d in days))
            try:
                result = cycle(days)
            except Exception:
                log.exception("refresh: cycle for %s failed; state stays at %s", days, state.get("last_day"))
                state["last_failure"] = {"days": [d.isoformat() for d in days],
                                         "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
                _write_state(state_dir, state)
                raise
            state["last_day"] = days[-1].isoformat()
            state.pop("last_failure", None)
            state.setdefault("history", []).append(
                {"days": [d.isoformat() for d in days], "seconds": round(time.perf_counter() - started, 2),
                 "result": result})
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
        except Exception:  # noqa: BLE001 - the schedule must survive one bad cycle
            log.exception("refresh: tick failed; next one on schedule")
        ticks += 1
        if max_ticks is not None and ticks >= max_ticks:
            break
        elapsed = time.monotonic() - start
        sleep(interval_s - (elapsed % interval_s))
    return ticks
