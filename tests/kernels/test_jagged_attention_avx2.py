"""The AVX2 kernel (kernels/avx2) against the float64 reference, and where it is used.

It builds on first use with the machine's C compiler. On x86-64 with AVX2/FMA and a
compiler (CI's machines) it must build: a broken build fails here instead of quietly
leaving the work to torch's flash kernels.
"""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from jagged_attention_cases import assert_close_to_reference, make_case, reference, relative_error, run_backend
from torch.utils._python_dispatch import TorchDispatchMode

import kernels.avx2.function as native_function
import kernels.avx2.loader as native
import kernels.bucketed.bucketed_jagged_attention as bucketed_module
from kernels.attention import jagged_attention
from kernels.attention_spec import Spec

FP32_TOLERANCE = 2e-5
CAN_BUILD = (platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma"} <= native._cpu_flags()
             and native._compiler() is not None)
pytestmark = pytest.mark.skipif(not CAN_BUILD, reason="needs x86-64 with AVX2/FMA and a C compiler")
REPO = Path(__file__).resolve().parents[2]


def test_builds_on_this_machine():
    assert native.library() is not None, native.unavailable_reason()


def _native_share(case) -> tuple[list[int], int]:
    """(kept lengths the AVX2 kernel takes, number of flash chunks) for a case."""
    spec = Spec(case.options["max_seq_len"])
    problem = bucketed_module._Problem(case.q, case.offsets, None, None, spec, fused=True)
    taken = [] if problem.native is None else [n for n in problem.native[1].tolist() if n > 0]
    return taken, len(problem.chunks)


@pytest.fixture(params=["function", "op"])
def path(request, monkeypatch):
    """Whole calls the kernel takes run as an autograd Function in eager mode ("function");
    "op" switches that off, as torch.compile and FLOP counting do, to test the op's route."""
    if request.param == "op":
        monkeypatch.setattr(native_function, "takes_whole_call", lambda *args: False)
    return request.param


@pytest.mark.parametrize("dim", [16, 32, 64, 128, 8, 12, 24, 40])
def test_op_matches_reference(generator, dim, path):
    """Lengths around every tile edge (6 rows, 8 and 16 columns), empty and 1-token
    sequences, through the public op (forward and backward). Head dims that are multiples
    of 8 are padded to 16 inside the kernel, others to 8 before it."""
    lengths = [0, 1, 2, 5, 6, 7, 13, 16, 17, 0, 40, 97]
    case = make_case(generator, lengths, heads=3, dim=dim)
    assert _native_share(case) == ([n for n in lengths if n > 0], 0)
    assert ("NativeSoftmaxAttention" in _grad_fn_name(case)) == (path == "function")
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)


def _grad_fn_name(case) -> str:
    leaves = case.leaves(torch.float32)
    out = jagged_attention(*leaves[:3], case.offsets, backend="bucketed", **case.options)
    return type(out.grad_fn).__name__


def test_whole_calls_skip_the_op_layer_with_the_same_result(generator, monkeypatch):
    case = make_case(generator, [3, 0, 17, 40], heads=2, dim=16)
    assert "NativeSoftmaxAttention" in _grad_fn_name(case)
    grad_out = torch.randn(case.q.shape[0], 2, 16, generator=generator)
    fast = run_backend(case, "bucketed", grad_out)
    monkeypatch.setattr(native_function, "takes_whole_call", lambda *args: False)
    assert "NativeSoftmaxAttention" not in _grad_fn_name(case)
    through_op = run_backend(case, "bucketed", grad_out)
    assert torch.equal(fast[0], through_op[0])  # the same kernel, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(fast[1], through_op[1]))


def test_calls_the_kernel_does_not_take_whole_go_through_the_op(generator, monkeypatch):
    truncated = make_case(generator, [3, 30], heads=2, dim=16, max_seq_len=10)
    causal = make_case(generator, [3, 30], heads=2, dim=16, causal=True)
    monkeypatch.setattr(bucketed_module, "NATIVE_MAX_LEN", 20)
    too_long = make_case(generator, [3, 30], heads=2, dim=16)
    for case in (truncated, causal, too_long):
        assert "NativeSoftmaxAttention" not in _grad_fn_name(case)
    seen = _OpNames()
    with seen:  # a dispatch mode (FLOP counting) sees the op, which it can count
        _grad_fn_name(make_case(generator, [3, 8], heads=2, dim=16))
    assert "gem_kernels.jagged_attention_fwd.default" in seen.names


