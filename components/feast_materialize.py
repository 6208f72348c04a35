from components.base import component


@component
def feast_materialize(ctx: str, data: str, repo_dir: str, end: str) -> str:
    """Export the attribute and recent-behaviour sources, `feast apply`, and load the
    online store up to ``end``; returns the repo directory."""
    from gem.stages import RunContext, feast_stage

    return feast_stage(data, repo_dir, end, RunContext.loads(ctx))["repo"]
