"""The model's attention calls kernels' one op; backend names are kernels' (plus old aliases)."""

import pytest
import torch

from gem.model.attention import BACKENDS, LEGACY_BACKENDS, jagged_self_attention, kernels_backend
from kernels.jagged_inputs import offsets_from_lengths


def test_backend_names_resolve_to_kernels_backends():
    assert BACKENDS == ("auto", "pytorch", "bucketed", "triton")
    assert kernels_backend("auto") is None and kernels_backend("kernels") is None
    assert kernels_backend("loop") == "pytorch" and kernels_backend("padded") == "bucketed"
    with pytest.raises(ValueError, match="attention backend 'magic' must be one of"):
        kernels_backend("magic")


def test_config_accepts_exactly_the_model_backend_names():
    from gem.model.config import ATTENTION_BACKENDS

    assert set(ATTENTION_BACKENDS) == set(BACKENDS) | set(LEGACY_BACKENDS)


@pytest.mark.parametrize("form", ["softmax", "gdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_backends_agree(form, causal):
    gen = torch.Generator().manual_seed(0)
    offsets = offsets_from_lengths(torch.tensor([3, 0, 5, 1]))
    q, k, v = (torch.randn(9, 2, 4, generator=gen) for _ in range(3))
    ref = jagged_self_attention(q, k, v, offsets, max_seq_len=8, form=form, causal=causal,
                                backend="pytorch")
    for backend in ("auto", "bucketed"):
        out = jagged_self_attention(q, k, v, offsets, max_seq_len=8, form=form, causal=causal,
                                    backend=backend)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
