from gem_app.components.base import component


@component
def gate_teacher(tracking: str, trained: dict, eval_features: str, eval_digest: str, gate: dict,
                 code_version: str) -> dict:
    """The new teacher's gate decision (floors, then the champion on the same holdout),
    staged for the run's promote step; its gate run records it. The holdout predictions
    the training run kept are read instead of scoring the teacher again when they are of
    the same weights and the same holdout (digests). Cache key: the trained
    version, the holdout's digest, the gate settings, the code (a decision taken against
    a champion that has moved since is not applied by promote)."""
    from gem_app.components.runtime import run_context
    from gem_app.promotion import GateConfig
    from gem_app.stages.gate import gate_teacher as run

    return run(trained["model_version"], eval_features, run_context(tracking), GateConfig.from_dict(gate),
               kept=trained.get("eval_predictions", ""))
