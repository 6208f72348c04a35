"""Backend selection shared by the ops in kernels/.

Every op has one public function and several implementations; `Backend` names
them and `select_backend` picks one from the device, what is installed, an
explicit argument, and the GEM_ATTENTION_BACKEND environment variable (the
argument wins over the variable, the variable over the automatic choice).
"""

from __future__ import annotations

import ctypes
import enum
import importlib.util
import os

import torch

BACKEND_ENV_VAR = "GEM_ATTENTION_BACKEND"


class Backend(str, enum.Enum):
    """Implementations of the jagged attention op.

    PYTORCH: per-sequence reference loop; any device and dtype (float64 too); ground truth.
    BUCKETED: length-bucketed batched matmuls with a hand-written backward; the CPU path
        (pure PyTorch, so it also runs on CUDA).
    TRITON: fused flash-style kernels; CUDA tensors, or CPU tensors under TRITON_INTERPRET=1.
    """

    PYTORCH = "pytorch"
    BUCKETED = "bucketed"
    TRITON = "triton"


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    """True when TRITON_INTERPRET=1, which runs Triton kernels on CPU tensors (slowly)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def parse_backend(value: Backend | str) -> Backend:
    if isinstance(value, Backend):
        return value
    try:
        return Backend(str(value).strip().lower())
    except ValueError:
        names = ", ".join(b.value for b in Backend)
        raise ValueError(f"backend must be one of {names}; got {value!r}") from None


TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def select_backend(device: torch.device, requested: Backend | str | None = None,
                   dtype: torch.dtype = torch.float32) -> Backend:
    """The backend to run on `device`: requested, else $GEM_ATTENTION_BACKEND, else automatic.

    Automatic: TRITON for CUDA tensors of a Triton dtype when Triton is installed,
    BUCKETED otherwise (e.g. float64). A forced TRITON on a CPU tensor is refused unless
    TRITON_INTERPRET=1.
    """
    if requested is None:
        requested = os.environ.get(BACKEND_ENV_VAR) or None
    if requested is None:
        if device.type == "cuda" and dtype in TRITON_DTYPES and triton_installed():
            return Backend.TRITON
        return Backend.BUCKETED
    backend = parse_backend(requested)
    if backend is Backend.TRITON:
        if not triton_installed():
            raise ValueError("backend 'triton' needs the triton package, which is not installed")
        if device.type != "cuda" and not triton_interpreting():
            raise ValueError(
                f"backend 'triton' needs CUDA tensors (got device {device}); "
                "set TRITON_INTERPRET=1 to run the kernels on CPU tensors for testing"
            )
    return backend


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def keep_freed_cpu_memory() -> bool:
    """Opt-in, process-wide: glibc malloc keeps freed memory instead of handing it back.

    With glibc's defaults, every tensor over ~32 MiB, and the heap above a free block of
    that order, goes back to the OS when freed, so the next step's outputs and gradients
    are fresh pages the kernel must fault in and zero: on the benchmark's default batch
    ~20,000 faults per forward+backward, ~20% of its CPU time (kernels/README.md). This
    sets M_MMAP_THRESHOLD and M_TRIM_THRESHOLD to 1 GiB: the process keeps its peak heap
    (what jemalloc or tcmalloc, often preloaded for CPU training, do too). Returns False
    where glibc is not the allocator. Never called by the ops themselves.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
