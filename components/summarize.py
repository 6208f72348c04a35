from typing import List

from kfp.dsl import Markdown, Output

from components.base import component


@component
def summarize(ctx: str, teacher: dict, surfaces: List[dict], workspace: str, report: Output[Markdown]) -> str:
    """The run's summary table (teacher and student AUC/NE per surface, transfer lift,
    what was promoted), written to the workspace and MLflow; closes the parent run."""
    from gem.stages import RunContext, summary_stage

    result = summary_stage(teacher, surfaces, workspace, RunContext.loads(ctx))
    with open(report.path, "w") as f:
        f.write(result["markdown"])
    return result["markdown"]
