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


def test_kept_coefficients_are_reused_and_a_stale_set_is_refitted(tmp_path):
    import json

    from gem.model.batch_flops import fit_key

    spec = default_synthetic_spec(max_seq_len=12)
    model = build_model(load_model_config("tiny"), spec)
    probe, other = synthetic_batch(spec, 16, seed=1, mean_len=5), synthetic_batch(spec, 9, seed=2, mean_len=9)
    cache = tmp_path / "batch_flops.json"
    first = flops_pricer(model, probe, cache)
    kept = json.loads(cache.read_text())
    assert list(kept) == [fit_key(model)]
    again = flops_pricer(model, probe, cache)
    assert again.coefficients.tolist() == kept[fit_key(model)] and again.forward(other) == first.forward(other)
    cache.write_text(json.dumps({fit_key(model): [1.0] * len(kept[fit_key(model)])}))  # e.g. the model code changed
    assert flops_pricer(model, probe, cache).forward(other) == batch_forward_flops(model, other)
