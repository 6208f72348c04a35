"""Kubeflow Pipelines v2 lightweight components: one file per stage, each a thin typed
wrapper over one package function (gem.stages / students.stages).

Components run in the project image (Dockerfile) with ``install_kfp_package=False``:
kfp and the project come from the image, and locally from the project's own
environment (kfp.local SubprocessRunner, use_venv=False). Imports sit inside the
function bodies because kfp ships each body to its task on its own.

Large data lives in the pipeline's workspace (a shared volume on a cluster, a folder
locally); artifacts carry reports and metrics for the UI.
"""

from components.build_feature_shard import build_feature_shard
from components.distill_student import distill_student
from components.evaluate_and_gate import evaluate_and_gate
from components.feast_materialize import feast_materialize
from components.finalize_features import finalize_features
from components.generate_knowledge import generate_knowledge
from components.ingest_data import ingest_data
from components.plan_features import plan_features
from components.plan_students import plan_students
from components.pretrain_gem import pretrain_gem
from components.promote_model import promote_model
from components.resolve_champion import resolve_champion
from components.start_run import start_run
from components.summarize import summarize

__all__ = [
    "build_feature_shard", "distill_student", "evaluate_and_gate", "feast_materialize", "finalize_features",
    "generate_knowledge", "ingest_data", "plan_features", "plan_students", "pretrain_gem", "promote_model", "resolve_champion", "start_run",
    "summarize",
]
