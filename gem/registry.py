"""Names in the MLflow registry, in one place: the CLI, the pipeline, the benchmarks and
the docs all spell a model, an alias or the experiment through these.

- the teacher: ``gem_teacher``; each surface's student: ``student_<surface>``;
- ``champion``: the version serving (moved only by the gate); ``challenger``: the
  newest version that lost its gate.
"""

from __future__ import annotations

EXPERIMENT = "gem-pipeline"
TEACHER_MODEL = "gem_teacher"
CHAMPION = "champion"
CHALLENGER = "challenger"
FEATURES_DIR_TAG = "gem.features_dir"


def student_model(surface: str) -> str:
    return f"student_{surface}"


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
