"""Where a pipeline runs: cluster settings (kfp-kubernetes) or none for kfp.local.

Local runs leave tasks as they are. A cluster build mounts the shared workspace volume
on every task, sets CPU/memory requests, retries and caching, puts pretraining on a GPU
node, and passes MLFLOW_TRACKING_URI to every task.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class ClusterSettings:
    workspace_pvc: str = "gem-workspace"
    workspace_mount: str = "/workspace"
    mlflow_uri: str = "http://mlflow.mlflow.svc.cluster.local:5000"
    gpu_type: str = "nvidia.com/gpu"
    gpus_for_pretrain: int = 1
    retries: int = 2
    cpu: str = "2"
    memory: str = "8G"
    pretrain_cpu: str = "16"
    pretrain_memory: str = "64G"
    image: str = "gem:latest"  # the TrainJob's image (compile sets it to the components' image)


def configure_task(task, kind: str, cluster: ClusterSettings | None):
    """Apply cluster settings to one task (kind: "light", "heavy" or "pretrain")."""
    task.set_caching_options(True)
    if cluster is None:
        return task
    from kfp import kubernetes

    kubernetes.mount_pvc(task, pvc_name=cluster.workspace_pvc, mount_path=cluster.workspace_mount)
    task.set_env_variable("MLFLOW_TRACKING_URI", cluster.mlflow_uri)
    task.set_retry(num_retries=cluster.retries, backoff_duration="30s", backoff_factor=2.0)
    if kind == "pretrain":
        # the task either trains itself (launcher=local) or launches and waits for a TrainJob
        task.set_cpu_request(cluster.pretrain_cpu).set_memory_request(cluster.pretrain_memory)
        task.set_accelerator_type(cluster.gpu_type).set_accelerator_limit(cluster.gpus_for_pretrain)
        task.set_env_variable("GEM_IMAGE", cluster.image)
    elif kind == "heavy":
        task.set_cpu_request(cluster.pretrain_cpu).set_memory_request(cluster.pretrain_memory)
    else:
        task.set_cpu_request(cluster.cpu).set_memory_request(cluster.memory)
    return task
