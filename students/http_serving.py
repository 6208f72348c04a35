"""A registered student served over HTTP (`python -m gem serve`, gem_app/serve_cli.py):
the model of ``models:/student_<surface>@champion`` loaded with ``mlflow.pyfunc``, one
uvicorn server, two ways to ask it.

- ``POST /invocations``: MLflow's scoring protocol with the pyfunc's documented input,
  as ``mlflow models serve`` answers it (students/pyfunc.py): ``dataframe_split`` or
  ``dataframe_records`` rows of ``features`` (a features window folder) and
  ``feast_repo``, ``params`` ``{"max_examples": N}``; the answer is
  ``{"predictions": [{"example_id", "surface", "p_<task>"}, ...]}``, ``pyfunc.predict``'s
  table. Offline-style scoring: every request reads its window and the teacher's
  knowledge point-in-time (about 100 ms for 100 examples on 2 cores).
- ``POST /score``: one request of a user and N candidates, their features read from the
  Feast online store (students/serving.py's Scorer, with the item table preloaded at
  start-up): ``{"user_id": 17, "item_ids": [3, 9, ...], "now": "2026-01-05T00:00:00Z"}``
  (``now`` optional: the clock, or ``as_of``) -> ``{"predictions": [{"item_id",
  "p_<task>"}, ...]}`` in the candidates' order. Needs the Feast repo (online store
  materialized) and a features window of the student's vocabularies.
- ``GET /ping`` (and ``/health``): 200 once the model is loaded and the item table read.

Requests are scored one at a time per worker process, in the event loop: on a 2-core
machine threads inside one process serve fewer requests than one thread
(docs/transfer.md, *Serving*); ``workers`` adds processes, each loading the model.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from gem.errors import UserError

CONFIG_ENV = "GEM_SERVE_CONFIG"  # the settings, JSON, for uvicorn's worker processes


@dataclass
class ServeConfig:
    model_uri: str
    feast_repo: str = ""  # with ``features``: enables POST /score
    features: str = ""  # a features window of the student's vocabularies
    as_of: str = ""  # ISO time the item table is read at and /score defaults to (empty: the clock)
    tracking_uri: str = ""
    threads: int = 1  # torch threads per worker
    preload_items: bool = True  # read every item of the vocabularies at start-up


class RequestError(UserError, ValueError):
    """A request (HTTP 400) or a server setting that can't be served as asked."""


