from kfp.dsl import ClassificationMetrics, Output

from gem_app.components.base import component


@component
def gate(job: dict, challenger: dict, roc: Output[ClassificationMetrics]) -> dict:
    """Score challenger and champion on the same holdout; return the gate decision
    (with the challenger's distillation record, for the promotion step) and log the
    challenger's ROC curve on the surface's holdout (click task)."""
    from gem import registry
    from gem_app.components.runtime import run_context
    from gem_app.promotion import GateConfig
    from gem_app.stages.gate import gate as run
    from gem_app.stages.gate import student_roc

    ctx = run_context(job["ctx"])
    decision = run(job["surface"], challenger["version"], job["eval_features"], job["feast_repo"], ctx,
                   GateConfig(**job["gate"]), job["preset"])
    curve = student_roc(registry.model_uri(challenger["model_name"], challenger["version"]), job["surface"],
                        job["eval_features"], job["feast_repo"], job["preset"])
    if curve["fpr"]:
        roc.log_roc_curve(curve["fpr"], curve["tpr"], curve["thresholds"])
    roc.metadata["surface"] = job["surface"]
    return {"decision": decision, "distilled": challenger}
