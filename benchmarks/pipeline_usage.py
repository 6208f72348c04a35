"""What each task of a local pipeline run uses, and what the compiled pipelines request.

``watch(cmd)`` runs the pipeline command and samples its process tree with psutil: every
kfp.local task is a process whose command line names ``--function_to_execute <name>``;
a task's usage covers it and everything it starts (torchrun workers, the MLflow worker).
Per task: wall seconds, CPU seconds, average cores (CPU / wall), the peak cores over
any one second, the peak resident memory (the tree's RSS summed: shared pages are
counted in every process, so an upper bound) and the bytes its processes wrote to
storage (``write_bytes``; a process is seen every 0.2 s, so what one writes in its last
0.2 s is missed).

``requested(settings)`` compiles both pipelines with those cluster settings and reads
every executor's CPU / memory request; ``compare`` weighs them by how many tasks of each
component the watched run had (fan-out included) and puts them beside the use.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

FUNCTION_FLAG = "--function_to_execute"
SAMPLE_S = 0.2


@dataclass
class TaskUsage:
    component: str
    pid: int
    started: float
    ended: float = 0.0
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0
    peak_cores: float = 0.0
    write_bytes: int = 0  # bytes the task's processes caused to be written to storage (Linux /proc/PID/io)
    _cpu: dict = field(default_factory=dict, repr=False)  # pid -> last seen user+system
    _written: dict = field(default_factory=dict, repr=False)  # pid -> last seen write_bytes
    _window: list = field(default_factory=list, repr=False)  # (time, cpu) of the last second

    @property
    def wall_s(self) -> float:
        return max(self.ended - self.started, 1e-9)

    def as_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        return {**out, "wall_s": self.wall_s, "avg_cores": self.cpu_s / self.wall_s}


def _component(proc: psutil.Process) -> str | None:
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    if FUNCTION_FLAG in cmd and cmd.index(FUNCTION_FLAG) + 1 < len(cmd):
        return cmd[cmd.index(FUNCTION_FLAG) + 1]
    return None


def _sample(root: psutil.Process, tasks: dict[int, TaskUsage], now: float) -> None:
    try:
        procs = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    owner: dict[int, int] = {}  # process -> the task root it runs under
    for proc in procs:
        try:
            parent = proc.ppid()
        except psutil.NoSuchProcess:
            continue
        if parent in owner:
            owner[proc.pid] = owner[parent]
        elif (name := _component(proc)) is not None:
            owner[proc.pid] = proc.pid
            tasks.setdefault(proc.pid, TaskUsage(component=name, pid=proc.pid, started=now))
    rss: dict[int, float] = defaultdict(float)
    for proc in procs:
        task = tasks.get(owner.get(proc.pid, -1))
        if task is None:
            continue
        try:
            times, mem = proc.cpu_times(), proc.memory_info()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        task._cpu[proc.pid] = times.user + times.system
        rss[task.pid] += mem.rss / 2**20
        try:
            task._written[proc.pid] = proc.io_counters().write_bytes
        except (psutil.Error, AttributeError):  # no /proc/PID/io here
            pass
    for pid, task in tasks.items():
        if pid in rss:
            task.ended = now
            task.cpu_s = sum(task._cpu.values())
            task.write_bytes = sum(task._written.values())
            task.peak_rss_mb = max(task.peak_rss_mb, rss[pid])
            task._window = [(t, c) for t, c in task._window if now - t <= 1.0] + [(now, task.cpu_s)]
            (t0, c0) = task._window[0]
            if now - t0 >= 0.8:
                task.peak_cores = max(task.peak_cores, (task.cpu_s - c0) / (now - t0))


def watch(cmd: list[str], *, env: dict | None = None) -> tuple[int, list[TaskUsage], float]:
    """Run ``cmd``; returns its exit code, every task's usage and the wall seconds."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})})
    root = psutil.Process(proc.pid)
    tasks: dict[int, TaskUsage] = {}
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            _sample(root, tasks, time.perf_counter())
            stop.wait(SAMPLE_S)

    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    code = proc.wait()
    stop.set()
    sampler.join()
    return code, sorted(tasks.values(), key=lambda t: t.started), time.perf_counter() - started