class ServedStudent:
    """The pyfunc model and, when the online store is given, its request-time Scorer."""

    def __init__(self, cfg: ServeConfig) -> None:
        import mlflow
        import torch

        torch.set_num_threads(max(1, cfg.threads))
        if cfg.tracking_uri:
            mlflow.set_tracking_uri(cfg.tracking_uri)
        self.cfg = cfg
        self.pyfunc = mlflow.pyfunc.load_model(cfg.model_uri)
        student = self.pyfunc.unwrap_python_model()
        if not hasattr(student, "model") or not hasattr(student, "config"):
            raise RequestError(f"{cfg.model_uri} is not a student (students/mlflow_student.py); it is "
                               f"{type(student).__name__}")
        self.model, self.config = student.model, dict(student.config)
        self.tasks = list(self.config.get("tasks") or [])
        self.scorer = None
        if bool(cfg.feast_repo) != bool(cfg.features):
            raise RequestError("give both the Feast repo and a features window (its vocabularies) to serve /score")
        if cfg.feast_repo:
            self.scorer = self._scorer(cfg)

    def _scorer(self, cfg: ServeConfig):
        from gem.features.loader import load_feature_spec
        from gem.features.vocab import Vocabularies, check_vocabularies
        from students.serving import Scorer

        if not (Path(cfg.features) / "manifest.json").is_file():
            raise FileNotFoundError(f"{cfg.features}: not a finished features window (no manifest.json)")
        check_vocabularies(self.model.vocab_digests, load_feature_spec(cfg.features).vocab_digests,
                           model=cfg.model_uri, window=cfg.features)
        scorer = Scorer(self.model, cfg.feast_repo, cfg.features, surface=self.config["surface"], cache_items=True)
        if cfg.preload_items:
            items = Vocabularies.read(Path(cfg.features)).values["item_id"].to_pylist()
            scorer.preload_items(items, self.now(None))
        return scorer

    def now(self, text) -> dt.datetime:
        from gem.data.contract import parse_utc

        text = text or self.cfg.as_of
        if not text:
            return dt.datetime.now(dt.timezone.utc)
        try:
            return parse_utc(str(text))
        except ValueError as exc:
            raise RequestError(f"now={text!r} is not an ISO-8601 time") from exc

    def invocations(self, body: dict) -> dict:
        """MLflow's protocol: the pyfunc's input as a data frame, its table back."""
        import pandas as pd

        if "dataframe_split" in body:
            split = body["dataframe_split"]
            if not isinstance(split, dict):
                raise RequestError("dataframe_split must be an object with columns and data")
            frame = pd.DataFrame(split.get("data") or [], columns=split.get("columns"))
        elif "dataframe_records" in body:
            frame = pd.DataFrame.from_records(body["dataframe_records"])
        else:
            raise RequestError("the input goes in 'dataframe_split' ({\"columns\": [\"features\", \"feast_repo\"], "
                               f"\"data\": [[...]]}}) or 'dataframe_records'; got keys {sorted(body)}")
        out = self.pyfunc.predict(frame, params=body.get("params") or None)
        return {"predictions": out.to_dict(orient="records")}

    def score(self, body: dict) -> dict:
        """One user and its candidates from the online store."""
        if self.scorer is None:
            raise RequestError("this server was started without the Feast repo and a features window: /score needs "
                               "them (python -m gem serve --feast-repo DIR --features DIR)")
        try:
            user = int(body["user_id"])
            items = [int(i) for i in body["item_ids"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestError('a /score request is {"user_id": int, "item_ids": [int, ...], "now": ISO time '
                               f'(optional)}}: {exc!r}') from exc
        if not items:
            return {"predictions": []}
        probs = self.scorer.score(user, items, self.now(body.get("now"))).double().tolist()
        columns = [f"p_{t}" for t in self.tasks] or [f"p_{j}" for j in range(len(probs[0]))]
        return {"predictions": [{"item_id": i, **dict(zip(columns, p))} for i, p in zip(items, probs)]}


class App:
    """The ASGI application: JSON in, JSON out, one request at a time per process."""

    def __init__(self, served: ServedStudent) -> None:
        self.served = served
        self.routes = {("POST", "/invocations"): served.invocations, ("POST", "/score"): served.score}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        status, payload = self.handle(scope["method"], scope["path"], body)
        data = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        if method == "GET" and path in ("/ping", "/health"):
            return 200, {"status": "ok"}
        if method == "GET" and path == "/version":
            import mlflow

            return 200, {"model_uri": self.served.cfg.model_uri, "mlflow": mlflow.__version__,
                         "score": self.served.scorer is not None}
        route = self.routes.get((method, path))
        if route is None:
            return 404, {"error_code": "ENDPOINT_NOT_FOUND", "message": f"{method} {path}: POST /invocations, "
                         "POST /score, GET /ping"}
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise RequestError("the request body must be a JSON object")
            return 200, route(request)
        except (RequestError, ValueError, KeyError, TypeError, FileNotFoundError) as exc:
            return 400, {"error_code": "BAD_REQUEST", "message": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:  # noqa: BLE001 - answered, not crashed on; the server log has the traceback
            import logging

            logging.getLogger(__name__).exception("%s %s failed", method, path)
            return 500, {"error_code": "INTERNAL_ERROR", "message": f"{type(exc).__name__}: {exc}"}


def app_from_env() -> App:
    """uvicorn's factory (one call per worker process): the settings from ``CONFIG_ENV``."""
    return build_app(ServeConfig(**json.loads(os.environ[CONFIG_ENV])))


def build_app(cfg: ServeConfig) -> App:
    import gc

    app = App(ServedStudent(cfg))
    gc.collect()
    gc.freeze()  # the model and the item table: never scanned again by a request's collections
    return app


def serve(cfg: ServeConfig, *, host: str = "127.0.0.1", port: int = 5000, workers: int = 1,
          log_level: str = "warning", banner: str = "") -> None:
    """Load the model and serve until stopped (SIGINT / SIGTERM). One worker loads it here
    (a refused model or input is raised before the port opens, ``banner`` printed after
    it loaded); more workers each load it in their own process."""
    import uvicorn

    options = dict(host=host, port=port, lifespan="off", access_log=False, log_level=log_level)
    if workers == 1:
        app = build_app(cfg)
        if banner:
            print(banner, flush=True)
        uvicorn.run(app, **options)
        return
    if banner:
        print(f"{banner}, {workers} workers loading", flush=True)
    os.environ[CONFIG_ENV] = json.dumps(asdict(cfg))
    uvicorn.run("students.http_serving:app_from_env", factory=True, workers=workers, **options)
