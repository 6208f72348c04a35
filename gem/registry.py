"""Names in the MLflow registry, in one place: the CLI, the pipeline, the benchmarks and
the docs all spell a model, an alias or the experiment through these.

- the teacher: ``gem_teacher``; each surface's student: ``student_<surface>``;
- ``champion``: the version serving (moved only by the gate); ``challenger``: the
  newest version that lost its gate while better than a constant base rate (NE below
  the gate's ``max_ne``); ``stale``: the frozen teacher of a transfer experiment;
- a benchmark's models carry its dataset (and the student's method) in the name:
  ``gem_teacher_<dataset>``, ``student_<dataset>_<method>_<surface>``.
"""

from __future__ import annotations

EXPERIMENT = "gem-pipeline"
TEACHER_MODEL = "gem_teacher"
CHAMPION = "champion"
CHALLENGER = "challenger"
STALE = "stale"
FEATURES_DIR_TAG = "gem.features_dir"


def teacher_model(dataset: str | None = None) -> str:
    return f"{TEACHER_MODEL}_{dataset}" if dataset else TEACHER_MODEL


def student_model(surface: str, *, dataset: str | None = None, method: str | None = None) -> str:
    return "_".join(["student", *(p for p in (dataset, method) if p), surface])


def model_uri(name: str, version: str | int | None = None, *, alias: str | None = None) -> str:
    """``models:/<name>/<version>`` or ``models:/<name>@<alias>``."""
    if (version is None) == (alias is None):
        raise ValueError(f"model_uri({name!r}): give exactly one of version ({version!r}) and alias ({alias!r})")
    return f"models:/{name}@{alias}" if alias else f"models:/{name}/{version}"


def champion_version(name: str) -> str | None:
    """The version holding the champion alias, or None when there is none yet."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return str(MlflowClient().get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException:
        return None
