from typing import NamedTuple

from kfp.dsl import Metrics, Output

from components.base import component


@component
def pretrain_gem(ctx: str, features: str, eval_features: str, out: str, preset: str, init_from: str, launcher: str,
                 metrics: Output[Metrics]) -> NamedTuple("Pretrained", model_uri=str, model_version=str,
                                                                 result=dict):
    """Train (or continue from ``init_from``) the GEM teacher, in this task, under torchrun
    here, or as a Kubeflow Trainer TrainJob (``launcher``); registers it in MLflow."""
    from collections import namedtuple

    from gem.stages import RunContext, pretrain_stage

    result = pretrain_stage(features, eval_features, out, preset, RunContext.loads(ctx), init_from=init_from,
                            launcher=launcher)
    for key, value in result["metrics"].items():
        metrics.log_metric(key.replace("/", "."), value)
    return namedtuple("Pretrained", ["model_uri", "model_version", "result"])(
        result["model_uri"], result["model_version"], result)
