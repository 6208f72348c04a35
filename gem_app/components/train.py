from typing import NamedTuple

from kfp.dsl import Metrics, Model, Output

from gem_app.components.base import component


@component
def train(tracking: str, features: str, features_digest: str, eval_features: str, eval_digest: str, out: str,
          preset: str, train_config: str, init_from: str, launcher: str, trainjob_namespace: str, code_version: str,
          teacher: Output[Model], metrics: Output[Metrics]
          ) -> NamedTuple("Trained", model_uri=str, model_version=str, result=dict):
    """Train (or continue from ``init_from``) the GEM teacher, in this task, under torchrun
    here, or as a Kubeflow Trainer TrainJob (``launcher``; in ``trainjob_namespace``, ""
    = this task's namespace); registers it in MLflow. Cache key: the features' and
    holdout's digests, the train config's digest, the starting weights, the code. Its gate
    is the next task (gate_teacher)."""
    import json
    import os
    from collections import namedtuple

    from gem_app.components.runtime import log_figures, run_context
    from gem_app.launch import NAMESPACE_ENV
    from gem_app.stages.train import train as run

    if trainjob_namespace:
        os.environ[NAMESPACE_ENV] = trainjob_namespace
    result = run(features, eval_features, out, preset, run_context(tracking), init_from=init_from, launcher=launcher)
    log_figures(metrics, result.metrics)
    with open(teacher.path, "w") as f:
        json.dump({"model_uri": result.model_uri, "run_id": result.run_id}, f)
    teacher.metadata.update({"model_uri": result.model_uri, "version": result.model_version,
                             "mlflow_run_id": result.run_id, "steps": result.steps,
                             "features_digest": features_digest})
    return namedtuple("Trained", ["model_uri", "model_version", "result"])(
        result.model_uri, result.model_version, result.as_dict())
