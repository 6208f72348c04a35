"""MLflow: the local default needs no server; an unreachable server fails fast and clearly."""

from __future__ import annotations

import socket
import time

import mlflow
import pytest

from gem import tracking


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket goes


def test_unreachable_server_is_a_clear_error_not_a_hang(tmp_path, monkeypatch):
    uri = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    start = time.perf_counter()
    with pytest.raises(tracking.TrackingUnavailable, match=f"{uri} unreachable after 3 attempts"):
        tracking.configure(tmp_path, retries=3, backoff_s=0.1, timeout_s=1.0)
    assert time.perf_counter() - start < 10


def test_local_default_is_sqlite_without_server(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking.configure(tmp_path, experiment="local")
    assert uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    with mlflow.start_run() as parent, tracking.stage_run("validate", tags={tracking.TAG_DATA_WINDOW: "d0..d1"}):
        mlflow.log_metric("rows", 10)
    runs = mlflow.search_runs(experiment_names=["local"], output_format="list")
    child = next(r for r in runs if r.info.run_id != parent.info.run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags[tracking.TAG_STAGE] == "validate" and child.data.metrics["rows"] == 10
    kind = mlflow.get_experiment_by_name("local").tags[tracking.EXPERIMENT_KIND_TAG]
    assert kind == "custom_model_development"  # the UI opens on the training runs, not GenAI pages
    mlflow.set_tracking_uri("")


def test_a_store_mlflow_was_pointed_at_does_not_pin_the_next_one(tmp_path, monkeypatch):
    """mlflow.set_tracking_uri copies its URI into MLFLOW_TRACKING_URI; that copy is not a
    user's server and must not redirect a later configure() to the first store used."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'other.db'}")
    mine = f"sqlite:///{(tmp_path / 'mine').resolve()}/mlflow.db"
    assert tracking.configure(tmp_path / "mine", experiment="x") == mine
    user = f"sqlite:///{tmp_path / 'user.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", user)  # a user's: honoured, on every later call too
    assert tracking.configure(tmp_path / "a", experiment="x") == user
    assert tracking.configure(tmp_path / "b", experiment="x") == user


def test_a_new_sqlite_store_starts_as_a_copy_of_the_migrated_template(tmp_path, monkeypatch):
    """configure() copies an empty, migrated store kept per MLflow version instead of running
    every migration in each new workspace (~2 s of a pipeline's first task); the copy is a
    working store at the head revision, and an existing store is never replaced."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("GEM_CACHE_DIR", str(tmp_path / "cache"))
    tracking.configure(tmp_path / "first", experiment="a")  # makes the template
    template = tmp_path / "cache" / f"mlflow-{mlflow.__version__}-empty.db"
    assert template.is_file()
    uri = f"sqlite:///{(tmp_path / 'second').resolve()}/mlflow.db"
    assert tracking.prepare_sqlite_store(uri)  # a copy of the template
    assert not tracking.prepare_sqlite_store(uri)  # the store exists: left alone
    assert tracking.configure(tmp_path / "second", experiment="b") == uri
    with mlflow.start_run():
        mlflow.log_metric("m", 1.0)
    assert [r.data.metrics["m"] for r in mlflow.search_runs(experiment_names=["b"], output_format="list")] == [1.0]
    mlflow.set_tracking_uri("")
