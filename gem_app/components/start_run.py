from gem_app.components.base import component


@component
def start_run(pipeline_run_id: str, tracking_root: str, workspace: str, params: dict) -> str:
    """Open the pipeline's parent MLflow run (local store: ``tracking_root``, by default the
    workspace); returns the run context (JSON) every later stage nests under."""
    from gem_app.stages.context import RunContext, start_pipeline

    ctx = RunContext(pipeline_run_id=pipeline_run_id, tracking_root=tracking_root or workspace)
    return start_pipeline(ctx, params=params).dumps()
