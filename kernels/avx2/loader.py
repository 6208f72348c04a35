"""Builds and loads jagged_softmax_attention.c; wraps its forward and backward for tensors.

The library is compiled on first use with the system's C compiler and cached under a
directory named by the digest of the source, the flags and the compiler's version, so a
changed source or compiler builds anew and nothing is reused by path alone. Unavailable
(`library()` returns None, with the reason in `unavailable_reason()`) on CPUs without
AVX2 and FMA, without a compiler, or with $GEM_NATIVE_ATTENTION=0; callers then take
another path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("jagged_softmax_attention.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-std=c11")
# The kernels' threads are OpenMP's, so they are torch's own (its libgomp is the one the
# process has loaded): a kernel of its own threads started while torch's OpenMP threads
# still spin after the op before it shared the cores with them (the demo's attention and
# FFN kernels ran 10-35% slower inside a train step than alone). Without OpenMP the
# kernels build serial (their pragmas ignored).
THREADING = (("-fopenmp",), ())
ENV_SWITCH = "GEM_NATIVE_ATTENTION"
CACHE_ENV = "GEM_KERNEL_CACHE"
Tensor = torch.Tensor
_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gem" / "kernels"
    return Path(root)


def _build(compiler: str, source: Path) -> Path:
    """The library for this source, flags and compiler: built unless already cached; with
    OpenMP where the compiler has it, else serial."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    headers = [h.read_text() for h in sorted(source.parent.glob("*.h"))]  # what the sources include
    errors = []
    for threading in THREADING:
        flags = (*FLAGS, *threading)
        digest = hashlib.sha256("\0".join([source.read_text(), *headers, *flags, version]).encode()).hexdigest()[:20]
        target = cache_dir() / digest / f"lib{source.stem}.so"
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            result = subprocess.run([compiler, *flags, "-o", str(built), str(source), "-lm"],
                                    capture_output=True, text=True)
            if result.returncode == 0:
                os.replace(built, target)  # atomic: concurrent builders leave one whole file
                return target
            errors.append(result.stderr.strip()[-500:])
    raise RuntimeError(f"{compiler} failed on {source.name}: {errors[-1]}")


def native_library(source: Path, switch_env: str, what: str, fallback: str) -> tuple[ctypes.CDLL | None, str]:
    """``source`` built and loaded, or None and the reason: ``$switch_env`` = 0, a CPU
    without AVX2/FMA, no compiler, or a failed build (warned once, naming ``what`` and the
    ``fallback`` that runs instead)."""
    if os.environ.get(switch_env, "1") == "0":
        return None, f"${switch_env}=0"
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= _cpu_flags():
        return None, "the CPU lacks AVX2/FMA"
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler"
    try:
        return ctypes.CDLL(str(_build(compiler, source))), ""
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        reason = f"the AVX2 {what} kernel is unavailable ({error}); using {fallback}"
        warnings.warn(reason, RuntimeWarning, stacklevel=2)
        return None, reason


@functools.lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str]:
    lib, reason = native_library(SOURCE, ENV_SWITCH, "attention", "torch's flash kernels")
    if lib is None:
        return None, reason
    common = [_I64, _I64, _I64, _I64, ctypes.c_float, ctypes.c_int]
    lib.jagged_softmax_forward.argtypes = [_PTR] * 7 + common
    lib.jagged_softmax_backward.argtypes = [_PTR] * 11 + common
    lib.jagged_softmax_forward.restype = lib.jagged_softmax_backward.restype = ctypes.c_int
    return lib, ""


def library() -> ctypes.CDLL | None:
    return _load()[0]


def unavailable_reason() -> str:
    return _load()[1]


def supports(q: Tensor) -> bool:
    """Whether the kernel can take q's attention (CPU; the fused path that asks has
    Dv == D) on this machine. Head dims that are not multiples of 8 run zero-padded."""
    return q.device.type == "cpu" and library() is not None


_LANES = 8  # the kernel's head dims are multiples of this (it pads to 16 inside)


