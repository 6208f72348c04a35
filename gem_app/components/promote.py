from typing import List

from gem_app.components.base import component


@component
def promote(ctx: str, teacher_gate: dict, gated: List[dict], data: str, data_days: str) -> dict:
    """The run's commit: every gate decision of the run (the teacher's and each
    surface's) applied at once, after all of them succeeded, and ``data``'s days as the
    run read them (``data_days``: ingest's file of day digests) recorded for the next run's late-data check; returns
    the decisions as applied and the summary's rows."""
    from gem_app.stages.context import RunContext
    from gem_app.stages.gate import promote as run

    return run(teacher_gate, list(gated), RunContext.loads(ctx), data=data, data_days=data_days).as_dict()
