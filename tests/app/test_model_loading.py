"""Issue 41 item 6: loading a registered model from the pipeline's local store
(``mlflow.pyfunc.load_model("models:/student_feed@champion")``, by alias, by version or
by logged-model id) leaves the store's artifacts as they were. MLflow 3.17 wrote a
``registered_model_meta`` file into the stored model folder on every such load (the
local artifact repository hands back the stored folder itself as the "download");
gem/mlflow_plugin.py copies it out first."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
import yaml
from mlflow import MlflowClient

from tests.app import serving_support
from tests.app.serving_support import artifact_tree, registered_student


@pytest.fixture(autouse=True)
def _model_copies_in_tmp(tmp_path, monkeypatch):
    serving_support.copies_under(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return registered_student(tmp_path_factory.mktemp("loading"))


def registered_uris(client: MlflowClient) -> list[tuple[str, str, str]]:
    """(URI, registered name, version) of every alias and every version in the registry,
    and the logged model behind each version (models:/<model id>, no registered name)."""
    uris = []
    for model in client.search_registered_models():
        for alias, version in sorted(model.aliases.items()):
            uris.append((f"models:/{model.name}@{alias}", model.name, str(version)))
        for mv in client.search_model_versions(f"name = '{model.name}'"):
            uris.append((f"models:/{model.name}/{mv.version}", model.name, str(mv.version)))
            if mv.model_id:
                uris.append((f"models:/{mv.model_id}", "", ""))
    return uris


@pytest.mark.slow(minutes=1)  # the store: the tiny world and the distill stage
def test_loading_every_registered_alias_leaves_the_store_unchanged(store):
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    from gem.mlflow_plugin import LocalCopyModelsArtifactRepository

    mlflow.set_tracking_uri(store.tracking_uri)
    uris = registered_uris(MlflowClient())
    assert {u for u, _, _ in uris} >= {store.uri("champion"), store.uri("challenger"), f"models:/{store.model}/1",
                                       f"models:/{store.model}/2"}
    before = artifact_tree(store.artifacts)
    assert before and not any(Path(p).name == "registered_model_meta" for p in before)

    for uri, _, _ in uris:
        model = mlflow.pyfunc.load_model(uri)
        assert model.metadata.get_model_info().flavors["python_function"], uri
    after = artifact_tree(store.artifacts)
    hint = ("" if isinstance(get_artifact_repository(store.uri()), LocalCopyModelsArtifactRepository) else
            " (MLflow does not resolve models:/ through gem.mlflow_plugin: its entry point in pyproject.toml is not "
            "installed; make install)")
    assert after == before, (f"loading changed the store{hint}: "
                             + str({p: (before.get(p), after.get(p)) for p in sorted(set(before) | set(after))
                                    if before.get(p) != after.get(p)}))

    # MLflow still records what it resolved, in the caller's copy
    for uri, name, version in uris:
        folder = Path(mlflow.artifacts.download_artifacts(uri))
        assert store.artifacts.resolve() not in folder.resolve().parents, (uri, folder)
        meta = yaml.safe_load((folder / "registered_model_meta").read_text())
        assert (meta["model_name"] or "", str(meta["model_version"] or "")) == (name, version), uri
    assert artifact_tree(store.artifacts) == before
