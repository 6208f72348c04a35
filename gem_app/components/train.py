from typing import NamedTuple

from kfp.dsl import Metrics, Output

from gem_app.components.base import component


@component
def train(ctx: str, features: str, eval_features: str, out: str, preset: str, init_from: str, launcher: str,
          metrics: Output[Metrics]) -> NamedTuple("Trained", model_uri=str, model_version=str, result=dict):
    """Train (or continue from ``init_from``) the GEM teacher, in this task, under torchrun
    here, or as a Kubeflow Trainer TrainJob (``launcher``); registers it in MLflow."""
    from collections import namedtuple

    from gem_app.stages.context import RunContext
    from gem_app.stages.train import train as run

    result = run(features, eval_features, out, preset, RunContext.loads(ctx), init_from=init_from, launcher=launcher)
    for key, value in result.metrics.items():
        metrics.log_metric(key, value)
    return namedtuple("Trained", ["model_uri", "model_version", "result"])(
        result.model_uri, result.model_version, result.as_dict())
