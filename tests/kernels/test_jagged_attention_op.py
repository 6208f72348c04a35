"""The custom op's plumbing: fake impls, torch.compile, backend choice, input checks."""

import importlib.util
import inspect

import pytest
import torch
from jagged_attention_cases import make_case, relative_error
from torch._subclasses.fake_tensor import FakeTensorMode

import kernels.attention_op as attention_op
import kernels.avx2.function as native_function
import kernels.bucketed.bucketed_jagged_attention as bucketed_module
from kernels import BACKEND_ENV_VAR, Backend, jagged_attention
from kernels.common import select_backend

FWD = torch.ops.gem_kernels.jagged_attention_fwd
BWD = torch.ops.gem_kernels.jagged_attention_bwd


def _op_args(case, backend):
    o = case.options
    scale = 1.0 / case.q.shape[2] ** 0.5
    return (case.q, case.k, case.v, case.offsets, o["max_seq_len"], o.get("form", "softmax"),
            o.get("causal", False), case.attn_bias, case.num_targets, o.get("activation", "silu"),
            backend, scale, 0, 0, 0.0, 0)


@pytest.mark.parametrize("backend", ["pytorch", "bucketed", "triton"])
@pytest.mark.parametrize("form", ["softmax", "gdpa", "fused_softmax"])
def test_fake_impls_match_real_outputs(generator, backend, form):
    """fused_softmax: softmax without bias, Dv == D, which the bucketed backend runs through
    torch's fused kernels (it returns a (T, H) log-sum-exp)."""
    if backend == "triton":
        pytest.importorskip("triton")
    fused = form == "fused_softmax"
    case = make_case(generator, [3, 0, 5], heads=2, dim=16, value_dim=None if fused else 32,
                     bias_radius=None if fused else 2, with_targets=True,
                     form="softmax" if fused else form)
    args = _op_args(case, backend)
    out, lse = FWD(*args)
    grad_out = torch.randn(out.shape, generator=generator)
    real_bwd = BWD(grad_out, *args[:4], out, lse, *args[4:])
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        fake_out, fake_lse = FWD(*fake_args)
        fake_bwd = BWD(mode.from_tensor(grad_out), *fake_args[:4], fake_out, fake_lse,
                       *fake_args[4:])
    for real, fake in zip((out, lse, *real_bwd), (fake_out, fake_lse, *fake_bwd)):
        assert (real.shape, real.dtype, real.stride()) == (fake.shape, fake.dtype, fake.stride())
    assert out.shape == (case.q.shape[0], 2, 16 if fused else 32)
    if fused:
        assert lse.shape == ((case.q.shape[0], 2) if backend != "pytorch" else (0,))
    else:
        assert real_bwd[3].shape == case.attn_bias.shape


@pytest.mark.parametrize("real,fake", [
    (attention_op.jagged_attention_fwd._init_fn, attention_op._jagged_attention_fwd_fake),
    (attention_op.jagged_attention_bwd._init_fn, attention_op._jagged_attention_bwd_fake),
])
def test_fake_signatures_match_real(real, fake):
    assert list(inspect.signature(real).parameters) == list(inspect.signature(fake).parameters)


@pytest.mark.parametrize("fused", [False, True])
def test_opcheck_forward_op(generator, fused):
    case = make_case(generator, [4, 6, 0, 1], heads=2, dim=16, bias_radius=None if fused else 2,
                     with_targets=True, causal=True)
    args = list(_op_args(case, "bucketed"))
    for i in (0, 1, 2, 7):
        if args[i] is not None:
            args[i] = args[i].detach().requires_grad_()
    torch.library.opcheck(FWD, tuple(args))


def test_torch_compile_traces_through_the_op(generator):
    """fullgraph=True fails on any graph break; aot_eager traces forward and backward
    through the fake impls and the registered autograd without inductor's compile time."""
    case = make_case(generator, [5, 1, 9, 0], heads=2, dim=16, bias_radius=3, with_targets=True,
                     causal=True, form="gdpa")
    grad_out = torch.randn(case.q.shape[0], 2, 16, generator=generator)

    def loss_fn(q, k, v, bias):
        out = jagged_attention(q, k, v, case.offsets, max_seq_len=8, form="gdpa", causal=True,
                               attn_bias=bias, num_targets=case.num_targets)
        return (out * grad_out).sum()

    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    eager_leaves, compiled_leaves = case.leaves(torch.float32), case.leaves(torch.float32)
    eager_loss, compiled_loss = loss_fn(*eager_leaves), compiled(*compiled_leaves)
    eager_loss.backward()
    compiled_loss.backward()
    assert relative_error(compiled_loss, eager_loss) < 1e-6
    for eager, comp in zip(eager_leaves, compiled_leaves):
        assert relative_error(comp.grad, eager.grad) < 1e-6


