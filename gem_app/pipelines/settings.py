"""Where a pipeline runs: cluster settings (kfp-kubernetes) or none for kfp.local.

Local runs leave tasks as they are (caching is on; the stages' own content-keyed
records make a local rerun cheap). A cluster build mounts the shared workspace volume
on every task, gives each task the resources of its stage's profile (requests, and
limits where set), places tasks with node selectors / tolerations, pulls the image
with the given secrets, sets retries and caching, passes MLFLOW_TRACKING_URI and the
Feast environment, and exposes the KFP run id to every task (see
``gem_app/components/base.py``: the run context reaches cached tasks outside their
cache key).

Every field is a compile option: ``--cluster-config FILE`` (YAML of these fields) and
``--set key.sub=value`` (``python -m gem_app.pipelines.compile --help``); the defaults
are documented in docs/pipelines.md ("Resources and placement").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gem_app.components.runtime import KFP_RUN_ID_ENV
from gem_app.launch import OPTIONS_ENV, Launcher, TrainJobOptions

# every cluster task gets the KFP run id from its pod label (not part of the cache key)
KFP_RUN_ID_FIELD = "metadata.labels['pipeline/runid']"



@dataclass(kw_only=True)
class Resources:
    """One task's container resources ("" = not set). A GPU count is both request and
    limit (Kubernetes requires them equal)."""

    cpu: str | int | float = "1"
    memory: str = "2Gi"
    cpu_limit: str | int | float = ""
    memory_limit: str = ""
    gpu: int = 0

    def __post_init__(self) -> None:
        self.cpu, self.cpu_limit = str(self.cpu), str(self.cpu_limit)
        for request, limit in ((self.cpu, self.cpu_limit), (self.memory, self.memory_limit)):
            if request and limit and quantity(limit) < quantity(request):
                raise ValueError(f"limit {limit} below the request {request} (Kubernetes refuses the pod)")


_UNITS = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9,
          "T": 1e12}


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity as a plain number (CPU cores, memory bytes): "500m" -> 0.5."""
    text = str(text).strip()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * _UNITS[unit]
    return float(text)


@dataclass(kw_only=True)
class StageResources:
    """Resources by stage profile, sized from what the stages use in `make run` (the
    small preset): about 1.2-2x each profile's measured peak memory
    (benchmarks/results/pipeline.json, `usage.*`); limits leave room for larger data."""

    light: Resources = field(default_factory=lambda: Resources(cpu="250m", memory="768Mi", memory_limit="2Gi"))
    ingest: Resources = field(default_factory=lambda: Resources(cpu="1", memory="1Gi", memory_limit="8Gi"))
    plan: Resources = field(default_factory=lambda: Resources(cpu="500m", memory="768Mi", memory_limit="4Gi"))
    shard: Resources = field(default_factory=lambda: Resources(cpu="500m", memory="512Mi", memory_limit="4Gi"))
    finalize: Resources = field(default_factory=lambda: Resources(cpu="500m", memory="512Mi", memory_limit="4Gi"))
    feast: Resources = field(default_factory=lambda: Resources(cpu="1", memory="1536Mi", memory_limit="8Gi"))
    # the train task when it trains itself (launcher local / torchrun:N)
    pretrain: Resources = field(default_factory=lambda: Resources(cpu="2", memory="4Gi", memory_limit="16Gi", gpu=1))
    # the train task when it only creates and polls a TrainJob
    launch: Resources = field(default_factory=lambda: Resources(cpu="500m", memory="1536Mi", memory_limit="8Gi"))
    knowledge: Resources = field(default_factory=lambda: Resources(cpu="1", memory="2Gi", memory_limit="8Gi"))
    distill: Resources = field(default_factory=lambda: Resources(cpu="1", memory="1536Mi", memory_limit="8Gi"))
    gate: Resources = field(default_factory=lambda: Resources(cpu="1", memory="1536Mi", memory_limit="8Gi"))


# component name -> resource profile (the train task's profile depends on the launcher)
STAGE_PROFILES = {
    "start_run": "light", "resolve_champion": "light", "distill_plan": "light", "promote": "light",
    "summary": "light", "ingest": "ingest", "features_plan": "plan", "features_shard": "shard",
    "features_finalize": "finalize", "feast_materialize": "feast", "knowledge": "knowledge", "distill": "distill",
    "gate": "gate", "gate_teacher": "gate",
}
# tasks that create or read run state that must not be replayed from the cache (promote:
# the run's commit moves the champions)
UNCACHED = {"start_run", "resolve_champion", "promote", "summary"}


