"""What a person sees in the MLflow UI, read the way the UI reads it: ``mlflow server`` on
a store a pipeline wrote (one worker, no job runner: ~0.5 GB, up in seconds), and its
REST API (the pages' data: runs, their descriptions, params, metrics and inputs; model
versions; a logged model's MLmodel file)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(store: Path, log: Path, timeout: float = 120) -> Iterator[str]:
    """``mlflow server`` on the sqlite store; yields its base URL; stopped after."""
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                 f"sqlite:///{store}", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"mlflow server exited: {log.read_text()[-2000:]}"
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            assert time.monotonic() < deadline, f"mlflow server not up after {timeout} s: {log.read_text()[-2000:]}"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)


class Rest:
    def __init__(self, url: str):
        self.url = url

    def get(self, endpoint: str, **query) -> dict:
        with urllib.request.urlopen(f"{self.url}{endpoint}?{urllib.parse.urlencode(query)}", timeout=30) as r:
            return json.loads(r.read())

    def post(self, endpoint: str, body: dict) -> dict:
        request = urllib.request.Request(f"{self.url}{endpoint}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())

    def text(self, endpoint: str, **query) -> str:
        with urllib.request.urlopen(f"{self.url}{endpoint}?{urllib.parse.urlencode(query)}", timeout=30) as r:
            return r.read().decode()

    def runs(self, experiment: str) -> list[dict]:
        exp = self.get("/api/2.0/mlflow/experiments/get-by-name", experiment_name=experiment)["experiment"]
        return self.post("/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]],
                                                         "max_results": 1000})["runs"]

    def run(self, run_id: str) -> dict:
        return self.get("/api/2.0/mlflow/runs/get", run_id=run_id)["run"]

    def version(self, name: str, version: str) -> dict:
        return self.get("/api/2.0/mlflow/model-versions/get", name=name, version=version)["model_version"]

    def model(self, name: str) -> dict:
        return self.get("/api/2.0/mlflow/registered-models/get", name=name)["registered_model"]

    def mlmodel(self, model_id: str) -> str:
        """The logged model's MLmodel file, as the model page reads it."""
        return self.text(f"/ajax-api/2.0/mlflow/logged-models/{model_id}/artifacts/files",
                         artifact_file_path="MLmodel")


def tags(entity: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in entity.get("data", entity).get("tags", [])}


def params(run: dict) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}


def metrics(run: dict) -> dict[str, float]:
    return {m["key"]: m["value"] for m in run["data"].get("metrics", [])}
