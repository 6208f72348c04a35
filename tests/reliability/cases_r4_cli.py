"""Issue 42 cases: refusals across the CLI, the refresh scheduler, empty outputs, machine failures.
Registered into tests.reliability.cases.CASES (Case, kinds and _R there)."""

from __future__ import annotations

from tests.reliability.cases import _R, UNCLEAR, Case

_T = f"{_R}/test_rel_r4_cli.py"

CASES: tuple = (
    # case 5: a malformed day folder
    Case("refresh-malformed-day", 6, "refresh with events/day=2026-02-30: ValueError 'day is out of range for "
         "month', rc 1, the folder never named", f"{_T}::test_refresh_names_a_day_folder_that_is_not_a_day_in_one_line",
         42, UNCLEAR),
    # case 6: a day past the manifest's window_end
    Case("refresh-day-past-window-end", 6, "a day past window_end: 119 lines of tracebacks ending '18.26% of rows "
         "quarantined'; the day and window_end never named",
         f"{_T}::test_a_day_past_window_end_is_named_with_the_way_on_before_any_work", 42, UNCLEAR),
    # case 7: the refresh scheduler
    Case("refresh-every-zero", 6, "refresh --every 0s ran a whole pass, then ZeroDivisionError: float modulo",
         f"{_T}::test_a_bad_every_is_refused_before_any_work[zero]", 42, UNCLEAR),
    Case("refresh-every-unit", 6, "refresh --every 1x: a ValueError traceback",
         f"{_T}::test_a_bad_every_is_refused_before_any_work[unknown-unit]", 42, UNCLEAR),
    Case("refresh-two-schedulers", 6, "two refresh --every 1d ran side by side on one workspace (the lock was held "
         "only during a pass)", f"{_T}::test_a_second_scheduler_of_a_workspace_is_refused_naming_the_first", 42),
    # case 8: "already running"
    Case("already-running-exit-code", 5, "another run holding the workspace: pipeline run exited 1, refresh 3; the "
         "README says a refusal exits 2",
         f"{_T}::test_already_running_exits_2_in_pipeline_and_refresh_as_the_readme_says", 42, UNCLEAR),
)
