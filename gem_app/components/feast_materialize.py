from gem_app.components.base import component


@component
def feast_materialize(tracking: str, data: str, data_digest: str, repo_dir: str, end: str, code_version: str) -> str:
    """Export the attribute and recent-behaviour sources, `feast apply`, and load the
    online store up to ``end``; returns the repo directory (reused when the data digest,
    ``end``, the store configuration and the code are unchanged)."""
    from gem_app.components.runtime import run_context
    from gem_app.stages.features import feast_materialize as run

    return run(data, repo_dir, end, run_context(tracking), data_digest=data_digest).repo
