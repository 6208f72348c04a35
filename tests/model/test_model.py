import math

import pytest
import torch

from gem.data.batch import synthetic_batch
from gem.model import (
    GEM,
    DLRMBaseline,
    ModelConfig,
    build_model,
    count_parameters,
    forward_flops_per_example,
    load_model_config,
    multitask_loss,
)
from gem.model.attention import jagged_self_attention
from gem.model.jagged import gather_recent, keep_recent, offsets_of, prepend_tokens
from gem.model.wukong import WukongLayer


@pytest.mark.parametrize("arch", ["gem", "dlrm"])
def test_forward_shapes_loss_and_backward(spec, arch):
    cfg = load_model_config("tiny", [f"arch={arch}"])
    model = build_model(cfg, spec)
    assert isinstance(model, GEM if arch == "gem" else DLRMBaseline)
    batch = synthetic_batch(spec, 12, mean_len=6.0)
    out = model(batch, all_surfaces=True)
    assert out.logits.shape == (12, 2)
    assert out.all_logits.shape == (12, len(spec.surfaces), 2)
    own = out.all_logits[torch.arange(12), batch.surface]
    torch.testing.assert_close(own, out.logits)
    loss, per_task = multitask_loss(out, batch.labels)
    assert per_task.shape == (2,) and torch.isfinite(loss)
    loss.backward()
    # DDP needs a gradient for every parameter.
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_conversion_is_click_then_convert(spec):
    model = build_model(load_model_config("tiny"), spec).eval()
    out = model(synthetic_batch(spec, 8))
    p_click = torch.sigmoid(out.cond_logits[:, 0])
    p_cond = torch.sigmoid(out.cond_logits[:, 1])
    probs = out.probabilities()
    torch.testing.assert_close(probs[:, 0], p_click)
    torch.testing.assert_close(probs[:, 1], p_click * p_cond, rtol=1e-4, atol=1e-6)
    assert bool((probs[:, 1] <= probs[:, 0]).all())


def test_encode_is_side_separated(spec):
    """The item embedding depends only on item keys; the user one not on item keys."""
    model = build_model(load_model_config("tiny"), spec).eval()
    batch = synthetic_batch(spec, 6)
    enc = model.encode(batch)
    assert enc.user.shape == (6, 16) and enc.item.shape == (6, 16) and enc.joint.shape == (6, 64)
    values = batch.sparse.values().clone()
    values[2 * 6: 3 * 6] = (values[2 * 6: 3 * 6] + 1) % 300  # change item_id only
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    batch.sparse = KeyedJaggedTensor.from_lengths_sync(batch.sparse.keys(), values, batch.sparse.lengths())
    enc2 = model.encode(batch)
    torch.testing.assert_close(enc.user, enc2.user)
    assert not torch.allclose(enc.item, enc2.item)


def test_empty_histories_and_pyramid(spec):
    cfg = load_model_config("tiny", ["pyramid=[4,2]", "attention_form=gdpa"])
    model = build_model(cfg, spec)
    batch = synthetic_batch(spec, 5, mean_len=0.0)
    assert int(batch.sequence.lengths().sum()) == 0
    out = model(batch)
    assert torch.isfinite(out.logits).all()
    long_batch = synthetic_batch(spec, 5, mean_len=12.0)
    assert torch.isfinite(model(long_batch).logits).all()


