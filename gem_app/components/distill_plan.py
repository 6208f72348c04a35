from typing import List

from gem_app.components.base import component


@component
def distill_plan(tracking: str, surfaces: list, available: list, train_features: str, train_digest: str,
                 eval_features: str, eval_digest: str, feast_repo: str, teacher_uri: str, teacher_version: str,
                 out: str, preset: str, students_config: str, code_version: str, gate: dict,
                 teacher_gate: dict, fresh_from: str = "") -> List[dict]:
    """One job per surface for the students' ParallelFor (every surface of the data when
    ``surfaces`` is empty); each job carries everything its iteration needs, content
    digests included (they are the distill task's cache key), the gate settings and the
    run's teacher decision (a student is promoted only from a champion teacher) and
    ``fresh_from``, where the students' rows after the teacher's window begin."""
    from gem_app.stages.distill import distill_plan as run

    return run(tracking, list(surfaces) or list(available), list(available), train_features=train_features,
               eval_features=eval_features, feast_repo=feast_repo, teacher_uri=teacher_uri,
               teacher_version=teacher_version, out=out, preset=preset,
               gate=dict(gate), teacher_gate=dict(teacher_gate), fresh_from=fresh_from,
               digests={"train": train_digest, "eval": eval_digest, "config": students_config,
                        "code": code_version})