def _width(x: Tensor) -> int:
    return -(-x.shape[2] // _LANES) * _LANES


def _padded(x: Tensor) -> Tensor:
    """(T, H, D) -> (T, H, D rounded up to 8), zeros after column D: zero columns add
    nothing to q.k, and a zero column of v or dO yields a zero column of out, dq, dk, dv."""
    if _width(x) == x.shape[2]:
        return x
    return torch.nn.functional.pad(x, (0, _width(x) - x.shape[2]))


def _wide_output(x: Tensor) -> Tensor:
    """The kernel's output buffer for x: x itself, or a zeroed padded one (rows outside
    the spans, which x may hold zeroed, come back as zeros; later writers overwrite the rest)."""
    if _width(x) == x.shape[2]:
        return x
    return x.new_zeros(x.shape[0], x.shape[1], _width(x))


def _write_back(narrow: Tensor, wide: Tensor) -> None:
    if wide is not narrow:
        narrow.copy_(wide[:, :, :narrow.shape[2]])


def pointer(x: Tensor | None) -> int | None:
    """A contiguous float32 / int64 CPU tensor's address for the C kernels (None: NULL)."""
    if x is None:
        return None
    assert x.dtype in (torch.float32, torch.int64) and x.is_contiguous() and x.device.type == "cpu"
    return x.data_ptr()


_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [_PTR, ctypes.c_size_t, ctypes.c_int]
    return libc


def _advise_huge_pages(*outputs: Tensor) -> None:
    """Ask Linux to back the outputs' untouched memory with 2 MiB pages.

    Outputs are fresh allocations, so their first touch inside the kernel page-faults:
    one fault and one 4 KiB zeroing per page (~15,000 a forward+backward on the
    benchmark's default batch). Where transparent huge pages are
    enabled for advised memory (the default "madvise" mode), each 2 MiB-aligned stretch
    then costs one fault. Only these buffers are advised; nothing process-wide changes.
    """
    libc = _libc()
    if libc is None:
        return
    for x in outputs:
        first = -(-x.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        last = (x.data_ptr() + x.numel() * x.element_size()) // _HUGE_PAGE * _HUGE_PAGE
        if last > first:
            libc.madvise(first, last - first, _MADV_HUGEPAGE)


def _spans(starts: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    return starts.to(torch.int64).contiguous(), lengths.to(torch.int64).contiguous()


def forward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, starts: Tensor,
            lengths: Tensor, scale: float) -> None:
    """Writes out (T, H, Dv) and lse (T, H) rows of the spans [starts, starts + lengths)."""
    starts, lengths = _spans(starts, lengths)
    q, k, v = _padded(q), _padded(k), _padded(v)
    wide_out = _wide_output(out)
    _advise_huge_pages(wide_out)
    status = library().jagged_softmax_forward(
        pointer(q), pointer(k), pointer(v), pointer(wide_out), pointer(lse), pointer(starts), pointer(lengths),
        starts.numel(), q.shape[1], q.shape[2], v.shape[2], scale, torch.get_num_threads())
    if status != 0:
        raise MemoryError("jagged_softmax_forward: could not allocate its workspace")
    _write_back(out, wide_out)


def backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             dq: Tensor, dk: Tensor, dv: Tensor, starts: Tensor, lengths: Tensor,
             scale: float) -> None:
    """Writes dq, dk, dv rows of the spans from the forward's out and lse."""
    starts, lengths = _spans(starts, lengths)
    grad_out, q, k, v, out = (_padded(x) for x in (grad_out, q, k, v, out))
    grads = [_wide_output(g) for g in (dq, dk, dv)]
    _advise_huge_pages(*grads)
    status = library().jagged_softmax_backward(
        pointer(grad_out), pointer(q), pointer(k), pointer(v), pointer(out), pointer(lse), *map(pointer, grads),
        pointer(starts), pointer(lengths), starts.numel(), q.shape[1], q.shape[2], v.shape[2],
        scale, torch.get_num_threads())
    if status != 0:
        raise MemoryError("jagged_softmax_backward: could not allocate its workspace")
    for narrow, wide in zip((dq, dk, dv), grads):
        _write_back(narrow, wide)
