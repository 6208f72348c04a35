"""Compile gem_pipeline and refresh_pipeline to IR YAML with cluster settings, and
create the refresh pipeline's recurring run on a KFP cluster.

    python -m gem_app.pipelines.compile --out pipelines/compiled --image REGISTRY/gem:TAG \\
        --cluster-config deploy/cluster.yaml --set resources.shard.cpu=250m --set node_selector.pool=cpu

(`python -m gem pipeline compile --image ... --mlflow-uri ...` compiles with the defaults.)
Every option is a field of ``ClusterSettings`` (gem_app/pipelines/settings.py).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

GEM_YAML = "gem_pipeline.yaml"
REFRESH_YAML = "refresh_pipeline.yaml"
# KFP 2's run-id placeholder (dsl.PIPELINE_JOB_ID_PLACEHOLDER; the v1 `{{workflow.uid}}` is
# not resolved by the v2 backend). KFP resolves it in task inputs only, so the pipelines
# pass it to start_run as a task input and leave the run_id parameter empty by default.
RUN_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"


def compile_all(out: str | Path, *, image: str | None = None, mlflow_uri: str | None = None,
                cluster_config: str | Path | None = None, overrides: list[str] | None = None,
                cluster=None) -> list[Path]:
    if image:
        os.environ["GEM_IMAGE"] = image  # read when the components module is first imported
    from kfp import compiler

    from gem_app.components.base import BASE_IMAGE
    from gem_app.pipelines.gem_pipeline import make_gem_pipeline
    from gem_app.pipelines.settings import load_cluster_settings

    if cluster is None:
        values = {"image": image or BASE_IMAGE, **({"mlflow_uri": mlflow_uri} if mlflow_uri else {})}
        cluster = load_cluster_settings(cluster_config, overrides, **values)
    if cluster.image != BASE_IMAGE:
        raise ValueError(f"the components were built for image {BASE_IMAGE!r}, the settings say {cluster.image!r}: "
                         "compile in a fresh process with --image")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for refresh, name in ((False, GEM_YAML), (True, REFRESH_YAML)):
        path = out / name
        compiler.Compiler().compile(make_gem_pipeline(cluster, refresh=refresh), str(path))
        written.append(path)
    return written


def recurring_run_params(workspace: str) -> dict:
    """Parameters of every scheduled refresh run: one workspace (its refresh state carries
    over) and new days under ``workspace/incoming``. No run_id: each run takes its own
    KFP job id (the placeholder start_run reads)."""
    return {"workspace": workspace, "data": f"{workspace}/incoming"}


def default_workspace(package: str | Path) -> str:
    """The ``workspace`` parameter's default in a compiled pipeline (the compile option)."""
    import yaml

    spec = next(yaml.safe_load_all(Path(package).read_text()))
    return spec["root"]["inputDefinitions"]["parameters"]["workspace"].get("defaultValue", "")


def create_recurring_refresh(host: str, package: str | Path, *, cron: str = "0 0 3 * * *",
                             experiment: str = "gem-refresh", workspace: str = "",
                             job_name: str = "gem-refresh-daily", namespace: str | None = None) -> str:
    """Schedule the compiled refresh pipeline on a KFP cluster: one run at a time, no
    catch-up burst after downtime (the refresh's own state handles missed days). The
    workspace defaults to the one the package was compiled with."""
    import kfp

    workspace = workspace or default_workspace(package)
    if not workspace:
        raise ValueError(f"{package}: compiled without a default workspace; give one")
    client = kfp.Client(host=host, namespace=namespace)
    experiment_id = client.create_experiment(experiment, namespace=namespace).experiment_id
    job = client.create_recurring_run(
        experiment_id=experiment_id, job_name=job_name, cron_expression=cron, max_concurrency=1, no_catchup=True,
        pipeline_package_path=str(package), params=recurring_run_params(workspace),
    )
    return job.recurring_run_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("pipelines/compiled"))
    parser.add_argument("--image", default="",
                        help="project image of every component (default $GEM_IMAGE or gem:latest)")
    parser.add_argument("--mlflow-uri", default="", help="tracking server the cluster tasks log to")
    parser.add_argument("--cluster-config", default=None, help="YAML file of ClusterSettings fields")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one ClusterSettings field, e.g. resources.pretrain.gpu=2")
    args = parser.parse_args(argv)
    for path in compile_all(args.out, image=args.image or None, mlflow_uri=args.mlflow_uri or None,
                            cluster_config=args.cluster_config, overrides=args.overrides):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
