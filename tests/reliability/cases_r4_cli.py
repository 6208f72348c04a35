"""Issue 42 cases: refusals across the CLI, the refresh scheduler, empty outputs, machine failures.
Registered into tests.reliability.cases.CASES (Case, kinds and _R there)."""

from __future__ import annotations

from tests.reliability.cases import _R, SILENT_WRONG, UNCLEAR, Case

_T = f"{_R}/test_rel_r4_cli.py"
_W = f"{_R}/test_rel_r4_cli_refusals.py::test_every_refusal_is_one_or_two_lines_exit_2_without_a_traceback"
_L = f"{_R}/test_rel_r4_long.py"

CASES: tuple = (
    # case 2 (item 2): nothing that produces results exits 0 with none
    Case("score-empty-part", 2, "score --cut 2030-01-01T00:00 --part test: 'scored 0 examples', an empty Parquet, rc 0",
         f"{_T}::test_score_refuses_an_empty_part_naming_it_and_its_bounds[part-after-the-window]", 42, SILENT_WRONG),
    Case("score-validation-one-cut", 2, "score --part validation with one --cut: 'scored 0 examples', rc 0",
         f"{_T}::test_score_refuses_an_empty_part_naming_it_and_its_bounds[validation-with-one-cut]", 42,
         SILENT_WRONG),
    Case("score-allow-empty", 2, "no way to ask for an empty result on purpose",
         f"{_T}::test_an_empty_result_is_written_only_when_asked_for", 42),
    Case("features-empty-window", 2, "features build of a window without events: 0 examples, rc 0; an empty "
         "training part: a traceback after the model was built",
         f"{_T}::test_an_empty_features_window_and_an_empty_training_part_are_refused", 42, SILENT_WRONG),
    Case("score-part-without-split", 5, "score --part test without --cut or --split-file scored the whole window",
         f"{_W}[score-part-without-split]", 42, SILENT_WRONG),
    # case 5: a malformed day folder
    Case("refresh-malformed-day", 6, "refresh with events/day=2026-02-30: ValueError 'day is out of range for "
         "month', rc 1, the folder never named", f"{_T}::test_refresh_names_a_day_folder_that_is_not_a_day_in_one_line",
         42, UNCLEAR),
    Case("pipeline-malformed-day", 5, "pipeline run on a day=2026-02-30 folder: failed in ingest, 40 lines, rc 1",
         f"{_W}[pipeline-bad-day]", 42, UNCLEAR),
    # case 6: a day past the manifest's window_end
    Case("refresh-day-past-window-end", 6, "a day past window_end: 119 lines of tracebacks ending '18.26% of rows "
         "quarantined'; the day and window_end never named",
         f"{_T}::test_a_day_past_window_end_is_named_with_the_way_on_before_any_work", 42, UNCLEAR),
    Case("scheduler-day-past-window-end", 6, "a day past window_end arriving under refresh --every: a failed "
         "cycle's traceback in the log", f"{_R}/test_rel_r4_cli_refusals.py::"
         "test_a_scheduler_states_a_refused_pass_in_one_line_and_keeps_its_schedule", 42, UNCLEAR),
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
    # case 9: the machine fails a run
    Case("features-file-size-limit", 5, "ulimit -f reached in a features build: a 47-line traceback ending "
         "'OSError: [Errno 27] File too large', a partial folder left behind",
         f"{_T}::test_the_file_size_limit_in_a_features_build_is_one_line_and_leaves_nothing", 42, UNCLEAR),
    Case("features-disk-full", 5, "the disk full half-way through a rebuild: a traceback, half-written shards left",
         f"{_T}::test_a_full_disk_in_a_rebuild_empties_the_folder_and_names_the_disk", 42, UNCLEAR),
    Case("store-locked", 5, "a SQLite store locked by another process (or an unreachable tracking server): a "
         "traceback", f"{_T}::test_a_locked_or_unreachable_store_is_one_line_naming_it_exit_1", 42, UNCLEAR),
    # item 5: refusals walked command by command (those a traceback answered before)
    Case("features-start-after-end", 5, "features build --start after --end: a ValueError traceback",
         f"{_W}[features-start-after-end]", 42, UNCLEAR),
    Case("features-missing-previous", 5, "features build --previous MISSING: refused only after the whole build",
         f"{_W}[features-missing-previous]", 42, UNCLEAR),
    Case("train-dataset-as-window", 5, "train --features DATASET: a ValueError traceback 'not a features manifest'",
         f"{_W}[train-not-a-features-window]", 42, UNCLEAR),
    Case("split-file-columns", 5, "a split file without a part column: KeyError 'part'",
         f"{_W}[train-split-columns]", 42, UNCLEAR),
    Case("split-file-part", 5, "a split file with an unknown part: a ValueError traceback",
         f"{_W}[train-split-part]", 42, UNCLEAR),
    Case("split-file-unreadable", 5, "a split file that is not Parquet: an ArrowInvalid traceback",
         f"{_W}[train-split-unreadable]", 42, UNCLEAR),
    Case("score-split-twice", 5, "score with an example listed twice in the split file: a ValueError traceback",
         f"{_W}[score-split-part]", 42, UNCLEAR),
    Case("score-three-cuts", 5, "score --cut three times: a ValueError traceback",
         f"{_W}[score-three-cuts]", 42, UNCLEAR),
    Case("train-empty-part", 5, "train --cut after the window: a traceback after the MLflow run and the model",
         f"{_W}[train-empty-part]", 42, UNCLEAR),
    Case("knowledge-empty-window", 5, "knowledge generate --start after the window: a ValueError traceback after "
         "loading the teacher", f"{_W}[knowledge-empty-window]", 42, UNCLEAR),
    Case("distill-unknown-surface", 5, "distill --surfaces nope: a ValueError traceback",
         f"{_W}[distill-unknown-surface]", 42, UNCLEAR),
    Case("distill-overlapping-windows", 5, "distill --train W --eval W: a traceback after loading the teacher",
         f"{_W}[distill-overlapping-windows]", 42, UNCLEAR),
    Case("pipeline-cuts-outside", 5, "pipeline run --cut outside the data: failed in ingest, 40 lines, rc 1",
         f"{_W}[pipeline-cuts-outside]", 42, UNCLEAR),
    Case("pipeline-step-refusal", 5, "a refusal inside a pipeline task (a window the data cannot fill, by pipeline "
         "run and refresh): the task's last 40 lines, exit 1",
         f"{_R}/test_rel_r4_cli_refusals.py::test_a_step_refusing_its_input_is_the_runs_refusal_not_40_lines_of_its_log"
         "[refused]", 42, UNCLEAR),
    Case("pipeline-step-disk-full", 5, "a full disk inside a pipeline task: the task's last 40 lines",
         f"{_R}/test_rel_r4_cli_refusals.py::test_a_step_refusing_its_input_is_the_runs_refusal_not_40_lines_of_its_log"
         "[disk-full]", 42, UNCLEAR),
    Case("refusals-entry-point", 5, "refusals printed a traceback or argparse's whole usage block",
         f"{_R}/test_rel_r4_cli_refusals.py::test_refusals_through_the_real_entry_point", 42, UNCLEAR),
    Case("ingest-quarantine-over-limit", 6, "a quarantine over the limit: 119 lines of nested tracebacks",
         f"{_R}/test_rel_r4_ingest.py::test_a_quarantine_over_the_limit_is_a_refusal_naming_the_rows_file", 42,
         UNCLEAR),
    # case 4: long sequences (gem/limits.py: the kernels' tested range, 4,096 events)
    Case("train-history-past-kernel-range", 4, "one user's 205,618 events under max_seq_len 65536: gem train logged "
         "no step in 4 minutes, nothing printed, stuck in the attention's fused backward",
         f"{_L}::test_train_refuses_a_window_past_the_kernels_range_before_any_work", 42, UNCLEAR),
    Case("train-max-seq-len-8192", 4, "a max_seq_len past the kernels' tested range trained without a word",
         f"{_L}::test_the_real_limit_refuses_max_seq_len_8192", 42, UNCLEAR),
    Case("features-history-past-kernel-range", 4, "a features build keeping 65,536-event histories said nothing of "
         "the kernels' range", f"{_L}::test_the_features_build_warns_of_histories_past_the_kernels_range", 42,
         UNCLEAR),
    Case("train-long-override-progress", 4, "nothing printed before or after the first (long) step; no way to "
         "train past the limit on purpose",
         f"{_L}::test_the_override_trains_and_progress_is_shown_before_and_after_the_first_step", 42, UNCLEAR),
    Case("ctrl-c-one-line", 4, "Ctrl-C during training printed a KeyboardInterrupt traceback, exit 1",
         f"{_R}/test_rel_r4_long.py::test_ctrl_c_is_one_line_and_exit_130", 42, UNCLEAR),
)
