from components.base import component


@component
def evaluate_and_gate(job: dict, challenger: dict) -> dict:
    """Evaluate challenger and champion on the same holdout; return the gate decision
    (with the challenger's distillation record, for the promotion step)."""
    from gem.promotion import GateConfig
    from gem.stages import RunContext
    from students.stages import gate_stage

    decision = gate_stage(job["surface"], challenger["version"], job["eval_features"], job["feast_repo"],
                          RunContext.loads(job["ctx"]), GateConfig(**job["gate"]), job["preset"])
    return {"decision": decision, "distilled": challenger}
