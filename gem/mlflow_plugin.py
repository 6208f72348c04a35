"""MLflow's ``models:/`` artifact repository with one change: a registered model in a
local artifact store is copied out before MLflow writes into it. Registered for the
``models`` scheme through the ``mlflow.artifact_repository`` entry point
(pyproject.toml), so it applies to every MLflow call in an environment where this
project is installed: ``mlflow.pyfunc.load_model``, ``mlflow.artifacts.download_artifacts``,
``mlflow models serve``.

Why: MLflow 3.17 resolves ``models:/<name>@<alias>`` (or ``/<version>``, or a logged
model's ``models:/<id>``) to the model's artifact folder and, when the caller gives no
destination, "downloads" it; the local artifact repository (the pipeline's
``<workspace>/mlartifacts``) hands back the stored folder itself, and
``ModelsArtifactRepository.download_artifacts`` then writes ``registered_model_meta``
(the name and version it resolved) into it. Every load rewrote the store, and two
versions of one logged model overwrote each other's record. Here that folder is first
copied into a new temporary directory, as every remote store (S3, an MLflow server's
proxied artifacts) downloads it; MLflow writes its record in the copy. As with a remote
store, the copy belongs to the caller and is not deleted.

Imports stay minimal: MLflow loads this module while its artifact-repository registry
is being imported.
"""

from __future__ import annotations

import os
import tempfile

from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

MLMODEL = "MLmodel"  # mlflow.models.model.MLMODEL_FILE_NAME (not imported: see above)


class LocalCopyModelsArtifactRepository(ModelsArtifactRepository):
    def download_artifacts(self, artifact_path, dst_path=None, lineage_header_info=None):
        if dst_path is None and isinstance(self.repo, LocalArtifactRepository) and _is_model_folder(
                self.repo, artifact_path):
            dst_path = tempfile.mkdtemp(prefix="mlflow-model-")
        return super().download_artifacts(artifact_path, dst_path, lineage_header_info=lineage_header_info)


def _is_model_folder(repo: LocalArtifactRepository, artifact_path: str) -> bool:
    """Whether MLflow would write ``registered_model_meta`` into this stored folder."""
    try:
        path = repo.get_local_path(artifact_path or "")
    except Exception:  # noqa: BLE001 - not there: let MLflow raise its own error
        return False
    return os.path.isdir(path) and MLMODEL in os.listdir(path)
