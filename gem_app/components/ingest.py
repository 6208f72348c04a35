from typing import NamedTuple

from kfp.dsl import Dataset, Markdown, Output

from gem_app.components.base import component


@component
def ingest(tracking: str, data: str, data_digest: str, sim_preset: str, sim_config: str, code_version: str,
           workspace: str, student_days: int, holdout_days: int, teacher_days: int, surfaces: list,
           window_evidence: dict, late_data: str, clean_data: Output[Dataset], report: Output[Markdown],
           student_overlap_days: int = -1
           ) -> NamedTuple("Ingested", clean=str, clean_digest=str, start=str, teacher_end=str, student_start=str,
                           student_end=str, end=str, teacher_features=str, student_features=str,
                           holdout_features=str, surfaces=list, days=str):
    """Simulate a dataset when ``data`` is empty, validate it (bad rows quarantined),
    write the clean copy to the workspace and split the time windows (a window of 0 days:
    chosen by ``window_evidence``, gem.protocol.Evidence fields); ``surfaces``
    (asked for; empty: the data's) are checked here, before any other work, and the
    ``surfaces`` output lists those the student and holdout windows can train and rank.
    ``late_data`` (refuse | backfill; empty: not checked): the days since the last
    committed run that changed or are new (gem_app.stages.late_data); ``days``: the file
    of each day's content digest, for the commit. ``student_overlap_days``: the students'
    window (``student_start``) begins that many days before the teacher's end (-1: at the
    teacher's start; 0: at its end). Cache key:
    the dataset's digest (or the simulator config's), the protocol and the code version."""
    from collections import namedtuple

    from gem_app.components.runtime import run_context
    from gem_app.stages.ingest import ingest as run

    result = run(data, workspace, sim_preset, run_context(tracking), student_days=student_days,
                 holdout_days=holdout_days, teacher_days=teacher_days, surfaces=list(surfaces) or None,
                 evidence=dict(window_evidence), late_data=late_data, student_overlap_days=student_overlap_days)
    with open(report.path, "w") as f:
        f.write(f"# Data validation\n\n```\n{result.summary}\n```\n")
    with open(clean_data.path, "w") as f:
        f.write(f"{result.clean}\n")
    clean_data.metadata.update({"path": result.clean, "digest": result.data_digest, "events": result.events,
                                "quarantined_fraction": result.quarantined_fraction, "surfaces": result.surfaces,
                                **({"late_data": result.late_data} if result.late_data else {}),
                                **{f"evidence.{k}": v for k, v in result.evidence.items()},
                                **{f"window.{k}": v for k, v in result.windows.items()}})
    w, feats = result.windows, result.features
    fields = ["clean", "clean_digest", "start", "teacher_end", "student_start", "student_end", "end",
              "teacher_features", "student_features", "holdout_features", "surfaces", "days"]
    return namedtuple("Ingested", fields)(result.clean, result.data_digest, w["start"], w["teacher_end"],
                                          w.get("student_start") or w["teacher_end"], w["student_end"], w["end"],
                                          feats["teacher"], feats["student"],
                                          feats["holdout"], result.surfaces, result.days)
