"""`python -m gem serve`: a registered student over HTTP (students/http_serving.py).

    python -m gem serve -m models:/student_feed@champion --tracking-uri sqlite:///runs/main/mlflow.db \\
        --feast-repo runs/main/feast --features runs/main/features/holdout --port 5000

``POST /invocations`` answers MLflow's protocol with the pyfunc's documented input (as
``mlflow models serve -m ... --env-manager local`` does); ``POST /score`` one user and N
candidates from the Feast online store (``--feast-repo`` with its online store
materialized, ``--features`` a window of the student's vocabularies):

    curl -s localhost:5000/score -H 'Content-Type: application/json' \\
        -d '{"user_id": 17, "item_ids": [3, 9, 12], "now": "2026-01-05T00:00:00Z"}'

Ready when ``GET /ping`` answers 200; stopped by SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse

from gem.config import iso_time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a registered student over HTTP",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True, help="models:/student_<surface>@champion (or /VERSION)")
    p.add_argument("--tracking-uri", default="", help="the store holding the model (default: MLFLOW_TRACKING_URI)")
    p.add_argument("--feast-repo", default="", help="Feast repo with the online store materialized (for /score)")
    p.add_argument("--features", default="", help="a features window of the student's vocabularies (for /score)")
    p.add_argument("--as-of", default=None, type=iso_time,
                   help="read the item table at this time and score /score requests without 'now' at it "
                        "(replaying a past window; default: the clock)")
    p.add_argument("--no-preload", action="store_true", help="read items on first use, not all at start-up")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--workers", type=int, default=1, help="processes, each with its own copy of the model")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from gem.errors import UsageError
    from students.http_serving import ServeConfig, serve

    for name in ("port", "workers", "threads"):
        value = getattr(args, name)
        if value < (0 if name == "port" else 1) or (name == "port" and value > 65535):
            raise UsageError(f"--{name} {value}: must be {'a port (0-65535)' if name == 'port' else '>= 1'}")
    if bool(args.feast_repo) != bool(args.features):
        raise UsageError("--feast-repo and --features go together (both enable POST /score)")
    cfg = ServeConfig(model_uri=args.model, feast_repo=args.feast_repo, features=args.features, as_of=args.as_of or "",
                      tracking_uri=args.tracking_uri, threads=args.threads, preload_items=not args.no_preload)
    routes = f"POST /invocations{', POST /score' if args.feast_repo else ''}; GET /ping"
    serve(cfg, host=args.host, port=args.port, workers=args.workers, log_level="info" if args.verbose else "warning",
          banner=f"serving {args.model} on http://{args.host}:{args.port} ({routes})")
    return 0
