"""Registry of the reliability cases of issue 16 ("Nothing silently wrong") that the
library fixes, one per (case, defect, test), for benchmarks to turn into
benchmarks/results/reliability.json (run each node id with pytest; passed = fixed).

    from tests.reliability.cases import CASES
    for case in CASES: print(case.id, case.defect, case.node)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Case:
    id: str  # stable name of the case
    defect: int  # the defect's number in issue 16
    summary: str  # what goes wrong without the fix
    node: str  # pytest node id, relative to the repository root


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
)


def as_dicts() -> list[dict]:
    return [asdict(case) for case in CASES]
