"""Students in the MLflow model registry, linked to the teacher they learned from.

Each registered version carries ``teacher_version`` (the teacher's models:/ or runs:/
version, as tagged on its knowledge), the transfer methods and the surface, both on the
model version and on the run that logged it. The model is logged as files
(students.store: weights, config, digests), never pickled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from students.distill import StudentResult

def log_student(result: "StudentResult", registered_name: str, teacher_version: str,
                extra_tags: dict[str, str] | None = None) -> str:
    """Log the student's model in the active run and register it; returns its version."""
    import tempfile
    from pathlib import Path

    import mlflow
    from mlflow import MlflowClient

    from gem.model.store import log_model
    from students.store import STUDENT_FILES, save_student

    tags = {"teacher_version": teacher_version, "surface": result.surface,
            "methods": ",".join(result.methods), **(extra_tags or {})}
    mlflow.set_tags(tags)
    with tempfile.TemporaryDirectory(prefix="gem-student-") as tmp:
        uri = log_model(save_student(result.model, Path(tmp) / "student"), name="student", files=STUDENT_FILES)
    mv = mlflow.register_model(uri, registered_name, tags=tags)
    client = MlflowClient()
    client.set_registered_model_tag(registered_name, "teacher_version", teacher_version)
    return str(mv.version)


def teacher_of(registered_name: str, version: str, tracking_uri: str | None = None) -> str:
    """The teacher version a registered student learned from."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri).get_model_version(registered_name, version).tags["teacher_version"]
