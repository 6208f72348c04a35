"""Result files and tables for the kernels benchmarks (kernels/ imports nothing from gem).

A result is `$GEM_BENCH_RESULTS/<name>.json` when that variable names a folder, else
`<cwd>/benchmarks/results/<name>.json`: flat figures (one nested level for variants),
a `machine` dict (CPU model, the ISA flags the CPU actually exposes, threads, torch)
and the sizes used.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

RESULTS_ENV_VAR = "GEM_BENCH_RESULTS"
# The flags that decide which matmul kernels oneDNN/MKL can use, as /proc/cpuinfo spells them.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def cpu_description() -> dict[str, Any]:
    """{'cpu': model name, 'isa': [flags of ISA_FLAGS the CPU exposes]} from /proc/cpuinfo."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not flags:
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"cpu": model, "isa": [flag for flag in ISA_FLAGS if flag in flags]}


def machine_info() -> dict[str, Any]:
    info = cpu_description()
    info.update(cores=os.cpu_count(), torch=torch.__version__,
                torch_threads=torch.get_num_threads(), python=platform.python_version(),
                load_average_1min=os.getloadavg()[0])
    return info


def results_dir() -> Path:
    env = os.environ.get(RESULTS_ENV_VAR)
    return Path(env) if env else Path.cwd() / "benchmarks" / "results"


def write_result(name: str, figures: dict[str, Any], sizes: dict[str, Any]) -> Path:
    """Write figures + machine + sizes to results_dir()/<name>.json (atomically)."""
    out_dir = results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = dict(figures, machine=machine_info(), sizes=sizes,
                   written_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """A small fixed-width table: floats with 4 significant digits."""
    cells = [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    print(f"\n== {title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
