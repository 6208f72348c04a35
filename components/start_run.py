from components.base import component


@component
def start_run(pipeline_run_id: str, tracking_root: str, params: dict) -> str:
    """Open the pipeline's parent MLflow run; returns the run context (JSON) every
    later stage nests under."""
    from gem.stages import RunContext, start_pipeline

    ctx = start_pipeline(RunContext(pipeline_run_id=pipeline_run_id, tracking_root=tracking_root), params=params)
    return ctx.dumps()
