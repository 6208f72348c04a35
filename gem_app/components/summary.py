from typing import List

from kfp.dsl import Markdown, Output

from gem_app.components.base import component


@component
def summary(ctx: str, teacher: dict, surfaces: List[dict], workspace: str, report: Output[Markdown]) -> str:
    """The run's summary table (teacher and student AUC/NE per surface, transfer lift,
    what was promoted), written to the workspace and MLflow; closes the parent run."""
    from gem_app.stages.context import RunContext
    from gem_app.stages.summary import summary as run

    result = run(teacher, surfaces, workspace, RunContext.loads(ctx))
    with open(report.path, "w") as f:
        f.write(result.markdown)
    return result.markdown