def test_history_matters_and_padding_free(spec):
    """Examples are independent: an example's output doesn't depend on its batch mates."""
    model = build_model(load_model_config("tiny"), spec).eval()
    batch = synthetic_batch(spec, 6, mean_len=8.0)
    full = model(batch).logits
    from gem.training.data import slice_batch

    part = model(slice_batch(batch, 2, 5)).logits
    torch.testing.assert_close(part, full[2:5], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["softmax", "gdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_attention_matches_loop(form, causal):
    gen = torch.Generator().manual_seed(0)
    offsets = offsets_of(torch.tensor([3, 0, 5, 1]))
    q, k, v = (torch.randn(9, 2, 4, generator=gen, requires_grad=True) for _ in range(3))
    ref = jagged_self_attention(q, k, v, offsets, max_seq_len=8, form=form, causal=causal, backend="loop")
    out = jagged_self_attention(q, k, v, offsets, max_seq_len=8, form=form, causal=causal, backend="padded")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    g_ref = torch.autograd.grad(ref.sum(), (q, k, v))
    g_out = torch.autograd.grad(out.sum(), (q, k, v))
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["softmax", "gdpa"])
def test_kernels_backend_matches_reference(form):
    pytest.importorskip("kernels.attention")
    gen = torch.Generator().manual_seed(1)
    offsets = offsets_of(torch.tensor([4, 0, 7, 2]))
    q, k, v = (torch.randn(13, 2, 8, generator=gen) for _ in range(3))
    ref = jagged_self_attention(q, k, v, offsets, max_seq_len=8, form=form, backend="loop")
    out = jagged_self_attention(q, k, v, offsets, max_seq_len=8, form=form, backend="kernels")
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_in,fm_tokens,lcb_tokens", [(14, 6, 4), (10, 6, 4), (7, 0, 5), (7, 5, 0), (5, 0, 5)])
def test_wukong_layer_fused_token_maps_match_separate_blocks(num_in, fm_tokens, lcb_tokens):
    """One matmul for Y, the LCB and the residual computes FMB + LCB + residual."""
    torch.manual_seed(0)
    layer = WukongLayer(num_in, fm_tokens, lcb_tokens, dim=8, rank=3, hidden=16)
    x = torch.randn(4, num_in, 8, requires_grad=True)
    parts = [layer.fmb(x)] if layer.fmb is not None else []
    parts += [layer.lcb(x)] if layer.lcb is not None else []
    skip = x if layer.residual is None else layer.residual(x)
    expected = layer.norm(torch.cat(parts, dim=1) + skip)
    out = layer(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    params = [x, *layer.parameters()]
    grads = torch.autograd.grad(out.square().sum(), params)
    for got, want in zip(grads, torch.autograd.grad(expected.square().sum(), params)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_jagged_helpers():
    offsets = offsets_of(torch.tensor([2, 0, 3]))
    values = torch.arange(5, dtype=torch.float32)[:, None]
    out, new_off = prepend_tokens(values, offsets, torch.full((3, 1, 1), -1.0))
    assert new_off.tolist() == [0, 3, 4, 8]
    assert out[:, 0].tolist() == [-1, 0, 1, -1, -1, 2, 3, 4]
    kept, kept_off = keep_recent(out, new_off, 1, 2)
    assert kept_off.tolist() == [0, 3, 4, 7] and kept[:, 0].tolist() == [-1, 0, 1, -1, -1, 3, 4]
    recent = gather_recent(kept, kept_off, 1, 3)[..., 0]
    assert recent.tolist() == [[0, 0, 1], [0, 0, 0], [0, 3, 4]]


def test_parameter_and_flop_counts(spec):
    model = build_model(load_model_config("tiny"), spec)
    counts = count_parameters(model)
    assert counts["embedding"] == 16 * (200 + 8 + 300 + 20 + 300 + 4)
    assert counts["total"] == counts["embedding"] + counts["dense"]
    flops = forward_flops_per_example(model, batch_size=8)
    # At least the matmuls of the trunk's first layer, per example.
    trunk_in = model.heads.trunk[0].in_features
    assert flops > 2 * trunk_in * 64
    assert math.isfinite(flops)


def test_config_errors_carry_value_and_rule(spec):
    with pytest.raises(ValueError, match="attention_form='relu'"):
        ModelConfig(attention_form="relu").validate()
    with pytest.raises(ValueError, match=r"pyramid=\[4\] must list one token budget per layer"):
        ModelConfig(num_layers=2, pyramid=[4]).validate()


@pytest.mark.parametrize("preset", ["tiny", "small", "base", "large"])
def test_presets_load(preset):
    cfg = load_model_config(preset)
    assert cfg.embedding_dim >= 16 and cfg.num_layers >= 1


def test_heads_and_loss_take_the_click_task_alone():
    """Data without conversions: a spec with tasks ["click"] gives (B, 1) logits, a finite
    loss and the (2,) per-task losses the trainer logs (conversion 0)."""
    import dataclasses

    from gem.data.batch import FeatureSpec, synthetic_batch
    from gem.model.heads import multitask_loss

    spec = FeatureSpec(sparse={"user_id": 50, "item_id": 60}, sequence={"seq_item_id": 60, "seq_action": 3},
                       dense=["a", "b"], max_seq_len=16, surfaces=["search"], tasks=["click"])
    model = build_model(load_model_config("tiny"), spec)
    batch = synthetic_batch(spec, 8)
    out = model(batch, all_surfaces=True)
    assert out.logits.shape == (8, 1) and out.all_logits.shape == (8, 1, 1)
    loss, per_task = multitask_loss(out, batch.labels)
    assert torch.isfinite(loss) and per_task.shape == (2,) and per_task[1] == 0
    assert dataclasses.asdict(spec)["surfaces"] == ["search"]


@pytest.mark.parametrize("arch", ["gem", "dlrm"])
def test_first_order_weights_start_at_zero_and_learn_per_id_biases(spec, arch):
    from gem.training.distributed import attach_embedding_optimizer

    plain = build_model(load_model_config("tiny", [f"arch={arch}"]), spec)
    model = build_model(load_model_config("tiny", [f"arch={arch}", "first_order=true"]), spec)
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all("first_order_ebc" in k for k in missing)
    batch = synthetic_batch(spec, 12, mean_len=6.0)
    first = model.inputs.sparse.first_order(batch)
    assert first.shape == (12,) and torch.count_nonzero(first) == 0  # zero at init: the same model as without
    torch.testing.assert_close(model(batch).logits, plain(batch).logits)
    counts = count_parameters(model)
    assert counts["embedding"] == count_parameters(plain)["embedding"] + 4 * (200 + 8 + 300 + 20)
    attach_embedding_optimizer(model, 0.1)
    model(batch).logits[:, 0].sum().backward()  # a step that lowers every click logit: each seen id's weight falls
    after = model.inputs.sparse.first_order(batch)
    assert (after < 0).all()
    user_table = model.inputs.sparse.first_order_ebc.embedding_bags["w_user_id"].weight
    seen = batch.sparse["user_id"].values().unique()
    unseen = torch.ones(user_table.shape[0], dtype=torch.bool)
    unseen[seen] = False
    assert torch.count_nonzero(user_table[unseen]) == 0 and torch.count_nonzero(user_table[seen]) > 0


def test_target_attention_token_reads_the_history_for_the_target(spec):
    """model.target_attention: one more summary token, the history attended by a query
    from the target item's embedding; every parameter learns."""
    from gem.model.jagged import target_pool

    cfg = load_model_config("tiny", ["target_attention=true"])
    model = build_model(cfg, spec)
    plain = build_model(load_model_config("tiny"), spec)
    assert model.layers[-1].summary.num_tokens == plain.layers[-1].summary.num_tokens + 1
    batch = synthetic_batch(spec, 8, mean_len=6.0)
    loss, _ = multitask_loss(model(batch), batch.labels)
    loss.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    # target_pool: a softmax over each sequence's own tokens only; empty sequences give 0
    values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    offsets = torch.tensor([0, 2, 2, 3])
    pooled = target_pool(values, offsets, torch.tensor([[50.0, 0.0], [1.0, 1.0], [1.0, 0.0]]))
    torch.testing.assert_close(pooled, torch.tensor([[1.0, 0.0], [0.0, 0.0], [5.0, 5.0]]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["gem", "dlrm"])
@pytest.mark.parametrize("wide", [False, True])
def test_counters_are_one_token_per_key_kind(spec, arch, wide):
    """Dense features named cnt_<kind>_<horizon>_<stat> become one token per kind (batch-
    normalised, a small MLP); with counter_wide also a linear term of the click logit.
    Each kind's token moves the prediction; every parameter gets a gradient."""
    import dataclasses

    from gem.data.batch import dense_groups
    from gem.features.counters import COUNTER_FEATURES

    counted = dataclasses.replace(spec, dense=list(spec.dense) + list(COUNTER_FEATURES))
    assert [len(g) for g in dense_groups(counted.dense)] == [len(spec.dense), 12, 12, 12, 12, 12, 2]
    plain = build_model(load_model_config("tiny", [f"arch={arch}"]), spec)
    model = build_model(load_model_config("tiny", [f"arch={arch}", f"counter_wide={str(wide).lower()}",
                                                 f"counter_norm={str(wide).lower()}"]), counted)
    assert model.inputs.num_tokens == plain.inputs.num_tokens + 6
    batch = synthetic_batch(counted, 16)
    batch.dense = torch.randn(16, len(counted.dense))
    out = model(batch)
    loss, _ = multitask_loss(out, batch.labels)
    loss.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    model.eval()
    item = counted.dense.index("cnt_item_all_ctr_lift")
    moved = batch.dense.clone()
    moved[:, item] += 3.0
    before = model(batch).logits
    batch.dense = moved
    assert not torch.allclose(model(batch).logits, before)
    assert (model.inputs.counter_wide is not None) == wide


def test_pooled_sparse_embeddings_are_the_keyed_values_in_spec_order(spec):
    """SparseArch reads the collection's values as (B, F, D) when they hold the keys in spec
    order, and falls back to the keyed split otherwise: both give each key's embedding."""
    from gem.model.embeddings import SparseArch

    torch.manual_seed(0)
    arch = SparseArch(spec, dim=8)
    batch = synthetic_batch(spec, 6, seed=1)
    pooled = arch.ebc(batch.sparse)
    assert list(pooled.keys()) == arch.sparse_keys  # the view applies here
    by_key = pooled.to_dict()
    want = torch.stack([by_key[k] for k in arch.sparse_keys], dim=1)
    torch.testing.assert_close(arch._stacked(pooled), want, rtol=0, atol=0)
    arch.sparse_keys = arch.sparse_keys[::-1]  # another order: the keyed path
    torch.testing.assert_close(arch._stacked(pooled), want.flip(1), rtol=0, atol=0)
