"""Where pretraining runs: in-process, under torchrun on this machine, or as a Kubeflow
Trainer TrainJob (torchrun on every node of the cluster's torch runtime).

``launcher`` strings: ``local`` (the stage's own process), ``torchrun:N`` (N processes
here, gloo on CPU / NCCL on GPU), ``trainjob:NODES:GPUS`` (a TrainJob of NODES nodes
with GPUS processes each, one per GPU; 0 GPUs = one CPU process per node; the pipeline
task only creates it and waits).

The TrainJob's container runs ``torchrun -m gem train ... --resume``. The Trainer's
torch runtime injects ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` into every node; torchrun reads each of
its options from the ``PET_`` variable of the same name, so the nodes form one process
group (static rendezvous on node 0). After a node loss the runtime's JobSet restarts
every node (``failurePolicy.maxRestarts`` of ``deploy/trainer/runtime.yaml``) and
``--resume`` continues from the last checkpoint on the shared workspace volume.

The manifest targets Kubeflow Trainer v2.1 (``trainer.kubeflow.org/v1alpha1``,
``podTemplateOverrides``); tests validate it against the ``kubeflow-trainer-api``
models of that release.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
NODE_CONTAINER = "node"  # the trainer container and replicated job of the torch runtimes
# the variables the Trainer's torch plugin sets on every node, read by torchrun
PET_VARIABLES = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(kw_only=True)
class Launcher:
    kind: str  # local | torchrun | trainjob
    nproc: int = 1
    nodes: int = 1
    gpus: int = 0

    @classmethod
    def parse(cls, text: str) -> "Launcher":
        parts = (text or "local").split(":")
        try:
            if parts[0] == "local" and len(parts) == 1:
                return cls(kind="local")
            if parts[0] == "torchrun" and len(parts) == 2 and int(parts[1]) >= 1:
                return cls(kind="torchrun", nproc=int(parts[1]))
            if parts[0] == "trainjob" and len(parts) == 3 and int(parts[1]) >= 1 and int(parts[2]) >= 0:
                gpus = int(parts[2])
                return cls(kind="trainjob", nodes=int(parts[1]), gpus=gpus, nproc=max(gpus, 1))
        except ValueError:
            pass
        raise ValueError(f"launcher {text!r} must be local, torchrun:N or trainjob:NODES:GPUS_PER_NODE")


def train_args(features: str, eval_features: str, out: str, preset: str, overrides: list[str],
               init_from: str = "") -> list[str]:
    """Arguments of `python -m gem train` for these inputs (resume is always on: a
    relaunched job continues from its last checkpoint)."""
    args = ["--features", features, "--out", out, "--preset", preset, "--resume"]
    if eval_features:
        args += ["--eval-features", eval_features]
    if init_from:
        args += ["--init-from", init_from]
    for item in overrides:
        args += ["--set", item]
    return args


def run_torchrun(nproc: int, args: list[str], env: dict[str, str] | None = None) -> None:
    """`torchrun --standalone --nproc_per_node=N -m gem train ARGS` on this machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "gem", "train", *args]
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})})


def trainjob_command(args: list[str]) -> list[str]:
    """The node container's command: torchrun takes nodes, processes, rank and master
    from the PET_* variables the torch runtime injects."""
    return ["torchrun", "-m", "gem", "train", *args]


@dataclass(kw_only=True)
class TrainJobOptions:
    """Cluster placement of the TrainJob's nodes (compile options, see settings.py)."""

    namespace: str = ""  # "" = the namespace of the pod that creates it
    runtime: str = "gem-torch-distributed"  # deploy/trainer/runtime.yaml (torch ML policy + restarts)
    runtime_kind: str = "TrainingRuntime"  # or ClusterTrainingRuntime (e.g. the stock torch-distributed)
    pvc: str = "gem-workspace"
    mount: str = "/workspace"
    gpu_resource: str = "nvidia.com/gpu"
    cpu: str = "2"  # per node: make run's pretraining (1.7 peak cores, 2.1 GB); production sizes in
    memory: str = "3Gi"  # deploy/cluster-settings.yaml
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    service_account: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> "TrainJobOptions":
        """The options the compiled pipeline gave the train task (``GEM_TRAINJOB_OPTIONS``,
        JSON) with the namespace of the run's ``trainjob_namespace`` parameter
        (``GEM_TRAINJOB_NAMESPACE``); defaults elsewhere."""
        import json

        opt = cls(**json.loads(os.environ.get(OPTIONS_ENV) or "{}"))
        opt.namespace = os.environ.get(NAMESPACE_ENV) or opt.namespace
        return opt


