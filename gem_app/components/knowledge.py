from typing import List

from kfp.dsl import Dataset, Output

from gem_app.components.base import component


@component
def knowledge(tracking: str, teacher_uri: str, features: List[str], features_digests: List[str], out_root: str,
              feast_repo: str, code_version: str, knowledge_data: Output[Dataset], lead_from: str = "",
              lead_digest: str = "") -> str:
    """Teacher predictions and embeddings for the downstream windows, written as Parquet
    and registered in the Feast repo (with the knowledge lead: the last days of
    ``lead_from``); returns the teacher version they are tagged with."""
    from gem_app.components.runtime import run_context
    from gem_app.stages.knowledge import knowledge as run

    result = run(teacher_uri, features, out_root, feast_repo, run_context(tracking), lead_from=lead_from)
    with open(knowledge_data.path, "w") as f:
        f.write("\n".join(result.knowledge) + "\n")
    knowledge_data.metadata.update({"paths": result.knowledge, "teacher_uri": teacher_uri,
                                    "teacher_version": result.teacher_version, "examples": result.examples})
    return result.teacher_version
