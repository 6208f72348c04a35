from typing import List

from gem_app.components.base import component


@component
def knowledge(ctx: str, teacher_uri: str, features: List[str], out_root: str, feast_repo: str) -> str:
    """Teacher predictions and embeddings for the downstream windows, written as Parquet
    and registered in the Feast repo; returns the teacher version they are tagged with."""
    from gem_app.stages.context import RunContext
    from gem_app.stages.knowledge import knowledge as run

    return run(teacher_uri, features, out_root, feast_repo, RunContext.loads(ctx)).teacher_version
