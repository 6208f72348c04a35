"""Issue 42 cases: a student's knowledge lineage, the registry's invariants, new fault points.
Registered into tests.reliability.cases.CASES (Case, kinds and _R there)."""

from __future__ import annotations

from tests.reliability.cases import _R, SILENT_LOSS, SILENT_WRONG, Case

_K = f"{_R}/test_rel_r4_registry_knowledge.py"
_G = f"{_R}/test_rel_r4_registry.py"

CASES: tuple = (
    # item 1: a student reads only its own teacher's knowledge (students/lineage.py)
    Case("student-records-knowledge", 1, "a student recorded nothing of the knowledge it learned from (teacher, "
         "vocabularies, content digest)", f"{_K}::test_a_student_records_the_knowledge_it_learned_from",
         42, SILENT_WRONG),
    Case("pyfunc-other-dataset-store", 1, "a student's pyfunc model given another dataset's Feast store: "
         "predictions, no error (the other teacher's embeddings read under the same ids)",
         f"{_K}::test_pyfunc_predict_refuses_another_datasets_feast_store_naming_both", 42, SILENT_WRONG),
    Case("pyfunc-other-teacher-store", 1, "a store of another teacher under the same version name was read; "
         "the same teacher's later days must still be",
         f"{_K}::test_pyfunc_predict_refuses_another_teachers_store_and_reads_its_own_teachers_later_days",
         42, SILENT_WRONG),
    Case("gate-other-knowledge", 1, "the students' gate scored a model on another teacher's knowledge (a "
         "champion of an earlier teacher on the run's store)",
         f"{_K}::test_the_gate_refuses_a_challenger_on_another_store_and_scores_the_champion_on_its_own",
         42, SILENT_WRONG),
    Case("serving-other-knowledge", 1, "the serving check let a student read another dataset's or teacher's store",
         f"{_K}::test_the_serving_check_refuses_another_store_and_a_student_reading_no_knowledge_is_not_checked",
         42, SILENT_WRONG),
    # item 3: the registry's rules after every commit, rerun and recovery (gem_app/promotion.py)
    Case("registry-champion-and-challenger", 3, "after a commit a student had both champion and challenger on v1",
         f"{_G}::test_a_promoted_version_is_never_left_the_challenger", 42, SILENT_WRONG),
    Case("registry-stale-challenger", 3, "a challenger older than the champion stayed, or a rerun moved it back",
         f"{_G}::test_a_challenger_is_newer_than_the_champion_after_every_commit_and_rerun", 42, SILENT_WRONG),
    Case("registry-recovery-tags", 3, "recovering a killed rerun's commit deleted the champion's recorded decision",
         f"{_G}::test_a_recovered_commit_leaves_the_champions_own_decision", 42, SILENT_LOSS),
    Case("registry-commit-check", 3, "nothing checked the registry's invariants at the end of a commit",
         f"{_G}::test_the_commit_checks_the_registrys_rules_and_undoes_a_commit_that_breaks_them", 42, SILENT_WRONG),
    Case("registry-invariants", 3, "no check named a broken registry rule (the bench had none)",
         f"{_G}::test_registry_problems_names_each_broken_rule", 42, SILENT_WRONG),
    Case("gate-champion-knowledge-gone", 1, "a champion whose teacher's knowledge no store holds was scored on "
         "another teacher's (now: not compared, the reason says why)",
         f"{_G}::test_a_champion_whose_knowledge_no_store_holds_is_not_compared_and_the_reason_says_so",
         42, SILENT_WRONG),
)