OPTIONS_ENV, NAMESPACE_ENV = "GEM_TRAINJOB_OPTIONS", "GEM_TRAINJOB_NAMESPACE"


def current_namespace(default: str = "default") -> str:
    """The namespace of this pod (its service account's), else ``default``."""
    try:
        return SA_NAMESPACE_FILE.read_text().strip() or default
    except OSError:
        return default


def trainjob_manifest(name: str, image: str, args: list[str], *, nodes: int, gpus_per_node: int,
                      options: TrainJobOptions | None = None, namespace: str = "",
                      env: dict[str, str] | None = None) -> dict:
    """A Kubeflow Trainer v2.1 TrainJob running ``torchrun -m gem train ARGS`` on
    ``nodes`` nodes x max(gpus_per_node, 1) processes, with the workspace volume."""
    opt = options or TrainJobOptions.from_env()
    nproc = max(gpus_per_node, 1)
    requests = {"cpu": opt.cpu, "memory": opt.memory}
    limits = {"memory": opt.memory}
    if gpus_per_node:
        requests[opt.gpu_resource] = limits[opt.gpu_resource] = str(gpus_per_node)
    pod_spec: dict = {
        "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": opt.pvc}}],
        "containers": [{"name": NODE_CONTAINER, "volumeMounts": [{"name": "workspace", "mountPath": opt.mount}]}],
    }
    if opt.node_selector:
        pod_spec["nodeSelector"] = dict(opt.node_selector)
    if opt.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in opt.tolerations]
    if opt.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in opt.image_pull_secrets]
    if opt.service_account:
        pod_spec["serviceAccountName"] = opt.service_account
    return {
        "apiVersion": f"{TRAINJOB_GROUP}/{TRAINJOB_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace or opt.namespace or current_namespace(),
                     "labels": {"app.kubernetes.io/part-of": "gem", "app.kubernetes.io/component": "pretrain",
                                **opt.labels}},
        "spec": {
            "runtimeRef": {"apiGroup": TRAINJOB_GROUP, "kind": opt.runtime_kind, "name": opt.runtime},
            "trainer": {
                "image": image,
                "command": trainjob_command(args),
                "numNodes": nodes,
                "numProcPerNode": nproc,
                "resourcesPerNode": {"requests": requests, "limits": limits},
                "env": [{"name": k, "value": v} for k, v in sorted((env or {}).items())],
            },
            "podTemplateOverrides": [{"targetJobs": [{"name": NODE_CONTAINER}], "spec": pod_spec}],
        },
    }


def validate_trainjob(manifest: dict) -> dict:
    """Parse the manifest with the Trainer's published API models (kubeflow-trainer-api);
    raises ValueError when a field is unknown to them or wrongly typed (the models
    ignore unknown fields, so a round trip must give the manifest back unchanged)."""
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    parsed = TrainerV1alpha1TrainJob.from_dict(manifest).to_dict()
    if parsed != manifest:
        raise ValueError(f"TrainJob {manifest.get('metadata', {}).get('name')}: fields the Trainer API does not "
                         f"know or types it would change: {_diff(manifest, parsed)}")
    return parsed


def _diff(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _diff(a.get(key), b.get(key), f"{where}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where or '.'}: {a!r} -> {b!r}"]


def submit_trainjob(manifest: dict, *, poll_s: float = 30.0, timeout_s: float = 24 * 3600) -> dict:
    """Create the TrainJob in the cluster this pod runs in (or find the one a previous
    attempt of this task created) and wait until it completes; raises RuntimeError
    when it fails or times out. Needs the RBAC of deploy/rbac.yaml."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    validate_trainjob(manifest)
    config.load_incluster_config()
    api = client.CustomObjectsApi()
    meta = manifest["metadata"]
    try:
        api.create_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, meta["namespace"], TRAINJOB_PLURAL,
                                            manifest)
    except ApiException as exc:
        if exc.status != 409:  # 409: this task's earlier attempt created it; wait for that one
            raise
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = api.get_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, meta["namespace"], TRAINJOB_PLURAL,
                                               meta["name"])
        conditions = {c["type"]: c for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"}
        if "Complete" in conditions:
            return job
        if "Failed" in conditions:
            raise RuntimeError(f"TrainJob {meta['name']} failed: {conditions['Failed'].get('message', '')}")
        time.sleep(poll_s)
    raise RuntimeError(f"TrainJob {meta['name']} did not finish within {timeout_s:.0f} s")