@dataclass(kw_only=True)
class ClusterSettings:
    image: str = "gem:latest"  # the components' and the TrainJob's image (compile --image)
    workspace: str = "/workspace/gem"  # the pipelines' default `workspace` parameter
    workspace_pvc: str = "gem-workspace"  # ReadWriteMany: every task and TrainJob node mounts it
    workspace_mount: str = "/workspace"
    mlflow_uri: str = "http://mlflow.mlflow.svc.cluster.local:5000"
    feast_env: str = "cluster"  # feature_repo/feature_store.<env>.yaml (local: duckdb + sqlite)
    feast_redis: str = "gem-feast-redis:6379"  # FEAST_REDIS_CONNECTION: the online store (deploy/feast/redis.yaml)
    feast_redis_secret: str = ""  # or a Secret whose `connection_string` key holds it (with a password)
    feast_ray_address: str = ""  # RAY_ADDRESS of the offline store's Ray cluster ("" = Ray inside each task)
    retries: int = 2
    caching: bool = True
    shard_parallelism: int = 4  # per features window (three windows build at once)
    distill_parallelism: int = 4
    pretrain_launcher: str = "trainjob:1:1"  # the pipelines' default; decides the train task's profile
    resources: StageResources = field(default_factory=StageResources)
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: dict = field(default_factory=dict)  # every task
    tolerations: list = field(default_factory=list)  # every task: [{key, operator, value, effect}]
    gpu_node_selector: dict = field(default_factory=dict)  # added for tasks that hold a GPU
    gpu_tolerations: list = field(default_factory=list)
    image_pull_secrets: list = field(default_factory=list)  # secret names
    trainjob: TrainJobOptions = field(default_factory=TrainJobOptions)

    def __post_init__(self) -> None:
        Launcher.parse(self.pretrain_launcher)
        # the TrainJob mounts the same workspace and pulls with the same secrets
        self.trainjob.pvc, self.trainjob.mount = self.workspace_pvc, self.workspace_mount
        self.trainjob.image_pull_secrets = list(self.trainjob.image_pull_secrets or self.image_pull_secrets)
        # its nodes land where the pipeline's tasks do, on GPU nodes when they use GPUs
        gpu = Launcher.parse(self.pretrain_launcher).gpus > 0
        self.trainjob.node_selector = {**self.node_selector, **(self.gpu_node_selector if gpu else {}),
                                       **self.trainjob.node_selector}
        self.trainjob.tolerations = [*self.tolerations, *(self.gpu_tolerations if gpu else []),
                                     *self.trainjob.tolerations]
        self.trainjob.gpu_resource = self.gpu_resource
        if not self.workspace.startswith(self.workspace_mount.rstrip("/") + "/"):
            raise ValueError(f"workspace {self.workspace!r} must lie under the volume's mount {self.workspace_mount!r}")

    def profile(self, component: str) -> Resources:
        if component == "train":
            name = "launch" if Launcher.parse(self.pretrain_launcher).kind == "trainjob" else "pretrain"
        else:
            name = STAGE_PROFILES.get(component, "light")
        return getattr(self.resources, name)


def load_cluster_settings(path: str | Path | None = None, overrides: list[str] | None = None,
                          **values) -> ClusterSettings:
    """Defaults < YAML file < ``key.sub=value`` overrides < keyword values. A stage
    profile given in part keeps the rest of its own defaults (``resources.shard.cpu=1``
    leaves the shard profile's memory as it was)."""
    import yaml

    from gem.config import ConfigError, load_config

    layers = [f"resources={json.dumps(asdict(StageResources()))}"]
    if path:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of ClusterSettings fields")
        layers += [f"{k}={json.dumps(v)}" for k, v in raw.items()]
    layers += [*(overrides or []), *(f"{k}={json.dumps(v)}" for k, v in values.items())]
    return load_config(ClusterSettings, overrides=layers)


def component_name(task) -> str:
    return task.component_spec.name.replace("-", "_")


def configure_task(task, cluster: ClusterSettings | None):
    """Apply the cluster settings to one task (its profile comes from its component)."""
    name = component_name(task)
    if cluster is None:
        task.set_caching_options(name not in UNCACHED)
        return task
    from kfp import kubernetes

    task.set_caching_options(cluster.caching and name not in UNCACHED)
    kubernetes.mount_pvc(task, pvc_name=cluster.workspace_pvc, mount_path=cluster.workspace_mount)
    kubernetes.use_field_path_as_env(task, env_name=KFP_RUN_ID_ENV, field_path=KFP_RUN_ID_FIELD)
    task.set_env_variable("MLFLOW_TRACKING_URI", cluster.mlflow_uri)
    task.set_env_variable("GEM_FEAST_ENV", cluster.feast_env)
    if cluster.feast_redis_secret:
        kubernetes.use_secret_as_env(task, secret_name=cluster.feast_redis_secret,
                                     secret_key_to_env={"connection_string": "FEAST_REDIS_CONNECTION"})
    else:
        task.set_env_variable("FEAST_REDIS_CONNECTION", cluster.feast_redis)
    if cluster.feast_ray_address:
        task.set_env_variable("RAY_ADDRESS", cluster.feast_ray_address)
    task.set_retry(num_retries=cluster.retries, backoff_duration="30s", backoff_factor=2.0)
    res = cluster.profile(name)
    if res.cpu:
        task.set_cpu_request(res.cpu)
    if res.memory:
        task.set_memory_request(res.memory)
    if res.cpu_limit:
        task.set_cpu_limit(res.cpu_limit)
    if res.memory_limit:
        task.set_memory_limit(res.memory_limit)
    node_selector, tolerations = dict(cluster.node_selector), list(cluster.tolerations)
    if res.gpu:
        task.set_accelerator_type(cluster.gpu_resource).set_accelerator_limit(res.gpu)
        node_selector.update(cluster.gpu_node_selector)
        tolerations += cluster.gpu_tolerations
    for key, value in node_selector.items():
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for tol in tolerations:
        kubernetes.add_toleration(task, key=tol.get("key"), operator=tol.get("operator", "Equal"),
                                  value=tol.get("value"), effect=tol.get("effect"),
                                  toleration_seconds=tol.get("tolerationSeconds"))
    if cluster.image_pull_secrets:
        kubernetes.set_image_pull_secrets(task, list(cluster.image_pull_secrets))
    if name == "train":
        task.set_env_variable("GEM_IMAGE", cluster.image)
        task.set_env_variable(OPTIONS_ENV, json.dumps(asdict(cluster.trainjob), sort_keys=True))
    return task
