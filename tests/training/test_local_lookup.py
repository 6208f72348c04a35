"""A world of one looks its tables up through their fbgemm kernels directly
(gem/training/local_lookup.py): the same training as torchrec's distributed path."""

import copy

import pytest
import torch

from gem.data.batch import FeatureSpec, synthetic_batch
from gem.model import build_model
from gem.training import local_lookup
from gem.training.config import load_train_config
from gem.training.distributed import attach_embedding_optimizer, close_distributed, init_distributed, shard_model
from gem.training.step import build_dense_optimizer, train_step

SPEC = FeatureSpec(sparse={"user_id": 200, "country": 8, "item_id": 300, "advertiser_id": 20},
                   sequence={"hist_item_id": 300, "hist_event_type": 4}, dense=["user_age_days", "item_ctr"],
                   max_seq_len=16)
SORTED = FeatureSpec(sparse=dict(sorted(SPEC.sparse.items())), sequence=dict(sorted(SPEC.sequence.items())),
                     dense=SPEC.dense, max_seq_len=16)


@pytest.fixture
def world_of_one():
    env = init_distributed("cpu")
    yield env
    close_distributed()


def _sharded(model, env, **kw):
    attach_embedding_optimizer(model, 0.05)
    return shard_model(model, env, **kw)


def _calls(module) -> list[int]:
    calls = [0]
    module.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("spec, ec_sharding", [(SPEC, "table_wise"), (SORTED, "table_wise"), (SPEC, "row_wise")])
def test_direct_lookups_train_like_torchrec(world_of_one, spec, ec_sharding):
    _, model_cfg = load_train_config("tiny")
    torch.manual_seed(0)
    model = build_model(model_cfg, spec)
    twin = copy.deepcopy(model)
    direct = _sharded(model, world_of_one, ec_sharding=ec_sharding)
    routed = _sharded(twin, world_of_one, ec_sharding=ec_sharding)
    arch, routed_arch = direct.module.inputs.sparse, routed.module.inputs.sparse
    routed_arch.direct = None  # torchrec's path
    assert arch.direct is not None and routed_arch.direct is None
    direct_calls, routed_calls = _calls(arch.ebc), _calls(routed_arch.ec)
    opts = [build_dense_optimizer(m, 3e-3, 0.0, [0.9, 0.999])[0] for m in (direct, routed)]
    for step in range(4):
        batch = synthetic_batch(spec, 64, seed=step)
        losses = [train_step(m, batch, opt).loss for m, opt in zip((direct, routed), opts)]
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    assert direct_calls[0] == 0 and routed_calls[0] == 4  # each went its own way
    got, want = direct.state_dict(), routed.state_dict()
    assert got.keys() == want.keys()
    for key in want:  # the tables, updated by the fused row-wise Adagrad in backward, included
        a, b = (t.local_shards()[0].tensor if hasattr(t, "local_shards") else t for t in (got[key], want[key]))
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=key)
    assert any("ebc" in k for k in want) and any(".ec." in k for k in want)


def test_no_direct_lookups_across_ranks_or_for_other_keys(world_of_one):
    _, model_cfg = load_train_config("tiny")
    dmp = _sharded(build_model(model_cfg, SPEC), world_of_one)
    arch = dmp.module.inputs.sparse
    arch.direct = None
    assert local_lookup.install(dmp, world_size=2) == 0 and arch.direct is None  # ranks exchange ids
    arch.sparse_keys = [*arch.sparse_keys[:-1], "other"]  # keys the kernel has no table for
    assert local_lookup.install(dmp, world_size=1) == 0 and arch.direct is None


def test_batch_keys_in_another_order_than_the_kernel(world_of_one):
    """torchrec's plans here keep the collection's order; a kernel whose features come in
    another order gets the batch's keys permuted in and its output columns restored."""
    _, model_cfg = load_train_config("tiny")
    arch = _sharded(build_model(model_cfg, SPEC), world_of_one).module.inputs.sparse
    batch = synthetic_batch(SPEC, 8)
    order = [2, 0, 3, 1]
    keys = [arch.sparse_keys[i] for i in order]
    lookup = local_lookup.direct_lookup(arch, keys, arch.sequence_keys[::-1])
    assert lookup.pooled_lookup.order is not None and lookup.sequence_lookup.order == [1, 0]
    with torch.no_grad():
        want = arch.direct.pooled(batch.sparse)
        got = lookup.pooled(batch.sparse.permute(order))  # a batch whose keys come in that order
        torch.testing.assert_close(got, want[:, order], rtol=0, atol=0)
        seq = batch.sequence.permute([1, 0])
        torch.testing.assert_close(lookup.sequence_sum(seq, batch.sequence_age.shape[0]),
                                   arch.direct.sequence_sum(batch.sequence, batch.sequence_age.shape[0]))