class _OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


def test_row_blocks_and_padded_strides(generator):
    """Sequences long enough for several row blocks of scores (and a multiple of 32, whose
    buffers get padded strides), with a given scale."""
    case = make_case(generator, [300, 3, 640, 31], heads=2, dim=64, scale=0.3)
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)


@pytest.mark.parametrize("dim", [16, 8])
def test_longer_sequences_go_to_flash(generator, monkeypatch, dim):
    monkeypatch.setattr(bucketed_module, "NATIVE_MAX_LEN", 20)
    case = make_case(generator, [3, 50, 0, 20, 21, 7], heads=2, dim=dim)
    taken, chunks = _native_share(case)
    assert taken == [3, 20, 7] and chunks >= 1
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)


@pytest.mark.parametrize("dim", [16, 8])
def test_truncated_tokens_get_zero(generator, dim):
    case = make_case(generator, [12, 4, 30], heads=2, dim=dim, max_seq_len=10)
    grad_out = torch.randn(case.q.shape[0], 2, dim, generator=generator)
    out, grads = run_backend(case, "bucketed", grad_out)
    dropped = torch.cat([torch.arange(0, 2), torch.arange(16, 36)])  # first 2 and first 20
    assert out[dropped].abs().max() == 0 and all(g[dropped].abs().max() == 0 for g in grads)
    assert_close_to_reference(case, "bucketed", FP32_TOLERANCE, generator)


def test_bf16_inputs_compute_in_float32(generator):
    case = make_case(generator, [9, 0, 33, 2], heads=2, dim=32, dtype=torch.bfloat16)
    assert_close_to_reference(case, "bucketed", 1e-2, generator)


@pytest.mark.parametrize("poisoned", ["q", "k", "v", "grad"])
def test_non_finite_token_stays_in_its_sequence(generator, poisoned):
    case = make_case(generator, [3, 5, 1, 7, 2], heads=2, dim=16)
    if poisoned != "grad":
        getattr(case, poisoned)[0] = float("nan")
    grad_out = torch.randn(case.q.shape[0], 2, 16, generator=generator)
    if poisoned == "grad":
        grad_out[0] = float("nan")
    out, grads = run_backend(case, "bucketed", grad_out)
    others = slice(3, None)
    assert torch.isfinite(out[others]).all()
    assert all(torch.isfinite(g[others]).all() for g in grads)


def _direct(q, k, v, grad_out, lengths, scale):
    starts = torch.cumsum(lengths, 0) - lengths
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2])
    lse = torch.empty(q.shape[0], q.shape[1])
    native.forward(q, k, v, out, lse, starts, lengths, scale)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    native.backward(grad_out, q, k, v, out, lse, *grads, starts, lengths, scale)
    return out, lse, grads


def test_value_dim_may_differ_and_lse_is_the_log_sum_exp(generator):
    lengths = torch.tensor([4, 0, 19, 1])
    tokens, heads, scale = int(lengths.sum()), 2, 0.2
    q, k = (torch.randn(tokens, heads, 24, generator=generator) for _ in range(2))  # padded to 32
    v, grad_out = (torch.randn(tokens, heads, 8, generator=generator) for _ in range(2))
    out, lse, grads = _direct(q, k, v, grad_out, lengths, scale)
    first = 0
    for n in lengths.tolist():
        rows = slice(first, first + n)
        leaves = [x[rows].double().transpose(0, 1).requires_grad_() for x in (q, k, v)]
        scores = leaves[0] @ leaves[1].transpose(1, 2) * scale
        want = torch.softmax(scores, -1) @ leaves[2]
        want.backward(grad_out[rows].double().transpose(0, 1))
        torch.testing.assert_close(out[rows].double(), want.transpose(0, 1).detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse[rows].double(), torch.logsumexp(scores, -1).t().detach(),
                                   rtol=1e-5, atol=1e-6)
        for got, leaf in zip(grads, leaves):
            torch.testing.assert_close(got[rows].double(), leaf.grad.transpose(0, 1), rtol=1e-4, atol=1e-5)
        first += n


