"""Fixtures for the kernel tests.

Triton kernels run on CPU tensors only through Triton's interpreter, which Triton reads
when a kernel is defined; so TRITON_INTERPRET=1 is set here, before any test imports
kernels.triton, on machines without CUDA (where nothing else could run them anyway).
"""

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def generator() -> torch.Generator:
    """A torch.Generator with a fresh seed per test, printed so a failure shows it.

    Reproduce a failure with GEM_TEST_SEED=<seed>.
    """
    seed = int(os.environ.get("GEM_TEST_SEED") or random.SystemRandom().randrange(2**31))
    print(f"GEM_TEST_SEED={seed}")
    return torch.Generator().manual_seed(seed)
