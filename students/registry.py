"""Students in the MLflow model registry, linked to the teacher they learned from, both
ways.

Each registered version is an MLflow pyfunc model (students/pyfunc.py: signature, input
example, weights loaded weights-only after a digest check, nothing pickled) and
carries ``teacher_version`` (the teacher's models:/ or runs:/ version, as tagged on its
knowledge), the transfer methods and the surface, on the model version and on the run
that logged it; its description says what it is, where it comes from and how to load
it; the knowledge it learned from is tagged ``knowledge.*`` (``knowledge_tags``) and
recorded with its weights (students/lineage.py). The teacher's version (when this
registry holds it) lists its students: a tag
``gem.students.<student model>`` with their versions, and links in its description.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from students.distill import StudentResult

STUDENTS_TAG = "gem.students."  # + student model name, on the teacher's version: its versions
STUDENTS_HEADING = "Students:"


def version_link(name: str, version: str | int) -> str:
    """A link the MLflow UI follows from a description (Markdown)."""
    return f"[{name} v{version}](#/models/{name}/versions/{version})"


def _teacher_parts(teacher_version: str) -> tuple[str, str] | None:
    rest = teacher_version[len("models:/"):] if teacher_version.startswith("models:/") else ""
    name, _, version = rest.partition("/")
    return (name, version) if name and version.isdigit() else None


def log_student(result: "StudentResult", registered_name: str, teacher_version: str,
                extra_tags: dict[str, str] | None = None, *, tasks: list[str] | None = None,
                input_example=None, refresh_every: str = "1d", params: dict | None = None,
                metrics: dict[str, float] | None = None, about: str = "") -> str:
    """Log the student as a pyfunc model in the active run (named after its registered
    model) and register it; returns its version. ``input_example``: see
    students.pyfunc.input_example; ``metrics``/``params`` also go on the logged model;
    ``about``: a line for the version's description (e.g. its data window)."""
    import tempfile
    from pathlib import Path

    import mlflow
    from mlflow import MlflowClient

    from gem.data.contract import TASKS
    from gem.model.store import log_pyfunc_model
    from students import pyfunc
    from students.store import STUDENT_FILES, save_student

    tags = {"teacher_version": teacher_version, "surface": result.surface,
            "methods": ",".join(result.methods), **knowledge_tags(result.model), **(extra_tags or {})}
    mlflow.set_tags(tags)
    if tasks is None:
        width = result.eval_probs.shape[1] if result.eval_probs is not None else len(TASKS)
        tasks = list(TASKS[:width])
    config = {"surface": result.surface, "tasks": list(tasks), "refresh_every": refresh_every}
    with tempfile.TemporaryDirectory(prefix="gem-student-") as tmp:
        uri = log_pyfunc_model(save_student(result.model, Path(tmp) / "model"), name=registered_name,
                               code=pyfunc.CODE, signature=pyfunc.signature(list(tasks)),
                               input_example=input_example, pip_requirements=pyfunc.PIP_REQUIREMENTS,
                               model_config=config, params=params, files=STUDENT_FILES,
                               tags={"surface": result.surface})
    model_id = uri[len("models:/"):]
    if metrics:
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, model_id=model_id)
    mv = mlflow.register_model(uri, registered_name, tags=tags)
    client = MlflowClient()
    client.set_registered_model_tag(registered_name, "teacher_version", teacher_version)
    embeddings = bool(result.model.teacher_emb_dim)
    teacher = _teacher_parts(teacher_version)
    learned = version_link(*teacher) if teacher else f"`{teacher_version}`"
    client.update_model_version(registered_name, mv.version, description=(
        f"Student for surface `{result.surface}` (methods: {', '.join(result.methods) or 'none'}), distilled from "
        f"{learned}. {about}\n\n" + pyfunc.load_instructions(f"models:/{registered_name}/{mv.version}",
                                                            embeddings=embeddings)))
    client.update_registered_model(registered_name, description=(
        f"Vertical student models for surface `{result.surface}`, each distilled from a GEM teacher version "
        "(tag `teacher_version`). `@champion` serves; `@challenger` is the newest version the gate did not promote "
        "(its `gate.decision` and `gate.reason` tags say why).\n\n"
        + pyfunc.load_instructions(f"models:/{registered_name}@champion", embeddings=embeddings)))
    link_to_teacher(teacher_version, registered_name, str(mv.version))
    return str(mv.version)


def knowledge_tags(model) -> dict[str, str]:
    """The knowledge a student learned from (students/lineage.py), as tags: ``knowledge.
    teacher_digest`` (its teacher's weights), ``knowledge.vocab_digest`` and ``knowledge.
    digest`` (the knowledge tables' content); none for a student trained without knowledge."""
    recorded = getattr(model, "knowledge", None) or {}
    if not recorded:
        return {}
    return {"knowledge.teacher_digest": ",".join(recorded.get("teacher_digests", []))[:500],
            "knowledge.vocab_digest": ",".join(recorded.get("vocab_digests", []))[:500],
            "knowledge.digest": str(recorded.get("digest", ""))}


def link_to_teacher(teacher_version: str, student_name: str, student_version: str) -> bool:
    """List the student on its teacher's version (tag and description); False when this
    registry does not hold the teacher."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    teacher = _teacher_parts(teacher_version)
    if teacher is None:
        return False
    client = MlflowClient()
    try:
        mv = client.get_model_version(*teacher)
    except MlflowException:
        return False
    key = STUDENTS_TAG + student_name
    versions = [v for v in mv.tags.get(key, "").split(",") if v]
    if student_version not in versions:
        versions.append(student_version)
        client.set_model_version_tag(teacher[0], teacher[1], key, ",".join(versions))
    students = {**{k[len(STUDENTS_TAG):]: v for k, v in mv.tags.items() if k.startswith(STUDENTS_TAG)},
                student_name: ",".join(versions)}
    links = ", ".join(version_link(name, v) for name in sorted(students) for v in students[name].split(",") if v)
    head = (mv.description or "").split(f"\n\n{STUDENTS_HEADING}", 1)[0]
    client.update_model_version(teacher[0], teacher[1], description=f"{head}\n\n{STUDENTS_HEADING} {links}")
    return True


def teacher_of(registered_name: str, version: str, tracking_uri: str | None = None) -> str:
    """The teacher version a registered student learned from."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri).get_model_version(registered_name, version).tags["teacher_version"]
