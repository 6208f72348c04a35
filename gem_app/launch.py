"""Where pretraining runs: in-process, under torchrun on this machine, or as a Kubeflow
Trainer TrainJob (torchrun on an existing cluster engine).

``launcher`` strings: ``local`` (the stage's own process), ``torchrun:N`` (N processes
here, gloo on CPU / NCCL on GPU), ``trainjob:NODES:GPUS`` (a TrainJob on the cluster,
the pipeline task waits for it). Every launcher runs the same `python -m gem train`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"


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
                return cls(kind="trainjob", nodes=int(parts[1]), gpus=int(parts[2]))
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


def trainjob_manifest(name: str, image: str, args: list[str], *, nodes: int, gpus_per_node: int,
                      namespace: str = "kubeflow", runtime: str = "torch-distributed",
                      pvc: str = "gem-workspace", mount: str = "/workspace",
                      env: dict[str, str] | None = None) -> dict:
    """A Kubeflow Trainer TrainJob running `gem train` under the torch runtime's torchrun."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus_per_node)}} if gpus_per_node else {}
    return {
        "apiVersion": f"{TRAINJOB_GROUP}/{TRAINJOB_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "gem"}},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {
                "image": image,
                "command": ["python", "-m", "gem", "train", *args],
                "numNodes": nodes,
                "resourcesPerNode": resources,
                "env": [{"name": k, "value": v} for k, v in sorted((env or {}).items())],
            },
            "podSpecOverrides": [{
                "targetJobs": [{"name": "node"}],
                "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": pvc}}],
                "containers": [{"name": "node", "volumeMounts": [{"name": "workspace", "mountPath": mount}]}],
            }],
        },
    }


def submit_trainjob(manifest: dict, *, poll_s: float = 30.0, timeout_s: float = 24 * 3600) -> dict:
    """Create the TrainJob in the cluster this pod runs in and wait until it completes;
    raises RuntimeError when it fails or times out."""
    from kubernetes import client, config

    config.load_incluster_config()
    api = client.CustomObjectsApi()
    meta = manifest["metadata"]
    api.create_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, meta["namespace"], TRAINJOB_PLURAL, manifest)
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
