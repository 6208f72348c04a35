"""Compile gem_pipeline and refresh_pipeline to IR YAML with cluster settings, and
create the refresh pipeline's recurring run on a KFP cluster."""

from __future__ import annotations

import os
from pathlib import Path

GEM_YAML = "gem_pipeline.yaml"
REFRESH_YAML = "refresh_pipeline.yaml"


def compile_all(out: str | Path, *, image: str | None = None, mlflow_uri: str | None = None) -> list[Path]:
    if image:
        os.environ["GEM_IMAGE"] = image  # read when the components module is first imported
    from kfp import compiler

    from gem_app.components.base import BASE_IMAGE
    from gem_app.pipelines.gem_pipeline import make_gem_pipeline
    from gem_app.pipelines.settings import ClusterSettings

    cluster = ClusterSettings(image=BASE_IMAGE, **({"mlflow_uri": mlflow_uri} if mlflow_uri else {}))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for refresh, name in ((False, GEM_YAML), (True, REFRESH_YAML)):
        path = out / name
        compiler.Compiler().compile(make_gem_pipeline(cluster, refresh=refresh), str(path))
        written.append(path)
    return written


def create_recurring_refresh(host: str, package: str | Path, *, cron: str = "0 0 3 * * *",
                             experiment: str = "gem-refresh", workspace: str = "/workspace/refresh",
                             job_name: str = "gem-refresh-daily") -> str:
    """Schedule the compiled refresh pipeline on a KFP cluster: one run at a time, no
    catch-up burst after downtime (the refresh's own state handles missed days)."""
    import kfp

    client = kfp.Client(host=host)
    experiment_id = client.create_experiment(experiment).experiment_id
    job = client.create_recurring_run(
        experiment_id=experiment_id, job_name=job_name, cron_expression=cron, max_concurrency=1, no_catchup=True,
        pipeline_package_path=str(package),
        params={"workspace": workspace, "run_id": "{{workflow.uid}}", "data": f"{workspace}/incoming"},
    )
    return job.recurring_run_id
