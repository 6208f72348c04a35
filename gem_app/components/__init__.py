"""Kubeflow Pipelines v2 lightweight components: one file per pipeline step, named as the
stage function it wraps (gem_app/stages) and its CLI verb.

Components run in the project image (Dockerfile) with ``install_kfp_package=False``:
kfp and the project come from the image, and locally from the project's own
environment (kfp.local SubprocessRunner, use_venv=False). Imports sit inside the
function bodies because kfp ships each body to its task on its own; what the bodies
share is ``runtime.py``. The components load on first access (``from gem_app.components
import train``): at run time kfp's executor has a reduced ``kfp.dsl`` without the
decorators, and a body importing ``gem_app.components.runtime`` must not define them.
"""

import importlib

__all__ = ["distill", "distill_plan", "feast_materialize", "features_finalize", "features_plan", "features_shard",
           "gate", "gate_teacher", "ingest", "knowledge", "promote", "resolve_champion", "start_run", "summary",
           "train"]


def __getattr__(name: str):
    if name in __all__:
        fn = getattr(importlib.import_module(f"gem_app.components.{name}"), name)
        globals()[name] = fn  # importing the submodule set the module under the same name
        return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
