from typing import List

from gem_app.components.base import component


@component
def promote(ctx: str, teacher_gate: dict, gated: List[dict]) -> dict:
    """The run's commit: every gate decision of the run (the teacher's and each
    surface's) applied at once, after all of them succeeded; returns the decisions as
    applied and the summary's rows."""
    from gem_app.stages.context import RunContext
    from gem_app.stages.gate import promote as run

    return run(teacher_gate, list(gated), RunContext.loads(ctx)).as_dict()