def requested(settings=None) -> dict:
    """Per component of the compiled gem_pipeline (default cluster settings unless
    given): its CPU (cores) and memory (MiB) request; plus the TrainJob's per node."""
    import yaml

    from gem_app.launch import Launcher
    from gem_app.pipelines.compile import GEM_YAML, compile_all
    from gem_app.pipelines.settings import load_cluster_settings, quantity

    settings = settings or load_cluster_settings()
    with tempfile.TemporaryDirectory() as tmp:
        compile_all(tmp, cluster=settings)
        spec = next(yaml.safe_load_all((Path(tmp) / GEM_YAML).read_text()))
    out = {}
    for label, executor in spec["deploymentSpec"]["executors"].items():
        res = executor["container"].get("resources", {})
        name = re.sub(r"_\d+$", "", label.removeprefix("exec-").replace("-", "_"))  # one per features window
        out[name] = {"cpu": quantity(res.get("resourceCpuRequest", 0)),
                     "memory_mb": quantity(res.get("resourceMemoryRequest", 0)) / 2**20}
    job = Launcher.parse(settings.pretrain_launcher)
    if job.kind == "trainjob":
        out["trainjob_node"] = {"cpu": quantity(settings.trainjob.cpu) * job.nodes,
                                "memory_mb": quantity(settings.trainjob.memory) * job.nodes / 2**20}
    return out


def compare(tasks: list[TaskUsage], requests: dict) -> dict:
    """Per component and in total over the watched run's tasks: requested (at the
    compiled defaults) against used (average cores, peak memory). The train task of a
    local run trains in itself; on a cluster its work is split between the launching
    task and the TrainJob's nodes, so both requests count against it."""
    used: dict[str, dict] = defaultdict(lambda: {"tasks": 0, "cpu_s": 0.0, "avg_cores": 0.0, "peak_cores": 0.0,
                                                 "peak_rss_mb": 0.0, "wall_s": 0.0})
    for t in tasks:
        u = used[t.component]
        u["tasks"] += 1
        u["cpu_s"] += t.cpu_s
        u["wall_s"] += t.wall_s
        u["avg_cores"] = max(u["avg_cores"], t.cpu_s / t.wall_s)
        u["peak_cores"] = max(u["peak_cores"], t.peak_cores)
        u["peak_rss_mb"] = max(u["peak_rss_mb"], t.peak_rss_mb)
    rows, total = {}, defaultdict(float)
    for name, u in sorted(used.items()):
        req = dict(requests.get(name, {"cpu": 0.0, "memory_mb": 0.0}))
        if name == "train" and "trainjob_node" in requests:
            req = {k: req[k] + requests["trainjob_node"][k] for k in req}
        rows[name] = {**u, "request_cpu": req["cpu"], "request_memory_mb": req["memory_mb"]}
    for t in tasks:  # totals over the run's tasks, each with its own use
        total["request_cpu"] += rows[t.component]["request_cpu"]
        total["request_memory_mb"] += rows[t.component]["request_memory_mb"]
        total["used_avg_cores"] += t.cpu_s / t.wall_s
        total["used_peak_cores"] += t.peak_cores
        total["used_peak_rss_mb"] += t.peak_rss_mb
        total["tasks"] += 1
    total = dict(total)
    total["cpu_request_over_avg_use"] = total["request_cpu"] / max(total["used_avg_cores"], 1e-9)
    total["memory_request_over_peak_use"] = total["request_memory_mb"] / max(total["used_peak_rss_mb"], 1e-9)
    total["meets_goal"] = total["cpu_request_over_avg_use"] <= 2 and total["memory_request_over_peak_use"] <= 2
    return {"per_component": rows, "total": total}


def summarize(tasks: list[TaskUsage]) -> dict:
    """Per component: tasks, total CPU seconds, total and longest wall seconds."""
    out: dict[str, dict] = defaultdict(lambda: {"tasks": 0, "cpu_s": 0.0, "wall_s": 0.0, "max_wall_s": 0.0})
    for t in tasks:
        row = out[t.component]
        row["tasks"] += 1
        row["cpu_s"] += t.cpu_s
        row["wall_s"] += t.wall_s
        row["max_wall_s"] = max(row["max_wall_s"], t.wall_s)
    return dict(sorted(out.items()))


def load_tasks(path: str | Path) -> list[TaskUsage]:
    """The tasks of a file ``main`` wrote."""
    import json

    keep = {f.name for f in TaskUsage.__dataclass_fields__.values() if not f.name.startswith("_")}
    return [TaskUsage(**{k: v for k, v in t.items() if k in keep}) for t in json.loads(Path(path).read_text())["tasks"]]


def main(argv: list[str] | None = None) -> int:
    """python -m benchmarks.pipeline_usage OUT.json -- python -m gem pipeline run ...: the
    command's per-task usage (e.g. of another checkout, through its PYTHONPATH)."""
    import json
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    out, cmd = Path(argv[0]), argv[argv.index("--") + 1:]
    load = os.getloadavg()
    code, tasks, wall = watch(cmd)
    out.write_text(json.dumps({"cmd": cmd, "exit_code": code, "wall_s": wall, "load_before": load,
                               "load_after": os.getloadavg(), "by_component": summarize(tasks),
                               "tasks": [t.as_dict() for t in tasks]}, indent=1))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
