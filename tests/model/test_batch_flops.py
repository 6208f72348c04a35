"""BatchFlops prices a batch from its lengths exactly as the FLOP counter counts it."""

import pytest
import torch

from gem.data.batch import synthetic_batch
from gem.model import build_model, load_model_config
from gem.model.batch_flops import BatchFlops, flops_pricer
from gem.model.flops import batch_forward_flops
from gem.training.data import default_synthetic_spec


@pytest.mark.parametrize("overrides", [[], ["pyramid=[5,3]", "target_attention=true", "causal=true"]])
def test_priced_flops_equal_counted_flops(overrides):
    spec = default_synthetic_spec(max_seq_len=12)
    model = build_model(load_model_config("tiny", overrides), spec)
    probe = synthetic_batch(spec, 16, seed=50, mean_len=6)
    flops = flops_pricer(model, probe)
    assert isinstance(flops, BatchFlops) and flops.counted[0][1] == batch_forward_flops(model, probe)
    for seed, (size, mean) in enumerate([(1, 0.0), (7, 2.0), (33, 11.0), (64, 30.0)]):
        batch = synthetic_batch(spec, size, seed=seed, mean_len=mean)
        assert flops.forward(batch) == batch_forward_flops(model, batch)
    assert flops.of_lengths(torch.tensor([12, 12])) > flops.of_lengths(torch.tensor([3, 3]))
