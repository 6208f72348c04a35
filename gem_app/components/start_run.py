from typing import NamedTuple

from gem_app.components.base import component


@component
def start_run(pipeline_run_id: str, kfp_run_id: str, tracking_root: str, workspace: str, data: str, params: dict
              ) -> NamedTuple("Started", ctx=str, tracking=str, data_digest=str, code_version=str, sim_config=str,
                             features_config=str, train_config=str, students_config=str):
    """Open the pipeline's parent MLflow run (local store: ``tracking_root``, by default the
    workspace; the run is named ``pipeline_run_id``, else KFP's job id ``kfp_run_id``)
    and fingerprint the run's inputs. Returns the run context (JSON) for the
    uncached steps, the stable tracking root for the cached ones, and the content keys
    (data digest, code version, config digests) their cache keys are made of."""
    import os
    from collections import namedtuple

    from gem_app.components.runtime import KFP_RUN_ID_ENV, KFP_RUN_TAG, fingerprint, record_active_run
    from gem_app.stages.context import RunContext, run_label, start_pipeline

    tracking = tracking_root or workspace
    keys = fingerprint(data, params)
    kfp_run = os.environ.get(KFP_RUN_ID_ENV, "")  # the pod label cached tasks find the run by (cluster only)
    run_id = pipeline_run_id or kfp_run_id or kfp_run
    if not run_id or "{{" in run_id:
        raise ValueError(f"no pipeline run id: run_id={pipeline_run_id!r}, KFP job id {kfp_run_id!r}")
    label, data_param, digest_param = run_label(data, params, keys)
    ctx = start_pipeline(RunContext(pipeline_run_id=run_id, tracking_root=tracking),
                         params={**params, "data": data_param, "data_digest": digest_param,
                                 "code_version": keys["code"], "pipeline_run_id": run_id},
                         tags={KFP_RUN_TAG: kfp_run} if kfp_run else None, run_name=label)
    record_active_run(ctx)
    fields = ["ctx", "tracking", "data_digest", "code_version", "sim_config", "features_config", "train_config",
              "students_config"]
    return namedtuple("Started", fields)(ctx.dumps(), tracking, keys["data"], keys["code"], keys["sim"],
                                         keys["features"], keys["train"], keys["students"])
