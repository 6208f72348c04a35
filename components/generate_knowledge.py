from typing import List

from components.base import component


@component
def generate_knowledge(ctx: str, teacher_uri: str, features: List[str], out_root: str, feast_repo: str) -> str:
    """Teacher predictions and embeddings for the downstream windows, written as Parquet
    and registered in the Feast repo; returns the teacher version they are tagged with."""
    from gem.stages import RunContext, knowledge_stage

    return knowledge_stage(teacher_uri, features, out_root, feast_repo, RunContext.loads(ctx))["teacher_version"]
