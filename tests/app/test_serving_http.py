"""Issue 41 item 5: a registered student served over HTTP as a user would, on a loopback
port, by the real server processes:

- ``mlflow models serve -m models:/student_feed@champion --env-manager local`` answers
  the pyfunc's documented input (a features window and the Feast repo, max_examples)
  with ``pyfunc.predict``'s predictions, also to 4 clients at once, and leaves the
  store's artifacts as they were;
- ``python -m gem serve`` (students/http_serving.py) answers the same input the same
  way on ``/invocations``, and one user with 100 candidates on ``/score`` as the
  in-process Scorer (students/serving.py) scores them from the Feast online store.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import mlflow
import numpy as np
import pandas as pd
import pytest

from tests.app import serving_support as serving
from tests.app.serving_support import CANDIDATES, documented_input, request, running


@pytest.fixture(autouse=True)
def _model_copies_in_tmp(tmp_path, monkeypatch):
    serving.copies_under(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return serving.registered_student(tmp_path_factory.mktemp("serving"))


def in_process(store) -> pd.DataFrame:
    mlflow.set_tracking_uri(store.tracking_uri)
    model = mlflow.pyfunc.load_model(store.uri())
    return model.predict(pd.DataFrame({"features": [str(store.features)], "feast_repo": [str(store.feast_repo)]}),
                         params={"max_examples": CANDIDATES})


def same_predictions(served: dict, expected: pd.DataFrame) -> None:
    got = pd.DataFrame(served["predictions"])
    assert len(got) == len(expected) == CANDIDATES
    assert got["example_id"].tolist() == expected["example_id"].tolist()
    assert (got["surface"] == expected["surface"]).all()
    for column in [c for c in expected.columns if c.startswith("p_")]:
        np.testing.assert_allclose(got[column].to_numpy(), expected[column].to_numpy(), rtol=1e-6, atol=1e-9)


@pytest.mark.slow(minutes=1)
def test_mlflow_models_serve_answers_the_documented_input(store, tmp_path):
    expected = in_process(store)
    before = serving.artifact_tree(store.artifacts)
    port = serving.free_port()
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", store.uri(), "--env-manager", "local",
           "-h", "127.0.0.1", "-p", str(port)]
    with running(cmd, port, tmp_path / "mlflow-serve.log", env={"MLFLOW_TRACKING_URI": store.tracking_uri}):
        status, served = request(port, "POST", "/invocations", documented_input(store))
        assert status == 200, served
        same_predictions(served, expected)
        # 4 clients at once: MLflow scores them in threads of one process (the Feast offline
        # reads behind the window input share one DuckDB connection: they take turns)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: request(port, "POST", "/invocations", documented_input(store)), range(4)))
        for status, served in answers:
            assert status == 200, served
            same_predictions(served, expected)
    assert serving.artifact_tree(store.artifacts) == before  # serving downloads from the store, never into it


@pytest.mark.slow(minutes=1)
def test_gem_serve_answers_the_documented_input_and_candidates_as_in_process(store, tmp_path):
    from students.serving import Scorer

    expected = in_process(store)
    student = mlflow.pyfunc.load_model(store.uri()).unwrap_python_model()
    scorer = Scorer(student.model, store.feast_repo, store.vocab, surface=store.surface, cache_items=True)
    scorer.preload_items(store.items, store.now)
    now = store.now.isoformat()
    rng = np.random.default_rng(0)
    port = serving.free_port()
    cmd = [sys.executable, "-m", "gem", "serve", "-m", store.uri(), "--tracking-uri", store.tracking_uri,
           "--feast-repo", str(store.feast_repo), "--features", str(store.vocab), "--as-of", now,
           "--port", str(port)]
    with running(cmd, port, tmp_path / "gem-serve.log"):
        status, served = request(port, "POST", "/invocations", documented_input(store))
        assert status == 200, served
        same_predictions(served, expected)

        for user in rng.choice(store.users, 5, replace=False).tolist() + [10**9]:  # the last one is unknown
            items = rng.choice(store.items, CANDIDATES, replace=False).tolist()
            for body in ({"user_id": user, "item_ids": items, "now": now}, {"user_id": user, "item_ids": items}):
                status, served = request(port, "POST", "/score", body)  # without "now": --as-of
                assert status == 200, served
                got = served["predictions"]
                assert [p["item_id"] for p in got] == items
                want = scorer.score(user, items, store.now).double().numpy()
                np.testing.assert_allclose([[p["p_click"], p["p_conversion"]] for p in got], want, rtol=1e-6)

        status, refused = request(port, "POST", "/score", {"user": 1})
        assert status == 400 and "user_id" in refused["message"]
        status, refused = request(port, "POST", "/invocations", {"features": "x"})
        assert status == 400 and "dataframe_split" in refused["message"]
        assert request(port, "GET", "/nowhere")[0] == 404


def test_gem_serve_refuses_a_half_configured_score_route(tmp_path):
    import subprocess

    result = subprocess.run([sys.executable, "-m", "gem", "serve", "-m", "models:/student_feed@champion",
                             "--feast-repo", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--feast-repo and --features go together" in result.stderr, result.stderr
