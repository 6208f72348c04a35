"""Registry of the reliability cases of issue 16 ("Nothing silently wrong") and issue 28
("Nothing moves unless the whole run succeeds...") that the library fixes, one per
(case, defect, test), for benchmarks to turn into benchmarks/results/reliability.json
(run each node id with pytest; passed = fixed). ``kind`` says what the defect was
without the fix: a silent wrong result, a silent loss, or a refusal that was unclear.

    from tests.reliability.cases import CASES
    for case in CASES: print(case.id, case.defect, case.node)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Case:
    id: str  # stable name of the case
    defect: int  # the defect's number in its issue
    summary: str  # what goes wrong without the fix
    node: str  # pytest node id, relative to the repository root
    issue: int = 16
    kind: str = ""  # SILENT_WRONG, SILENT_LOSS, UNCLEAR or "" (another failure)


SILENT_WRONG, SILENT_LOSS, UNCLEAR = "silent wrong result", "silent loss", "unclear error"


_R = "tests/reliability"
CASES: tuple[Case, ...] = (
    Case("resume-after-final-checkpoint", 2, "resuming a finished run trained another epoch",
         f"{_R}/test_rel_resume.py::test_resuming_a_finished_run_does_no_step_and_keeps_its_weights"),
    Case("resume-after-any-checkpoint", 2, "a run killed at an epoch end or after its last step ended elsewhere",
         f"{_R}/test_rel_resume.py::test_killed_after_any_checkpoint_then_resumed_matches_uninterrupted"),
    Case("resume-sigkill-mid-run", 2, "a run killed with SIGKILL mid-way differs from the uninterrupted one",
         "tests/training/test_resume.py::test_sigkill_then_resume_matches_uninterrupted"),
    Case("features-bad-label", 3, "click=2 reached training",
         f"{_R}/test_rel_features_validation.py::test_features_build_refuses_rows_the_validator_rejects[click-2]"),
    Case("features-unknown-surface", 3, "an unknown surface was relabelled",
         f"{_R}/test_rel_features_validation.py::test_features_build_refuses_rows_the_validator_rejects[unknown-surface]"),
    Case("features-null-id", 3, "a null id became int64 garbage",
         f"{_R}/test_rel_features_validation.py::test_features_build_refuses_rows_the_validator_rejects[null-user-id]"),
    Case("features-null-time", 3, "a null event time reached training",
         f"{_R}/test_rel_features_validation.py::test_features_build_refuses_rows_the_validator_rejects[null-event-time]"),
    Case("features-duplicates", 3, "duplicate rows reached training",
         f"{_R}/test_rel_features_validation.py::test_duplicate_rows_are_refused"),
    Case("features-empty-dataset", 3, "an empty dataset crashed features build with IndexError",
         f"{_R}/test_rel_features_validation.py::test_an_empty_dataset_is_refused_clearly"),
    Case("features-quarantine-mode", 3, "no way to build from the valid rows only",
         f"{_R}/test_rel_features_validation.py::test_quarantine_mode_builds_from_the_valid_rows_only"),
    Case("validate-long-id", 5, "an id string beyond int64 crashed the validator (ArrowInvalid)",
         f"{_R}/test_rel_validator.py::test_an_id_string_beyond_int64_is_quarantined_not_a_crash"),
    Case("validate-uint64-id", 5, "an unsigned id above int64 crashed the validator",
         f"{_R}/test_rel_validator.py::test_an_unsigned_id_above_int64_is_quarantined"),
    Case("validate-invalid-utf8", 5, "invalid UTF-8 crashed the validator",
         f"{_R}/test_rel_validator.py::test_invalid_utf8_is_quarantined_with_its_bytes_kept"),
    Case("validate-empty-dataset", 5, "an empty dataset validated with exit code 0",
         f"{_R}/test_rel_validator.py::test_an_empty_dataset_is_a_clear_error_with_its_own_exit_code"),
    Case("validate-exit-codes", 5, "exit code 1 meant both a crash and a quarantine over the limit",
         f"{_R}/test_rel_validator.py::test_exit_codes_are_distinct_and_documented"),
    Case("output-is-input", 6, "features build D D deleted the dataset's manifest",
         f"{_R}/test_rel_outputs.py::test_features_build_into_its_own_input_is_refused_and_the_dataset_survives"),
    Case("output-foreign-folder", 6, "a build wrote into a folder of someone else's files",
         f"{_R}/test_rel_outputs.py::test_a_foreign_non_empty_folder_is_refused_and_kept"),
    Case("knowledge-out-emptied", 6, "knowledge generate --out DIR emptied an existing DIR",
         f"{_R}/test_rel_outputs.py::test_knowledge_generate_refuses_a_foreign_folder_and_replaces_its_own"),
    Case("dataset-outputs", 6, "validate --out / simulate wrote over foreign folders",
         f"{_R}/test_rel_outputs.py::test_validate_out_and_simulate_refuse_foreign_folders"),
    Case("model-pickle-replaced", 7, "a replaced model file ran code when loaded",
         f"{_R}/test_rel_model_store.py::test_a_replaced_weights_file_is_refused_by_digest_and_never_run"),
    Case("model-weights-only", 7, "a pickle with matching digests could still run code",
         f"{_R}/test_rel_model_store.py::test_weights_only_refuses_a_malicious_pickle_even_with_matching_digests"),
    Case("model-mlflow-no-unpickle", 7, "registry models were loaded with MLflow's pickle loader",
         f"{_R}/test_rel_model_store.py::test_mlflow_models_are_logged_as_files_and_load_without_unpickling"),
    Case("training-imports-knowledge", 7, "gem.training imported gem.knowledge (layering)",
         f"{_R}/test_rel_model_store.py::test_training_does_not_import_knowledge"),
    Case("redact-uri", 7, "credentials in MLFLOW_TRACKING_URI were printed",
         f"{_R}/test_rel_tracking.py::test_redact_hides_credentials_and_query_values"),
    Case("redact-params", 7, "credentials in the tracking URI were logged as a run param",
         f"{_R}/test_rel_tracking.py::test_tracking_uri_params_are_logged_redacted"),
    Case("sql-quoted-paths", 7, "a ' in a dataset path broke (or changed) a duckdb query",
         f"{_R}/test_rel_sql_paths.py::test_paths_with_quotes_build_the_same_features"),
    Case("tracking-unreachable", 9, "gem train waited 266 s on an unreachable tracking URI",
         f"{_R}/test_rel_tracking.py::test_train_on_an_unreachable_tracking_server_fails_fast_and_redacted"),
    # issue 28, items 2-9 (item 1, promotion as one transaction, is in the fault suite)
    Case("score-smaller-vocabulary", 2, "score on another dataset's smaller vocabularies: rc 0, wrong embeddings",
         f"{_R}/test_rel_vocabularies.py::test_score_refuses_another_datasets_window_naming_both_digests"
         "[smaller_features]", 28, SILENT_WRONG),
    Case("score-larger-vocabulary", 2, "score on larger vocabularies: RuntimeError Expected i < index_size",
         f"{_R}/test_rel_vocabularies.py::test_score_refuses_another_datasets_window_naming_both_digests"
         "[larger_features]", 28, UNCLEAR),
    Case("score-model-vocabulary", 2, "a window built with the model's vocabularies must still score",
         f"{_R}/test_rel_vocabularies.py::test_a_window_built_with_the_models_vocabularies_scores", 28),
    Case("knowledge-vocabulary", 2, "knowledge generated with another window's vocabularies",
         f"{_R}/test_rel_vocabularies.py::test_knowledge_generation_refuses_another_vocabulary", 28, SILENT_WRONG),
    Case("init-from-vocabulary", 2, "continued pretraining from a champion of other vocabularies",
         f"{_R}/test_rel_vocabularies.py::test_continued_pretraining_refuses_another_vocabulary", 28, SILENT_WRONG),
    Case("gate-shared-store", 2, "the teacher gate scored dataset A's champion on dataset B's holdout",
         f"{_R}/test_rel_vocabularies.py::test_the_gate_refuses_a_champion_of_another_dataset_in_the_same_store",
         28, SILENT_WRONG),
    Case("unrecorded-vocabulary", 2, "a model saved before vocabulary digests was used unchecked",
         f"{_R}/test_rel_vocabularies.py::test_a_model_without_recorded_vocabularies_is_refused_unless_allowed",
         28, SILENT_WRONG),
    Case("student-gate-vocabulary", 2, "the student gate scored a champion student of other vocabularies on the "
         "run's holdout (students recorded none)",
         f"{_R}/test_rel_vocabularies.py::test_a_student_records_its_vocabularies_and_refuses_another_window",
         28, SILENT_WRONG),
    Case("unrecorded-student-vocabulary", 2, "a student saved before vocabulary digests was used unchecked",
         f"{_R}/test_rel_vocabularies.py::test_a_student_saved_without_vocabularies_is_refused_unless_allowed",
         28, SILENT_WRONG),
    Case("cluster-refresh-late-data", 3, "the recurring refresh pipeline (no state.json) read only its newest "
         "days: a changed earlier day went unnoticed",
         f"{_R}/test_rel_late_data.py::test_the_refresh_pipeline_refuses_or_backfills_days_changed_since_the_last_commit",
         28, SILENT_LOSS),
    Case("commit-records-days", 3, "nothing recorded which days a committed run read",
         f"{_R}/test_rel_late_data.py::test_the_commit_records_the_days_the_run_read", 28, SILENT_LOSS),
    Case("refresh-late-events", 3, "late events added to an earlier day: 'no new days', rc 0",
         f"{_R}/test_rel_late_data.py::test_late_or_corrected_days_are_reported_and_refused_by_default"
         "[late-events]", 28, SILENT_LOSS),
    Case("refresh-labels-flipped", 3, "a day rewritten with its labels flipped: 'no new days', rc 0",
         f"{_R}/test_rel_late_data.py::test_late_or_corrected_days_are_reported_and_refused_by_default"
         "[labels-flipped]", 28, SILENT_LOSS),
    Case("refresh-older-day", 3, "a day older than the first: 'no new days', rc 0",
         f"{_R}/test_rel_late_data.py::test_late_or_corrected_days_are_reported_and_refused_by_default"
         "[older-day]", 28, SILENT_LOSS),
    Case("refresh-backfill", 3, "no way to process late data",
         f"{_R}/test_rel_late_data.py::test_backfill_reruns_the_last_cycle_with_the_corrected_days_then_goes_quiet",
         28, SILENT_LOSS),
    Case("refresh-late-cli", 3, "late data refused without a clear one-line message and exit code",
         f"{_R}/test_rel_late_data.py::test_cli_refuses_late_data_in_one_line_with_exit_2", 28, UNCLEAR),
    Case("surface-slash", 4, "surface video/reels passed validate; the run died minutes later on MLflow's check",
         "tests/data/test_validate.py::test_a_surface_that_is_not_a_safe_name_is_refused_before_any_work"
         "[video/reels]", 28, UNCLEAR),
    Case("surface-dotdot", 4, "surface ../../x passed validate and became a path",
         "tests/data/test_validate.py::test_a_surface_that_is_not_a_safe_name_is_refused_before_any_work"
         "[../../x]", 28, UNCLEAR),
    Case("quarantine-fraction-nan", 5, "--max-quarantine-fraction=nan passed 43% quarantined rows, rc 0",
         "tests/test_cli.py::test_bad_option_values_are_usage_errors_naming_the_option[nan-fraction]",
         28, SILENT_WRONG),
    Case("quarantine-fraction-range", 5, "--max-quarantine-fraction 2 passed; -1 printed 'allowed -100%'",
         "tests/test_cli.py::test_bad_option_values_are_usage_errors_naming_the_option[fraction-above-1]",
         28, SILENT_WRONG),
    Case("training-diverges", 6, "dense_lr=1e9 logged loss nan and went on to an IndexError in metrics.py",
         f"{_R}/test_rel_training_numbers.py::test_a_diverging_run_stops_at_its_first_non_finite_loss_and_exports"
         "_nothing[native]", 28, UNCLEAR),
    Case("training-negative-steps", 6, "max_steps=-5 wrote an untrained model with rc 0",
         "tests/test_config.py::test_training_numbers_are_range_checked_before_any_work[negative-steps]",
         28, SILENT_WRONG),
    Case("training-zero-weights", 6, "task_weights=[0,0] trained on a zero loss with rc 0",
         "tests/test_config.py::test_training_numbers_are_range_checked_before_any_work[zero-task-weights]",
         28, SILENT_WRONG),
    Case("training-no-full-batch", 6, "a window without one full batch exported an untrained model",
         f"{_R}/test_rel_training_numbers.py::test_a_window_without_one_full_batch_is_refused_before_training",
         28, SILENT_WRONG),
    Case("validate-extra-columns", 7, "validate --out dropped occupation and price without a word",
         "tests/data/test_validate.py::test_extra_columns_are_carried_through_validate_out_and_reported",
         28, SILENT_LOSS),
    Case("config-exponent-float", 8, "--set optim.dense_lr=1e-4 refused: expected float, got '1e-4'",
         "tests/test_config.py::test_numbers_in_exponent_form_parse_as_floats_from_set_and_yaml", 28, UNCLEAR),
    Case("user-error-lines", 9, "a refused configuration printed a 15-58 line traceback",
         "tests/test_cli.py::test_a_user_error_is_one_or_two_lines_and_exit_2", 28, UNCLEAR),
)

# issue 42 (reliability round 4): each part registers its cases in its own module
from tests.reliability.cases_r4_cli import CASES as _R4_CLI  # noqa: E402
from tests.reliability.cases_r4_registry import CASES as _R4_REGISTRY  # noqa: E402

CASES = CASES + _R4_CLI + _R4_REGISTRY


def as_dicts() -> list[dict]:
    return [asdict(case) for case in CASES]
