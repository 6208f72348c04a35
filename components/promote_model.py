from components.base import component


@component
def promote_model(job: dict, gated: dict) -> dict:
    """Apply the gate decision (the champion alias moves only on a win) and return the
    surface's row for the summary."""
    from gem.stages import RunContext
    from students.stages import promote_stage

    outcome = promote_stage(gated["decision"], RunContext.loads(job["ctx"]))
    return {**gated["distilled"], "promoted": outcome["promoted"], "champion_before": outcome["champion_before"],
            "gate": gated["decision"]}
