from kfp.dsl import Metrics, Output

from components.base import component


@component
def distill_student(job: dict, metrics: Output[Metrics]) -> dict:
    """One surface's student through the configured transfer methods (plus the
    no-teacher student for the lift); registered as a challenger version."""
    from gem.stages import RunContext
    from students.stages import distill_stage

    result = distill_stage(job["surface"], job["train_features"], job["eval_features"], job["feast_repo"],
                           job["teacher_uri"], job["out"], RunContext.loads(job["ctx"]), preset=job["preset"])
    for who, figures in result["metrics"].items():
        for key, value in figures.items():
            metrics.log_metric(f"{who}.{key}", value)
    return result
