"""How a cached task finds the pipeline run it belongs to, and the content keys of a
run's inputs (imported by the component bodies at run time).

Caching keys on content: a cacheable task takes the stable ``tracking`` root, content
digests (data, config, code version) and upstream versions, never the run-unique run
context (its parent MLflow run id would make every key unique). When such a task
does run, ``run_context`` finds the pipeline's parent MLflow run outside the cache
key: on a cluster from the KFP run id every task reads from its pod label
(``GEM_KFP_RUN_ID``, settings.py), which ``start_run`` tagged the parent run with;
under kfp.local from the record ``start_run`` left beside the MLflow store (a local
run holds the workspace lock, so there is one active run per workspace).
"""

from __future__ import annotations

import os

KFP_RUN_ID_ENV = "GEM_KFP_RUN_ID"
# set by a local run (gem_app/pipelines/local.py): how many iterations of a ParallelFor
# kfp.local runs at once on this machine
LOCAL_PARALLEL_ENV = "GEM_LOCAL_PARALLEL_TASKS"
KFP_RUN_TAG = "gem.kfp_run_id"
ACTIVE_RUN = ".runs/active.json"


def record_active_run(ctx) -> None:
    """Called by start_run: the parent run for the cached tasks of this local run."""
    from pathlib import Path

    from gem.utils.atomic import write_text

    write_text(ctx.dumps(), Path(ctx.tracking_root) / ACTIVE_RUN)


def share_cores() -> None:
    """A task of a loop that a local run executes beside others on this machine: torch
    gets its share of the cores instead of one thread per core in every task (oversubscribed,
    each op waits at a barrier for a thread the OS gave to the other task). Elsewhere
    (a cluster's pods, one process) nothing changes."""
    tasks = int(os.environ.get(LOCAL_PARALLEL_ENV, "0") or 0)
    if tasks > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // tasks))


def run_context(tracking: str):
    """This pipeline run's RunContext (parent MLflow run included), found outside the
    task's inputs; a context without a parent when there is none to find."""
    import json
    from pathlib import Path

    from gem import tracking as gem_tracking
    from gem_app.stages.context import RunContext

    stable = RunContext(pipeline_run_id="", tracking_root=tracking)
    kfp_run = os.environ.get(KFP_RUN_ID_ENV, "")
    if kfp_run:
        import mlflow

        stable.configure()
        runs = mlflow.search_runs(experiment_names=[stable.experiment], output_format="list", max_results=1,
                                  filter_string=f"tags.`{KFP_RUN_TAG}` = '{kfp_run}'")
        if runs:
            run = runs[0]
            return RunContext(pipeline_run_id=run.data.tags.get(gem_tracking.TAG_PIPELINE_RUN, kfp_run),
                              tracking_root=tracking, parent_run_id=run.info.run_id, experiment=stable.experiment)
        return RunContext(pipeline_run_id=kfp_run, tracking_root=tracking)
    path = Path(tracking) / ACTIVE_RUN
    if path.is_file():
        return RunContext(**json.loads(path.read_text()))
    return stable


def fingerprint(data: str, presets: dict) -> dict:
    """Content keys of one run's inputs: the dataset's digest ("" when simulated), the
    code version and a digest of each resolved config preset (the simulator's "" when
    the run reads a given dataset: it plays no part then). Refuses a student preset that
    reads dense features the features preset does not build, before any stage runs."""
    from gem.config import flatten, load_config
    from gem.data.simulate import SimulatorConfig
    from gem.features.config import FeaturesConfig
    from gem.training.config import load_train_config
    from gem.utils.digest import code_version, tree_digest, value_digest
    from gem_app.stages.distill import distill_config

    train, model = load_train_config(presets["train_preset"], [])
    features = load_config(FeaturesConfig, section="features", preset=presets["features_preset"])
    students = distill_config(presets["student_preset"])
    check_student_inputs(features, students.student.dense_features, presets)
    configs = {
        "sim": flatten(load_config(SimulatorConfig, section="simulator", preset=presets["sim_preset"])),
        "features": flatten(features),
        "train": {**flatten(train), **flatten(model)},
        "students": flatten(students),
    }
    keys = {k: value_digest(v) for k, v in configs.items()}
    if data:
        keys["sim"] = ""
    return {"data": tree_digest(data) if data else "", "code": code_version(), **keys}


def check_student_inputs(features, dense_features: list[str], presets: dict) -> None:
    from gem.features.counters import COUNTER_FEATURES, COUNTER_PREFIX
    from gem.features.shards import DENSE_FEATURES

    missing = [n for n in dense_features if n not in DENSE_FEATURES and not (
        features.counters and n in COUNTER_FEATURES)]
    if missing:
        counters = " (cnt_*: the features preset builds no counters; set counters: true)" if any(
            n.startswith(COUNTER_PREFIX) for n in missing) else ""
        raise ValueError(f"student preset {presets['student_preset']!r} reads dense features {missing} that features "
                         f"preset {presets['features_preset']!r} does not build{counters}")


def log_figures(metrics, figures: dict, prefix: str = "") -> None:
    """``figures`` on a kfp Metrics artifact, the figures not computed left out
    (gem.utils.evidence.computed: kfp's metadata carries no NaN)."""
    from gem.utils.evidence import computed

    for key, number in computed(figures).items():
        metrics.log_metric(prefix + key.replace("/", "."), number)