def test_default_backend_on_cpu_is_bucketed_and_env_var_overrides(generator, monkeypatch):
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)
    assert select_backend(torch.device("cpu")) is Backend.BUCKETED
    monkeypatch.setenv(BACKEND_ENV_VAR, "pytorch")
    assert select_backend(torch.device("cpu")) is Backend.PYTORCH
    assert select_backend(torch.device("cpu"), "bucketed") is Backend.BUCKETED  # argument wins
    assert select_backend(torch.device("cpu"), Backend.PYTORCH) is Backend.PYTORCH
    monkeypatch.delenv(BACKEND_ENV_VAR)
    assert select_backend(torch.device("cuda"), dtype=torch.float64) is Backend.BUCKETED
    if importlib.util.find_spec("triton") is not None:
        assert select_backend(torch.device("cuda"), dtype=torch.bfloat16) is Backend.TRITON


def test_dispatch_reaches_the_selected_backend(generator, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("bucketed backend called")

    monkeypatch.setattr(bucketed_module, "bucketed_forward", refuse)
    # the bucketed backend's eager route for calls its AVX2 kernel takes whole
    monkeypatch.setattr(native_function.NativeSoftmaxAttention, "apply", refuse)
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)
    case = make_case(generator, [3, 4])
    with pytest.raises(RuntimeError, match="bucketed backend called"):
        jagged_attention(case.q, case.k, case.v, case.offsets, max_seq_len=4)
    monkeypatch.setenv(BACKEND_ENV_VAR, "pytorch")
    out = jagged_attention(case.q, case.k, case.v, case.offsets, max_seq_len=4)
    assert out.shape == case.q.shape and torch.isfinite(out).all()


def test_backend_choice_errors(monkeypatch):
    with pytest.raises(ValueError, match="backend must be one of .*'cuda_magic'"):
        select_backend(torch.device("cpu"), "cuda_magic")
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        select_backend(torch.device("cpu"), "triton")


def _bad_inputs():
    q = torch.randn(6, 2, 8)
    offsets = torch.tensor([0, 2, 6])
    good = dict(q=q, k=q, v=q, offsets=offsets, max_seq_len=4)
    return [
        (dict(good, q=torch.randn(6, 16)), "q must be \\(tokens, heads, head_dim\\)"),
        (dict(good, k=torch.randn(6, 2, 4)), "k shape \\(6, 2, 4\\) must equal q shape"),
        (dict(good, v=torch.randn(5, 2, 8)), "v shape \\(5, 2, 8\\) must match"),
        (dict(good, v=q.double()), "v \\(torch.float64"),
        (dict(good, offsets=offsets.int()), "offsets must be a 1-D int64"),
        (dict(good, offsets=torch.tensor([0, 2, 5])), "offsets\\[-1\\] \\(5\\) must equal"),
        (dict(good, offsets=torch.tensor([0, 4, 2, 6])), "non-decreasing"),
        (dict(good, max_seq_len=0), "max_seq_len must be a positive int \\(not a bool\\); got 0"),
        (dict(good, max_seq_len=True), "max_seq_len must be a positive int \\(not a bool\\); got True"),
        (dict(good, offsets=torch.tensor([2, 4, 6])), "offsets\\[0\\] \\(2\\) must be 0"),
        (dict(good, attn_bias=torch.randn(2, 5, dtype=torch.float64)),
         "attn_bias must have q's dtype and device \\(torch.float32, cpu\\); got torch.float64"),
        (dict(good, scale=float("nan")), "scale must be None .* or a finite float; got nan"),
        (dict(good, max_attn_len=-1), "max_attn_len must be an int >= 0 .*; got -1"),
        (dict(good, contextual_len=1.5), "contextual_len must be an int >= 0 .*; got 1.5"),
        (dict(good, dropout_p=1.0), "dropout_p must be a float in \\[0, 1\\); got 1.0"),
        (dict(good, form="linear"), "form must be one of .*'linear'"),
        (dict(good, form="gdpa", activation="tanh"), "activation must be one of .*'tanh'"),
        (dict(good, attn_bias=torch.randn(2, 4)), "attn_bias must be \\(heads=2, 2R\\+1\\).*\\(2, 4\\)"),
        (dict(good, attn_bias=torch.randn(3, 5)), "attn_bias must be \\(heads=2"),
        (dict(good, num_targets=torch.tensor([1, 1, 1])), "num_targets must be .*\\(B=2,\\).*\\(3,\\)"),
    ]


@pytest.mark.parametrize("kwargs,message", _bad_inputs())
def test_invalid_inputs_raise_value_error_naming_the_value(kwargs, message):
    q, k, v, offsets = (kwargs.pop(name) for name in ("q", "k", "v", "offsets"))
    with pytest.raises(ValueError, match=message):
        jagged_attention(q, k, v, offsets, **kwargs)