def test_thread_count_does_not_change_a_bit(generator):
    """Each (sequence, head) is computed whole by one thread, so results are identical."""
    lengths = torch.tensor([70, 3, 129, 0, 44, 8])
    q, k, v, grad_out = (torch.randn(int(lengths.sum()), 4, 16, generator=generator) for _ in range(4))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _direct(q, k, v, grad_out, lengths, 0.25)
        torch.set_num_threads(2)
        two = _direct(q, k, v, grad_out, lengths, 0.25)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip([one[0], one[1], *one[2]], [two[0], two[1], *two[2]]):
        assert torch.equal(a, b)


def _summand_norms(case, grad_out) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token, in float64, the size of the terms dq and dk are sums of:
    scale * sum_j P_ij |dP_ij| |k_j| (and the same over i with |q_i|)."""
    scale, bounds = case.options["scale"], case.offsets.tolist()
    q, k, v, go = (x.double() for x in (case.q, case.k, case.v, grad_out))
    tq, tk = torch.zeros_like(q), torch.zeros_like(k)
    for s, e in zip(bounds[:-1], bounds[1:]):
        for h in range(q.shape[1]):
            w = torch.softmax(scale * q[s:e, h] @ k[s:e, h].T, -1) * (go[s:e, h] @ v[s:e, h].T).abs()
            tq[s:e, h], tk[s:e, h] = scale * w @ k[s:e, h].abs(), scale * w.T @ q[s:e, h].abs()
    return tq, tk


def test_large_scores_do_not_overflow(generator):
    """Scores far outside exp's float32 range (softmax of nearly one-hot rows). The output and
    dv are checked against the float64 reference as everywhere. dq and dk are sums of terms
    P_ij (dP_ij - rowsum) that cancel when a row is one-hot, so dq itself can be 1e5 times
    smaller than its terms and no float32 computation gets it to 1e-4 of its own size (the
    PyTorch backend in float32 reaches 0.14 on some seeds): their error is measured against
    the size of the terms instead (max 4.9e-6 over 300 seeds, PyTorch float32 5.5e-6)."""
    case = make_case(generator, [5, 24, 9], heads=1, dim=16, scale=40.0)
    grad_out = torch.randn(case.q.shape[0], 1, case.v.shape[2], generator=generator)
    expected, (dq_ref, dk_ref, dv_ref) = reference(case, grad_out)
    out, (dq, dk, dv) = run_backend(case, "bucketed", grad_out)
    for got in (out, dq, dk, dv):
        assert torch.isfinite(got).all()
    assert relative_error(out, expected) < 1e-4 and relative_error(dv, dv_ref) < 1e-4
    tq, tk = _summand_norms(case, grad_out)
    assert (dq.double() - dq_ref).norm() / tq.norm() < 1e-4
    assert (dk.double() - dk_ref).norm() / tk.norm() < 1e-4


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_library_is_cached_under_the_digest_of_its_inputs(tmp_path):
    """Built once per (source, flags, compiler) into a directory named by their digest;
    a changed source is a new digest, never the old file found by path."""
    code = ("import kernels.avx2.loader as n, pathlib; assert n.library() is not None; "
            "print(*sorted(p.parent.name for p in pathlib.Path(n.cache_dir()).glob('*/*.so')))")
    first = _python(code, GEM_KERNEL_CACHE=str(tmp_path))
    assert first.returncode == 0, first.stderr
    digests = first.stdout.split()
    assert len(digests) == 1 and len(digests[0]) == 20
    again = _python(code, GEM_KERNEL_CACHE=str(tmp_path))
    assert again.stdout.split() == digests  # reused, not rebuilt
    changed = tmp_path / "src" / "jagged_softmax_attention.c"
    changed.parent.mkdir()
    changed.write_text(native.SOURCE.read_text() + "\n/* changed */\n")
    for header in native.SOURCE.parent.glob("*.h"):  # what the source includes
        (changed.parent / header.name).write_text(header.read_text())
    code_changed = code.replace("assert", f"n.SOURCE = pathlib.Path({str(changed)!r}); assert", 1)
    third = _python(code_changed, GEM_KERNEL_CACHE=str(tmp_path))
    assert third.returncode == 0, third.stderr
    assert len(third.stdout.split()) == 2 and digests[0] in third.stdout.split()


def test_kernels_run_on_the_process_openmp_threads_or_build_serial(tmp_path):
    """Built with OpenMP, a kernel's threads are torch's own (the libgomp the process has
    loaded, no second copy); a compiler without OpenMP builds it serial, same results."""
    code = ("import torch, pathlib, kernels.avx2.loader as n\n"
            "{patch}"
            "lib = n.library(); assert lib is not None\n"
            "maps = {{line.split()[-1] for line in open('/proc/self/maps') if 'libgomp' in line}}\n"
            "g = torch.Generator().manual_seed(0)\n"
            "q = torch.randn(300, 2, 16, generator=g)\n"
            "out, lse = torch.empty_like(q), torch.empty(300, 2)\n"
            "torch.set_num_threads(2)\n"
            "n.forward(q, q, q, out, lse, torch.tensor([0, 100, 140]), torch.tensor([100, 40, 160]), 0.25)\n"
            "print(len(maps), float(out.double().sum()), float(lse.double().sum()))")
    threaded = _python(code.format(patch=""), GEM_KERNEL_CACHE=str(tmp_path / "omp"))
    assert threaded.returncode == 0, threaded.stderr
    serial = _python(code.format(patch="n.THREADING = (('-fno-such-openmp-flag',), ())\n"),
                     GEM_KERNEL_CACHE=str(tmp_path / "serial"))
    assert serial.returncode == 0, serial.stderr
    assert threaded.stdout.split()[0] == "1"  # torch's libgomp only
    assert threaded.stdout.split()[1:] == serial.stdout.split()[1:]
    assert len(list((tmp_path / "serial").glob("*/*.so"))) == 1


def test_switch_off_leaves_the_work_to_flash():
    code = ("import kernels.avx2.loader as n; print(n.library() is None, n.unavailable_reason())")
    result = _python(code, GEM_NATIVE_ATTENTION="0")
    assert result.stdout.split()[0] == "True" and "GEM_NATIVE_ATTENTION=0" in result.stdout



def test_scores_all_far_below_zero(generator):
    """Every score of a row near -100 and below: the row maximum must come from the keys
    alone (padding columns score 0 and would underflow every weight if counted)."""
    lengths = [5, 11, 3]
    case = make_case(generator, lengths, heads=1, dim=16, scale=1.0)
    tokens = sum(lengths)
    case.q = torch.ones(tokens, 1, 16)
    position = torch.cat([torch.arange(n) for n in lengths]).float()
    case.k = -(6.0 + 0.7 * position).view(-1, 1, 1).expand(tokens, 1, 16).contiguous()
    # dq and dk are ill-conditioned here in float32 on every backend (torch's flash
    # kernels and the pytorch backend: 1e-2 to 6e-2 relative error); out and dv are not.
    assert_close_to_reference(case, "bucketed", 1e-4, generator, tolerances={"dq": 0.2, "dk": 0.2})


def test_unwritable_cache_falls_back_with_a_warning(tmp_path):
    """A machine that should run the kernel but cannot build it warns and still computes."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = ("import warnings, torch; warnings.simplefilter('always')\n"
            "import kernels.avx2.loader as n\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    assert n.library() is None\n"
            "print(caught[0].message)\n"
            "from kernels import jagged_attention\n"
            "q = torch.randn(7, 2, 16)\n"
            "out = jagged_attention(q, q, q, torch.tensor([0, 3, 7]), max_seq_len=4)\n"
            "print(bool(torch.isfinite(out).all()))")
    result = _python(code, GEM_KERNEL_CACHE=str(blocker / "cache"))
    assert result.returncode == 0, result.stderr
    assert "AVX2 attention kernel is unavailable" in result.stdout and result.stdout.split()[-1] == "True"
