from kfp.dsl import Metrics, Model, Output

from gem_app.components.base import component


@component
def distill(job: dict, student: Output[Model], metrics: Output[Metrics]) -> dict:
    """One surface's student through the configured transfer methods (plus the
    no-teacher student for the lift); registered as a challenger version."""
    import json

    from gem import registry
    from gem_app.components.runtime import log_figures, run_context, share_cores
    from gem_app.stages.distill import distill as run
    from gem_app.stages.distill import skipped_result

    if job.get("skip"):  # the plan found too little evidence for any student here: nothing to train
        with open(student.path, "w") as f:
            json.dump({"skipped": job["skip"]}, f)
        return skipped_result(job).as_dict()
    share_cores()  # the loop trains its surfaces side by side
    result = run(job["surface"], job["train_features"], job["eval_features"], job["feast_repo"],
                 job["teacher_uri"], job["out"], run_context(job["ctx"]), preset=job["preset"],
                 teacher_version=job["teacher_version"], fresh_from=job.get("fresh_from", ""))
    for who, figures in result.metrics.items():
        log_figures(metrics, figures, prefix=f"{who}.")
    log_figures(metrics, result.lift, prefix="lift.")
    model_uri = registry.model_uri(result.model_name, result.version)
    with open(student.path, "w") as f:
        json.dump({"model_uri": model_uri}, f)
    student.metadata.update({"model_uri": model_uri, "version": result.version, "surface": result.surface,
                             "teacher_version": result.teacher_version, "methods": result.methods})
    return result.as_dict()
