"""What serving a registered student needs in tests and in benchmarks/serving_http_bench.py:
a store holding one, a server process on a loopback port, and requests to it.

``registered_student(root)``: a registered student in a store laid out as a pipeline
run lays it out (sqlite ``<root>/mlflow.db``, artifacts under ``<root>/mlartifacts``),
built cheaply: the tiny
world of tests/students (simulator data, a briefly trained teacher, its knowledge in a
private Feast repo), then the pipeline's own distill stage for the feed surface (about
25 s on 2 cores). ``student_feed`` has version 1 ``@champion`` and version 2 (the same
logged model registered again) ``@challenger``; the Feast online store is materialized
to the end of the evaluation window, so the student can also be served from it.

    store = registered_student(tmp_path_factory.mktemp("serving"))   # built once per process
    with running(cmd, port, log):        # the server process, ready (GET /ping), always stopped after
        status, answer = request(port, "POST", "/invocations", documented_input(store))
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tests.students.fixtures import tiny_world

_CACHE: dict[str, "RegisteredStudent"] = {}
CANDIDATES = 100
SURFACE = "feed"
MODEL = f"student_{SURFACE}"
OVERRIDES = ["transfer.kd.weight=0.5", "transfer.representation.enabled=true", "optim.epochs=1",
             "optim.batch_size=64", "student.history_len=4"]


@dataclass
class RegisteredStudent:
    tracking_root: Path  # the pipeline's layout: mlflow.db and mlartifacts/
    tracking_uri: str
    model: str  # the registered model's name
    surface: str
    features: Path  # a features window to score (the evaluation window)
    vocab: Path  # a window of the student's vocabularies (the teacher's)
    feast_repo: Path  # knowledge and serving sources; online store materialized at ``now``
    now: dt.datetime  # the end of the evaluation window
    users: list[int]  # raw ids in the vocabularies
    items: list[int]

    def uri(self, alias: str = "champion") -> str:
        return f"models:/{self.model}@{alias}"

    @property
    def artifacts(self) -> Path:
        return self.tracking_root / "mlartifacts"


def registered_student(root: Path) -> RegisteredStudent:
    if "store" in _CACHE:
        return _CACHE["store"]
    import mlflow
    from mlflow import MlflowClient

    from gem import tracking
    from gem.data.contract import parse_utc
    from gem.features.feast_repo import materialize
    from gem.features.vocab import Vocabularies
    from gem_app.stages.context import RunContext
    from gem_app.stages.distill import distill

    root = Path(root)
    world = tiny_world(root / "world")
    store = root / "store"
    ctx = RunContext(pipeline_run_id="serving-test", tracking_root=str(store))
    result = distill(SURFACE, str(world.features["student"]), str(world.features["eval"]), str(world.repo),
                     world.teacher_uri, str(root / "students"), ctx, preset="default", overrides=OVERRIDES)
    uri = tracking.default_tracking_uri(store)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    client.set_registered_model_alias(MODEL, "champion", result.version)
    source = client.get_model_version(MODEL, result.version).source
    again = mlflow.register_model(source, MODEL).version  # a second version of the same logged model
    client.set_registered_model_alias(MODEL, "challenger", again)
    now = parse_utc("2026-01-05")  # the end of the evaluation window (tests/students materialize the same)
    materialize(world.repo, now)
    vocab = Vocabularies.read(world.features["teacher"]).values
    built = RegisteredStudent(
        tracking_root=store, tracking_uri=uri, model=MODEL, surface=SURFACE, features=world.features["eval"],
        vocab=world.features["teacher"], feast_repo=world.repo, now=now,
        users=[int(u) for u in vocab["user_id"].to_pylist()], items=[int(i) for i in vocab["item_id"].to_pylist()])
    mlflow.set_tracking_uri("")
    _CACHE["store"] = built
    return built


def artifact_tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root``: (size, mtime in ns)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def copies_under(folder: Path, monkeypatch) -> None:
    """Loading ``models:/`` from the local store copies the model into a new temporary
    folder (gem/mlflow_plugin.py), left to the caller as a remote store's download is:
    put this test's copies, and its server processes', under ``folder``."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))


def documented_input(store: RegisteredStudent, examples: int = CANDIDATES) -> dict:
    """students/pyfunc.py's input in MLflow's JSON protocol: one window, ``examples`` rows."""
    return {"dataframe_split": {"columns": ["features", "feast_repo"],
                                "data": [[str(store.features), str(store.feast_repo)]]},
            "params": {"max_examples": examples}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(cmd: list[str], port: int, log: Path, env: dict | None = None, timeout: float = 240) -> Iterator[float]:
    """The server ``cmd`` in its own process group, until ``GET /ping`` answers 200 on
    ``port`` (yields the seconds that took); always stopped after (SIGTERM to the group,
    SIGKILL if it is still there 30 s later)."""
    t0 = time.monotonic()
    # the venv's scripts first, as in an activated venv: `mlflow models serve` execs
    # `uvicorn` by name (`make test` runs .venv/bin/python without activating the venv)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PATH": path, **(env or {})}, start_new_session=True)
    try:
        while True:
            assert proc.poll() is None, f"{cmd[:5]} exited ({proc.returncode}): {log.read_text()[-3000:]}"
            with contextlib.suppress(OSError, http.client.HTTPException):
                if request(port, "GET", "/ping", timeout=2)[0] == 200:
                    break
            assert time.monotonic() - t0 < timeout, f"{cmd[:5]} not up after {timeout} s: {log.read_text()[-3000:]}"
            time.sleep(0.25)
        yield time.monotonic() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    """One request on its own connection: (status, the JSON answer, {} when empty)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, json.dumps(body).encode() if body is not None else None,
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data.strip() else {}  # mlflow's /ping answers "\n"
    finally:
        conn.close()
