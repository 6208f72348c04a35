"""Defects 7b and 9: tracking URIs never show their credentials; an unreachable tracking
server fails fast (one bounded tenacity policy) with the redacted URI."""

from __future__ import annotations

import socket
import time

import pytest

from gem.tracking import RETRY, TrackingUnavailable, redact

SECRET_URIS = {
    "http://alice:s3cr3t@mlflow.example.com:5000": "http://***@mlflow.example.com:5000",
    "https://tok3n@host/path?token=s3cr3t&x=1": "https://***@host/path?token=***&x=***",
    "databricks://profile?access_token=s3cr3t": "databricks://profile?access_token=***",
    "postgresql://u:s3cr3t@db:5432/mlflow": "postgresql://***@db:5432/mlflow",
}


@pytest.mark.parametrize("uri, shown", SECRET_URIS.items())
def test_redact_hides_credentials_and_query_values(uri, shown):
    assert redact(uri) == shown
    text = redact(f"failed to reach {uri}: connection refused ('{uri}')")
    assert "s3cr3t" not in text and "tok3n" not in text and shown in text


def test_redact_keeps_plain_uris():
    for uri in ("sqlite:////tmp/x/mlflow.db", "http://127.0.0.1:5000", "runs:/abc/model", "no uri here"):
        assert redact(uri) == uri


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_train_on_an_unreachable_tracking_server_fails_fast_and_redacted(tmp_path):
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    uri = f"http://bob:s3cr3t@127.0.0.1:{_closed_port()}"
    cfg, model_cfg = load_train_config("tiny", ["system_metrics=false", "measure_peak=false", f"tracking_uri={uri}"])
    start = time.perf_counter()
    with pytest.raises(TrackingUnavailable) as err:
        train("synthetic://256", tmp_path / "run", cfg, model_cfg)
    elapsed = time.perf_counter() - start
    assert elapsed < RETRY.total_s + 15, elapsed
    assert "s3cr3t" not in str(err.value) and "127.0.0.1" in str(err.value) and "***@" in str(err.value)


def test_tracking_uri_params_are_logged_redacted(tmp_path):
    from mlflow import MlflowClient

    from gem.training.tracking import Tracker

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(True, store, "redact", system_metrics=False)
    tracker.log_params({"train.tracking_uri": "https://alice:s3cr3t@mlflow.example.com/?token=abc"})
    run_id = tracker.run_id
    tracker.end()
    params = MlflowClient(store).get_run(run_id).data.params
    assert params["train.tracking_uri"] == "https://***@mlflow.example.com/?token=***"


def test_bounded_http_retries_are_values_mlflow_can_read(monkeypatch):
    import dataclasses

    import mlflow.environment_variables as mlflow_env

    from gem.tracking import RETRY, bound_http_retries

    names = ("MAX_RETRIES", "BACKOFF_FACTOR", "BACKOFF_JITTER", "TIMEOUT")
    for name in names:
        monkeypatch.delenv(f"MLFLOW_HTTP_REQUEST_{name}", raising=False)
    bound_http_retries(dataclasses.replace(RETRY, backoff_s=0.1, timeout_s=2.5))  # fractions, as tests ask
    for name in names:
        var = getattr(mlflow_env, f"MLFLOW_HTTP_REQUEST_{name}")
        assert isinstance(var.get(), var.type), name  # parses, as MLflow will parse it
