from gem_app.components.base import component


@component
def promote(job: dict, gated: dict) -> dict:
    """Apply the gate decision (the champion alias moves only on a win) and return the
    surface's row for the summary."""
    from gem_app.components.runtime import run_context
    from gem_app.stages.gate import promote as run

    outcome = run(gated["decision"], run_context(job["ctx"]))
    return {**gated["distilled"], "promoted": outcome.promoted, "champion_before": outcome.champion_before or "",
            "gate": gated["decision"]}
