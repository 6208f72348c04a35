"""`python -m benchmarks [NAME ...]`: run every benchmark (or those named).

A benchmark is any module named `*_bench.py` under gem/, kernels/, students/ or
benchmarks/. Each runs in its own process (clean peak-memory figures) and writes
benchmarks/results/<name>.json.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gem", "kernels", "students", "benchmarks")


def discover() -> list[str]:
    modules = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*_bench.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            modules.append(".".join(rel.parts))
    return modules


def main(argv: list[str]) -> int:
    modules = discover()
    if argv:
        modules = [m for m in modules if any(a in m for a in argv)]
    failed = []
    for module in modules:
        print(f"\n>>> {module}", flush=True)
        start = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", module], cwd=ROOT)
        print(f"<<< {module}: rc={rc} in {time.perf_counter() - start:.1f}s", flush=True)
        if rc != 0:
            failed.append(module)
    if failed:
        print("failed benchmarks:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
