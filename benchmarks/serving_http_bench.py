"""A registered student served over HTTP on a loopback port, beside the same scoring in
process: latency (p50 / p99) and requests/s with 1 and 4 concurrent clients, 100
candidates a request.

`python -m benchmarks.serving_http_bench` writes benchmarks/results/serving_http.json
(about 2 minutes on 2 cores). The student: ``student_feed@champion`` of the tests' tiny
world, distilled and registered by the pipeline's distill stage into a store laid out
as a pipeline run's (tests/app/serving_support.py), the Feast online store materialized.
Paths, each with 1 client and 4 concurrent clients (threads of this process, each with
its own keep-alive connection, taking requests from one list; a request's latency runs
from sending it to its answer parsed):

- ``*_window_*``: the pyfunc's documented input (a features window and the Feast repo,
  ``max_examples`` 100): ``mlflow models serve -m models:/student_feed@champion
  --env-manager local``, ``python -m gem serve``'s ``/invocations``, and
  ``pyfunc.predict`` in process;
- ``*_score_*``: one user and 100 candidates read from the online store
  (students/serving.py, item table preloaded): ``python -m gem serve``'s ``/score``
  with 1 worker (and ``--workers`` more), and the Scorer in process (4 threads: each
  with its own scorer, students/latency.py);
- ``http_mlflow_serve_echo_*``: ``mlflow models serve`` of a pyfunc that returns its
  input, 100 rows (user_id, item_id) a request: the scoring server's own cost.

Servers and the in-process paths run one torch thread (per worker; ``mlflow models serve``
through ``OMP_NUM_THREADS=1``: with torch's default of one per core, ``pyfunc.predict`` on
the window took 194 ms against 88 ms p50 in process on a busy 2-core machine). The same seeded
(user, candidates) draws serve every ``score`` path.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.results import print_table, write_result

CANDIDATES = 100
GOAL_P99_MS = 10.0
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # mlflow models serve: one torch thread, as gem serve --threads 1


def summary(latencies_s: list[float], wall_s: float, clients: int) -> dict:
    ms = np.asarray(latencies_s) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()),
            "requests_per_s": len(ms) / wall_s, "requests": len(ms), "clients": clients}


def http_load(port: int, path: str, bodies: list[bytes], clients: int, warmup: int) -> dict:
    """``bodies`` posted by ``clients`` threads at once (after ``warmup`` each)."""
    queue = list(reversed(bodies))
    lock, start = threading.Lock(), threading.Barrier(clients + 1)
    samples: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            for body in bodies[:warmup]:
                post(conn, path, body)
            start.wait()
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                t0 = time.perf_counter()
                post(conn, path, body)
                samples[k].append(time.perf_counter() - t0)
        except BaseException as exc:  # noqa: BLE001 - raised below, once every client stopped
            errors.append(exc)
            start.abort()
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    try:
        start.wait()
    except threading.BrokenBarrierError:
        pass
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return summary([x for part in samples for x in part], wall, clients)


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> dict:
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    if response.status != 200:
        raise RuntimeError(f"POST {path}: {response.status} {answer}")
    return answer


def in_process_load(fn, requests: list, clients: int, warmup: int) -> dict:
    """``fn(request)`` one at a time (1 client) in this process."""
    for req in requests[:warmup]:
        fn(req)
    samples = []
    t0 = time.perf_counter()
    for req in requests:
        s = time.perf_counter()
        fn(req)
        samples.append(time.perf_counter() - s)
    return summary(samples, time.perf_counter() - t0, clients)


ECHO = """import mlflow
from mlflow.pyfunc import PythonModel


