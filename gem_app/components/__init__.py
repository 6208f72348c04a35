"""Kubeflow Pipelines v2 lightweight components: one file per pipeline step, named as the
stage function it wraps (gem_app/stages) and its CLI verb.

Components run in the project image (Dockerfile) with ``install_kfp_package=False``:
kfp and the project come from the image, and locally from the project's own
environment (kfp.local SubprocessRunner, use_venv=False). Imports sit inside the
function bodies because kfp ships each body to its task on its own.
"""

from gem_app.components.distill import distill
from gem_app.components.distill_plan import distill_plan
from gem_app.components.feast_materialize import feast_materialize
from gem_app.components.features_finalize import features_finalize
from gem_app.components.features_plan import features_plan
from gem_app.components.features_shard import features_shard
from gem_app.components.gate import gate
from gem_app.components.ingest import ingest
from gem_app.components.knowledge import knowledge
from gem_app.components.promote import promote
from gem_app.components.resolve_champion import resolve_champion
from gem_app.components.start_run import start_run
from gem_app.components.summary import summary
from gem_app.components.train import train

__all__ = ["distill", "distill_plan", "feast_materialize", "features_finalize", "features_plan", "features_shard",
           "gate", "ingest", "knowledge", "promote", "resolve_champion", "start_run", "summary", "train"]
