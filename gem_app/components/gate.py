from gem_app.components.base import component


@component
def gate(job: dict, challenger: dict) -> dict:
    """Score challenger and champion on the same holdout; return the gate decision
    (with the challenger's distillation record, for the promotion step)."""
    from gem_app.promotion import GateConfig
    from gem_app.stages.context import RunContext
    from gem_app.stages.gate import gate as run

    decision = run(job["surface"], challenger["version"], job["eval_features"], job["feast_repo"],
                   RunContext.loads(job["ctx"]), GateConfig(**job["gate"]), job["preset"])
    return {"decision": decision, "distilled": challenger}
