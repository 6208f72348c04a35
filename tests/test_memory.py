"""Build workers keep freed memory: a large array comes from the heap, not a fresh mapping."""

import ctypes
import platform

import numpy as np
import pytest

from gem.utils.pool import process_pool

LARGE = 100 * 2**20  # bytes: over glibc's largest default mmap threshold (32 MiB)


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def mapped_bytes_of_a_large_array(_=None) -> int:
    """Bytes malloc serves from separate mappings (mmap) while a 100 MiB array lives."""
    info = ctypes.CDLL("libc.so.6").mallinfo2
    info.restype = MallInfo2
    before = info().hblkhd
    array = np.ones(LARGE // 8)
    during = info().hblkhd
    del array
    return during - before


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_pool_workers_serve_large_arrays_from_the_heap_and_the_caller_is_left_as_it_was():
    with process_pool(2) as pool:
        assert list(pool.map(mapped_bytes_of_a_large_array, range(2))) == [0, 0]
    with process_pool(1) as pool:  # in-process: glibc's defaults, one mapping per large block
        assert list(pool.map(mapped_bytes_of_a_large_array, range(1)))[0] >= LARGE
