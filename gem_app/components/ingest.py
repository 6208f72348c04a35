from typing import NamedTuple

from kfp.dsl import Markdown, Output

from gem_app.components.base import component


@component
def ingest(ctx: str, data: str, sim_preset: str, workspace: str, student_days: int, holdout_days: int,
           teacher_days: int, report: Output[Markdown]
           ) -> NamedTuple("Ingested", clean=str, start=str, teacher_end=str, student_end=str, end=str,
                           teacher_features=str, student_features=str, holdout_features=str, surfaces=list):
    """Simulate a dataset when ``data`` is empty, validate it (bad rows quarantined),
    write the clean copy to the workspace and split the time windows."""
    from collections import namedtuple

    from gem_app.stages.context import RunContext
    from gem_app.stages.ingest import ingest as run

    result = run(data, workspace, sim_preset, RunContext.loads(ctx), student_days=student_days,
                 holdout_days=holdout_days, teacher_days=teacher_days)
    with open(report.path, "w") as f:
        f.write(f"# Data validation\n\n```\n{result.summary}\n```\n")
    w, feats = result.windows, result.features
    fields = ["clean", "start", "teacher_end", "student_end", "end", "teacher_features", "student_features",
              "holdout_features", "surfaces"]
    return namedtuple("Ingested", fields)(result.clean, w["start"], w["teacher_end"], w["student_end"], w["end"],
                                          feats["teacher"], feats["student"], feats["holdout"], result.surfaces)