class Echo(PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


mlflow.models.set_model(Echo())
"""


def echo_model(tmp: Path) -> Path:
    """A pyfunc model (from code) that returns its input: what serving costs without scoring."""
    import mlflow

    code = tmp / "echo_model.py"
    code.write_text(ECHO)
    mlflow.pyfunc.save_model(tmp / "echo", python_model=str(code), pip_requirements=["mlflow==3.17.2"])
    return tmp / "echo"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="score requests per path and client count")
    parser.add_argument("--window-requests", type=int, default=50, help="documented-input requests per path")
    parser.add_argument("--echo-requests", type=int, default=500, help="requests to the echo model per client count")
    parser.add_argument("--workers", default="1,2", help="gem serve worker counts for /score")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()

    import gc

    import mlflow
    import pandas as pd
    import torch

    from students.latency import measure_concurrent, requests_for
    from students.serving import Scorer
    from tests.app.serving_support import documented_input, free_port, registered_student, running

    torch.set_num_threads(1)
    many = args.clients
    figures: dict = {}
    before = (tempfile.tempdir, os.environ.get("TMPDIR"))
    with tempfile.TemporaryDirectory(prefix="gem-serving-bench-") as tmp:
        # loading models:/ from the local store leaves a copy of the model in a new temporary
        # folder (gem/mlflow_plugin.py): here and in the servers, under this run's folder
        tempfile.tempdir = os.environ["TMPDIR"] = tmp
        t0 = time.perf_counter()
        store = registered_student(Path(tmp) / "store")
        setup_s = time.perf_counter() - t0
        now = store.now.isoformat()
        draws = requests_for(store.users, store.items, args.requests, CANDIDATES, seed=0)
        score_bodies = [json.dumps({"user_id": u, "item_ids": c, "now": now}).encode() for u, c in draws]
        window = json.dumps(documented_input(store, CANDIDATES)).encode()
        window_bodies = [window] * args.window_requests
        load_before = os.getloadavg()

        # in process: pyfunc.predict on the documented input; the Scorer on (user, candidates)
        mlflow.set_tracking_uri(store.tracking_uri)
        model = mlflow.pyfunc.load_model(store.uri())
        frame = pd.DataFrame({"features": [str(store.features)], "feast_repo": [str(store.feast_repo)]})
        figures["inprocess_pyfunc_window_1client"] = in_process_load(
            lambda _: model.predict(frame, params={"max_examples": CANDIDATES}), window_bodies, 1, warmup=2)
        student = model.unwrap_python_model().model

        def scorer() -> Scorer:
            s = Scorer(student, store.feast_repo, store.vocab, surface=store.surface, cache_items=True)
            s.preload_items(store.items, store.now)
            return s

        warm = scorer()
        gc.collect()
        gc.freeze()
        figures["inprocess_scorer_score_1client"] = in_process_load(
            lambda r: warm.score(r[0], r[1], store.now), draws, 1, warmup=10)
        gc.unfreeze()
        threads = measure_concurrent(scorer, store.users, store.items, threads=many, requests=args.requests,
                                     candidates=CANDIDATES, now=store.now, seed=0)
        figures[f"inprocess_scorer_score_{many}threads"] = {
            "p50_ms": threads["p50_ms"], "p99_ms": threads["p99_ms"], "mean_ms": threads["mean_ms"],
            "requests_per_s": threads["throughput_rps"], "requests": threads["requests"], "clients": many}

        # mlflow models serve: the documented input
        startup: dict[str, float] = {}
        port = free_port()
        cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", store.uri(), "--env-manager", "local",
               "-h", "127.0.0.1", "-p", str(port)]
        with running(cmd, port, Path(tmp) / "mlflow-serve.log", env={"MLFLOW_TRACKING_URI": store.tracking_uri,
                                                                     **ONE_THREAD}) as up:
            startup["mlflow_serve"] = up
            for clients in (1, many):
                figures[f"http_mlflow_serve_window_{clients}client{'s' if clients > 1 else ''}"] = http_load(
                    port, "/invocations", window_bodies, clients, warmup=2)

        # mlflow models serve's own cost: a pyfunc returning its 100 input rows (user_id, item_id)
        echo = echo_model(Path(tmp))
        echo_bodies = [json.dumps({"dataframe_split": {"columns": ["user_id", "item_id"],
                                                       "data": [[u, i] for i in c]}}).encode() for u, c in draws]
        port = free_port()
        cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", str(echo), "--env-manager", "local",
               "-h", "127.0.0.1", "-p", str(port)]
        with running(cmd, port, Path(tmp) / "mlflow-serve-echo.log", env=ONE_THREAD) as up:
            startup["mlflow_serve_echo"] = up
            for clients in (1, many):
                figures[f"http_mlflow_serve_echo_{clients}client{'s' if clients > 1 else ''}"] = http_load(
                    port, "/invocations", echo_bodies[:args.echo_requests], clients, warmup=10)

        # python -m gem serve: the documented input, and (user, candidates) from the online store
        for workers in [int(w) for w in args.workers.split(",")]:
            port = free_port()
            cmd = [sys.executable, "-m", "gem", "serve", "-m", store.uri(), "--tracking-uri", store.tracking_uri,
                   "--feast-repo", str(store.feast_repo), "--features", str(store.vocab), "--as-of", now,
                   "--port", str(port), "--workers", str(workers)]
            tag = "gem_serve" if workers == 1 else f"gem_serve_{workers}workers"
            with running(cmd, port, Path(tmp) / f"{tag}.log") as up:
                startup[tag] = up
                for clients in (1, many):
                    suffix = f"{clients}client{'s' if clients > 1 else ''}"
                    if workers == 1:
                        figures[f"http_{tag}_window_{suffix}"] = http_load(port, "/invocations", window_bodies,
                                                                           clients, warmup=2)
                    figures[f"http_{tag}_score_{suffix}"] = http_load(port, "/score", score_bodies, clients,
                                                                      warmup=10)
        load_after = os.getloadavg()
    tempfile.tempdir = before[0]
    if before[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[1]

    one, four = figures["http_gem_serve_score_1client"], figures[f"http_gem_serve_score_{many}clients"]
    mlflow_one = figures["http_mlflow_serve_window_1client"]
    inproc_window = figures["inprocess_pyfunc_window_1client"]
    figures["goal"] = {
        "score_p99_ms_1client": one["p99_ms"], "score_p99_under_10ms_1client": one["p99_ms"] < GOAL_P99_MS,
        f"score_{many}clients_rps_at_least_1client": four["requests_per_s"] >= one["requests_per_s"],
        "mlflow_serve_window_p99_ms_1client": mlflow_one["p99_ms"],
        "mlflow_serve_window_p99_under_10ms_1client": mlflow_one["p99_ms"] < GOAL_P99_MS,
        "mlflow_serve_overhead_p50_ms": mlflow_one["p50_ms"] - inproc_window["p50_ms"],
        "mlflow_serve_echo_p99_ms_1client": figures["http_mlflow_serve_echo_1client"]["p99_ms"],
        "gem_serve_window_overhead_p50_ms": figures["http_gem_serve_window_1client"]["p50_ms"]
        - inproc_window["p50_ms"],
        "gem_serve_score_overhead_p50_ms": one["p50_ms"] - figures["inprocess_scorer_score_1client"]["p50_ms"]}
    figures["run"] = {"setup_s": setup_s, **{f"startup_s_{k}": v for k, v in startup.items()},
                      "load_average_before": [round(x, 2) for x in load_before],
                      "load_average_after": [round(x, 2) for x in load_after]}
    path = write_result("serving_http", figures, sizes={
        "candidates": CANDIDATES, "score_requests": args.requests, "window_requests": args.window_requests,
        "echo_requests": args.echo_requests,
        "clients": [1, many], "gem_serve_workers": args.workers, "torch_threads": 1, "items": len(store.items),
        "users": len(store.users)})
    rows = [(f"{name}: p50 / p99 ms, req/s",
             f"{f['p50_ms']:.2f} / {f['p99_ms']:.2f}, {f['requests_per_s']:.0f}")
            for name, f in figures.items() if isinstance(f, dict) and "p50_ms" in f]
    rows += [(k, v) for k, v in figures["goal"].items()]
    print_table(f"a student over HTTP, {CANDIDATES} candidates ({path})", rows)


if __name__ == "__main__":
    main()
