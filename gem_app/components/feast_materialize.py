from gem_app.components.base import component


@component
def feast_materialize(ctx: str, data: str, repo_dir: str, end: str) -> str:
    """Export the attribute and recent-behaviour sources, `feast apply`, and load the
    online store up to ``end``; returns the repo directory."""
    from gem_app.stages.context import RunContext
    from gem_app.stages.features import feast_materialize as run

    return run(data, repo_dir, end, RunContext.loads(ctx)).repo
