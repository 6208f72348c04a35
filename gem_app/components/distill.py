from kfp.dsl import Metrics, Output

from gem_app.components.base import component


@component
def distill(job: dict, metrics: Output[Metrics]) -> dict:
    """One surface's student through the configured transfer methods (plus the
    no-teacher student for the lift); registered as a challenger version."""
    from gem_app.stages.context import RunContext
    from gem_app.stages.distill import distill as run

    result = run(job["surface"], job["train_features"], job["eval_features"], job["feast_repo"],
                 job["teacher_uri"], job["out"], RunContext.loads(job["ctx"]), preset=job["preset"],
                 teacher_version=job["teacher_version"])
    for who, figures in result.metrics.items():
        for key, value in figures.items():
            metrics.log_metric(f"{who}/{key}", value)
    return result.as_dict()
