from kfp.dsl import ClassificationMetrics, Output

from gem_app.components.base import component


@component
def gate(job: dict, challenger: dict, roc: Output[ClassificationMetrics]) -> dict:
    """Score the challenger, the no-teacher reference and the champion on the same
    holdout; return the staged gate decision (with the challenger's distillation
    record, for the promote step) and log the challenger's ROC curve on the surface's
    holdout (click task)."""
    from gem_app.components.runtime import run_context, share_cores
    from gem_app.promotion import GateConfig
    from gem_app.stages.gate import gate as run
    from gem_app.stages.gate import skipped_decision

    if challenger.get("skipped"):  # no student was trained: the plan's reason is the decision's
        return {"decision": skipped_decision(job["surface"], challenger["skipped"]), "distilled": challenger}
    share_cores()  # beside the loop's other surface (its distill or gate)
    result = run(job["surface"], challenger["version"], job["eval_features"], job["feast_repo"],
                 run_context(job["ctx"]), GateConfig.from_dict(job["gate"]), job["preset"],
                 teacher_gate=job.get("teacher_gate") or None)
    if result.roc["fpr"]:
        roc.log_roc_curve(result.roc["fpr"], result.roc["tpr"], result.roc["thresholds"])
    roc.metadata["surface"] = job["surface"]
    return {"decision": result.decision, "distilled": challenger}
