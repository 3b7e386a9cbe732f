"""PyTorch integration on CPU tensors (they run on the sim through DLPack): torch tensors in and
out (on the inputs' device, zero-copy views, bf16 and bshd, empty tensors), the torch.library
custom ops and their fake implementations (FakeTensorMode, torch.library.opcheck), and
torch.compile (merge_states included, and a compiled call as a fresh process's first); out= through
the out-variant ops (in place, compiled whole, refused when wrong). Autograd
is in test_torch_autograd.py, the KV cache's ops in test_torch_kv_cache.py, trainable sinks in
test_torch_sinks.py. Skipped without PyTorch (scripts/setup-deps installs it where it can). The
tests marked device_check take a `torch_device` (conftest.py) and run on CUDA tensors too where
there is a GPU: bench/device-check.sh runs those on a lent one."""
import subprocess
import sys

import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, host, reference, relative_error, tensors

torch = pytest.importorskip("torch")


@pytest.mark.device_check
def test_torch_tensors_run_where_they_live(torch_device):
    # CPU tensors on the sim, CUDA tensors on the GPU; out and lse on the inputs' device.
    q, k, v = tensors((2, 3, 9, 16), device=torch_device)
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and lse.dtype == torch.float32
    assert out.device == q.device and lse.device == q.device
    want, want_lse = reference(host(q), host(k), host(v), "bottom_right")
    assert relative_error(host(out), want) <= TOLERANCE["float32"]
    np.testing.assert_allclose(host(lse), want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.device_check
def test_views_in_and_out_without_copies(torch_device):
    # DLPack zero-copy both ways: q, k, v are strided views of one packed qkv tensor, and out= is a
    # view into a larger buffer that the call writes in place (the rest of the buffer untouched).
    packed = torch.randn(2, 11, 3, 4, 16, generator=torch.Generator().manual_seed(24)).to(torch_device)
    q, k, v = packed.unbind(2)  # [batch, seq, heads, dim] views, row stride 3 * 4 * 16
    buffer = torch.full((2, 11, 6, 16), float("nan"), device=torch_device)
    out = buffer[:, :, 1:5]  # bshd view: heads 1..4 of 6
    result = selfattn.attention(q, k, v, layout="bshd", out=out)
    assert result is out and result.data_ptr() == buffer[:, :, 1].data_ptr()
    assert torch.isnan(buffer[:, :, 0]).all() and torch.isnan(buffer[:, :, 5]).all()
    want, _ = reference(*(host(a.transpose(1, 2)) for a in (q, k, v)))
    assert relative_error(host(out.transpose(1, 2)), want) <= TOLERANCE["float32"]


def test_bf16_and_bshd():
    q, k, v = tensors((1, 7, 2, 8), torch.bfloat16, seed=1)  # [batch, seq, heads, dim]
    out = selfattn.attention(q, k, v, layout="bshd")
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    want, _ = reference(*(a.transpose(1, 2).float().numpy() for a in (q, k, v)))
    assert relative_error(out.transpose(1, 2).float().numpy(), want) <= TOLERANCE["bfloat16"]


def test_fake_implementation_gives_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from selfattn import _torch
    if _torch.ops() is None:
        pytest.skip("this PyTorch has no torch.library.custom_op")
    with FakeTensorMode():
        q = torch.empty(2, 5, 4, 8)
        k = v = torch.empty(2, 6, 2, 8)
        out, lse = torch.ops.selfattn.attention(q, k, v, None, None, "auto", None, "bshd", False, -1, -1, None, None,
                                                None, None, None, None)
        assert out.shape == q.shape and lse.shape == (2, 4, 5) and lse.dtype == torch.float32


def test_torch_compile_v_head_dim_apart():
    # out takes v's head dim (MLA's d_v != d_qk): the fake traces that shape, the op computes it.
    if not hasattr(torch, "compile"):
        pytest.skip("this PyTorch has no torch.compile")
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 2, 5, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g)
    v = torch.randn(1, 2, 6, 8, generator=g)

    def f(q, k, v):
        out = selfattn.attention(q, k, v, path="naive")
        return out * 2, out.shape[-1]

    doubled, columns = torch.compile(f, backend="eager", fullgraph=True)(q, k, v)
    assert columns == 8 and doubled.shape == (1, 2, 5, 8)
    want, _ = reference(q.numpy(), k.numpy(), v.numpy())
    assert relative_error(doubled.numpy() / 2, want) <= TOLERANCE["float32"]


@pytest.mark.device_check
def test_torch_compile(torch_device):
    if not hasattr(torch, "compile"):
        pytest.skip("this PyTorch has no torch.compile")
    q, k, v = tensors((1, 2, 5, 8), seed=2, device=torch_device)

    def f(q, k, v):
        return selfattn.attention(q, k, v, causal="top_left") * 2

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    assert relative_error(host(compiled(q, k, v)) / 2, reference(host(q), host(k), host(v), "top_left")[0]) \
        <= TOLERANCE["float32"]


def test_fake_implementation_of_varlen_and_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from selfattn import _torch
    if _torch.ops() is None:
        pytest.skip("this PyTorch has no torch.library.custom_op")
    with FakeTensorMode():
        q, k = torch.empty(9, 4, 8), torch.empty(11, 2, 8)
        cu = torch.empty(3, dtype=torch.int32)
        out, lse = torch.ops.selfattn.attention_varlen(q, k, k, cu, cu, 5, 6, None, None, "auto", None, False, -1, -1,
                                                        None, None, None, None, None, None)
        assert out.shape == q.shape and lse.shape == (4, 9) and lse.dtype == torch.float32
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(6, 2, 8, generator=g) for _ in range(3))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)

    def f(q, k, v):
        return selfattn.attention_varlen(q, k, v, cu, cu, max_seqlen_q=4, max_seqlen_k=4, softcap=3.0) * 2

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    assert torch.equal(compiled(q, k, v), f(q, k, v))


@pytest.mark.device_check
def test_fake_implementations_match_the_real_ones(torch_device):
    # torch.library.opcheck compares each op's fake with its real implementation (shapes, dtypes,
    # devices and strides: both give contiguous outputs, also for transposed inputs) and checks the
    # schema; with and without sinks, and the backward ops with and without dsinks, in both modes
    # (deterministic, which the forward ops carry to the backward ones).
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("this PyTorch has no torch.library.opcheck")
    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(1, 5, 2, 8, generator=g).to(torch_device).transpose(1, 2) for _ in range(3))  # bhsd of bshd
    bias = torch.randn(1, 2, 5, 5, generator=g).to(torch_device)
    sinks = torch.tensor([0.5, -float("inf")], device=torch_device)
    utils = ("test_schema", "test_faketensor")
    # key_start and q_offset (int32 [batch]) ride along in the calls without sinks.
    starts = torch.tensor([1], dtype=torch.int32, device=torch_device)
    for with_sinks in (None, sinks):
        positions = (starts, starts + 1) if with_sinks is None else (None, None)
        torch.library.opcheck(torch.ops.selfattn.attention.default,
                              (q, k, v, "bottom_right", None, "auto", None, "bhsd", with_sinks is None, 2, 0, 5.0, None,
                               bias, *positions, with_sinks),
                              test_utils=utils)
    out, lse = selfattn.attention(q, k, v, return_lse=True, sinks=sinks)
    for with_sinks, return_dsinks in ((None, False), (sinks, False), (sinks, True)):
        torch.library.opcheck(torch.ops.selfattn.attention_backward.default,
                              (q, k, v, out, torch.randn_like(out), lse, torch.randn_like(lse), None, None, "auto",
                               None, "bhsd", return_dsinks, -1, -1, None, None, None, starts, None, with_sinks,
                               return_dsinks),
                              test_utils=utils)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=torch_device)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]  # [total, heads, dim], strided
    for with_sinks in (None, sinks):
        torch.library.opcheck(torch.ops.selfattn.attention_varlen.default,
                              (*packed, cu, cu, 3, 3, None, None, "auto", cu[1:], with_sinks is None, -1, -1, None,
                               None, None, None, cu[1:] - 1, with_sinks),
                              test_utils=utils)
    out, lse = selfattn.attention_varlen(*packed, cu, cu, return_lse=True, sinks=sinks)
    torch.library.opcheck(torch.ops.selfattn.attention_varlen_backward.default,
                          (*packed, out, torch.randn_like(out), lse, None, cu, cu, 3, 3, "top_left", None, "auto", None,
                           True, -1, -1, None, None, None, cu[:2], None, sinks, True), test_utils=utils)
    cache = torch.randn(1, 2, 6, 8, generator=g).to(torch_device)
    for with_sinks in (None, sinks):
        torch.library.opcheck(torch.ops.selfattn.attention_with_kv_cache.default,
                              (q, cache, cache.clone(), torch.tensor([6], dtype=torch.int32, device=torch_device),
                               None, None, "bhsd", "bottom_right", None, "auto", None, None, False, None, 1, 0, -1, -1,
                               None, None, None, starts, starts, with_sinks, False, None, 0), test_utils=utils)
    # Packed: sequences of 2 and 3 new rows, [total, heads, dim], over two sequences' caches.
    caches = torch.randn(2, 2, 6, 8, generator=g).to(torch_device)
    lengths = torch.tensor([6, 4], dtype=torch.int32, device=torch_device)
    torch.library.opcheck(torch.ops.selfattn.attention_with_kv_cache.default,
                          (packed[0], caches, caches.clone(), lengths,
                           None, None, "bhsd", "bottom_right", None, "auto", None, None, False, None, 1, 0, -1, -1,
                           None, None, None, None, None, sinks, False, cu, 3), test_utils=utils)


@pytest.mark.parametrize("imports", ["torch, selfattn", "selfattn, torch"])
def test_compile_as_the_first_call_in_a_fresh_process(imports):
    # A compiled function (fullgraph, through AOTAutograd) may be the first to reach the ops, with
    # torch imported before selfattn (the ops are registered at import) or after it (the compiled
    # call registers them: Dynamo runs the registration instead of tracing it, _torch._registered).
    code = (f"import {imports}\n"
            "q, k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3))\n"
            "f = torch.compile(lambda q, k, v: selfattn.attention(q, k, v) * 2, backend='aot_eager', fullgraph=True)\n"
            "f(q, k, v).sum().backward()\n"
            "assert torch.allclose(f(q, k, v), selfattn.attention(q, k, v) * 2)\n"
            "assert q.grad is not None and bool(torch.isfinite(q.grad).all())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.device_check
def test_merge_states_is_an_op(torch_device):
    # A decode step that merges a shared prefix's result with each sequence's own compiles whole.
    g = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(1, 2, 3, 8, generator=g).to(torch_device) for _ in range(3))
    k2, v2 = (torch.randn(1, 2, 5, 8, generator=g).to(torch_device) for _ in range(2))

    def step(q):
        out_a, lse_a = selfattn.attention(q, k, v, return_lse=True)
        out_b, lse_b = selfattn.attention(q, k2, v2, return_lse=True)
        return selfattn.merge_states(out_a, lse_a, out_b, lse_b)

    out, lse = torch.compile(step, backend="eager", fullgraph=True)(q)
    want, want_lse = reference(host(q), host(torch.cat((k, k2), 2)), host(torch.cat((v, v2), 2)))
    assert relative_error(host(out), want) <= TOLERANCE["float32"]
    np.testing.assert_allclose(host(lse), want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.device_check
def test_out_writes_the_callers_tensor(torch_device):
    # out= on torch tensors goes through the out-variant ops (attention_out and so on): the values
    # of a call without out=, written into the caller's tensor (a bshd view into a larger buffer, the
    # rest untouched), which is returned (with lse as without out=).
    q, k, v = (t.transpose(1, 2) for t in tensors((2, 3, 9, 16), seed=25, device=torch_device))  # bshd
    want, want_lse = selfattn.attention(q, k, v, layout="bshd", causal="bottom_right", softcap=8.0, return_lse=True)
    buffer = torch.full((2, 9, 5, 16), float("nan"), device=torch_device)
    out = buffer[:, :, 1:4]
    for return_lse in (False, True):
        out.fill_(float("nan"))
        result = selfattn.attention(q, k, v, layout="bshd", causal="bottom_right", softcap=8.0, out=out,
                                    return_lse=return_lse)
        if return_lse:
            result, lse = result
            assert torch.equal(lse, want_lse)
        assert result is out and out.data_ptr() == buffer[:, :, 1].data_ptr() and torch.equal(out, want)
        assert torch.isnan(buffer[:, :, 0]).all() and torch.isnan(buffer[:, :, 4]).all()
    assert relative_error(host(want.transpose(1, 2)), reference(*(host(a.transpose(1, 2)) for a in (q, k, v)),
                                                                "bottom_right", softcap=8.0)[0]) <= TOLERANCE["float32"]

    packed = [t[0] for t in (q, k, v)]  # [total = 9, heads, dim] views
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=torch_device)
    want, want_lse = selfattn.attention_varlen(*packed, cu, cu, causal="top_left", return_lse=True)
    out = torch.full_like(packed[0], float("nan"))
    result, lse = selfattn.attention_varlen(*packed, cu, cu, causal="top_left", return_lse=True, out=out)
    assert result is out and torch.equal(out, want) and torch.equal(lse, want_lse)

    out_a, lse_a = selfattn.attention(q, k[:, :4], v[:, :4], layout="bshd", return_lse=True)
    out_b, lse_b = selfattn.attention(q, k[:, 4:], v[:, 4:], layout="bshd", return_lse=True)
    want, want_lse = selfattn.merge_states(out_a, lse_a, out_b, lse_b, layout="bshd")
    address = out_a.data_ptr()
    result, lse = selfattn.merge_states(out_a, lse_a, out_b, lse_b, layout="bshd", out=out_a)  # in place
    assert result is out_a and out_a.data_ptr() == address and torch.equal(out_a, want) and torch.equal(lse, want_lse)


@pytest.mark.device_check
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_out_compiles_whole(torch_device, backend):
    # A function that writes preallocated outputs traces with fullgraph=True (a call around the ops
    # would break the graph), and the compiled function writes the caller's tensors as eager does;
    # aot_eager functionalizes the ops' mutation of out and copies the result back.
    if not hasattr(torch, "compile"):
        pytest.skip("this PyTorch has no torch.compile")
    q, k, v = tensors((1, 2, 5, 8), seed=26, device=torch_device)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=torch_device)

    def f(q, k, v, out, lse_out, packed_out, merged):
        _, lse = selfattn.attention(q, k, v, causal="top_left", out=out, return_lse=True)
        lse_out.copy_(lse)
        packed = (a[0].transpose(0, 1) for a in (q, k, v))  # [total = 5, heads, dim]
        selfattn.attention_varlen(*packed, cu, cu, max_seqlen_q=3, max_seqlen_k=3, out=packed_out)
        _, merged_lse = selfattn.merge_states(out, lse, out.flip(2), lse.flip(2), out=merged)
        return out * 2, merged_lse

    def buffers():
        return (torch.zeros_like(q), torch.zeros(1, 2, 5, device=torch_device),
                torch.zeros(5, 2, 8, device=torch_device), torch.zeros_like(q))

    eager = buffers()
    want, want_lse = f(q, k, v, *eager)
    got_buffers = buffers()
    addresses = [b.data_ptr() for b in got_buffers]
    got, got_lse = torch.compile(f, backend=backend, fullgraph=True)(q, k, v, *got_buffers)
    assert [b.data_ptr() for b in got_buffers] == addresses
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
    for got_buffer, eager_buffer in zip(got_buffers, eager):
        assert torch.equal(got_buffer, eager_buffer)
    expected, expected_lse = reference(host(q), host(k), host(v), "top_left")
    assert relative_error(host(got_buffers[0]), expected) <= TOLERANCE["float32"]
    np.testing.assert_allclose(host(got_buffers[1]), expected_lse, rtol=1e-5, atol=1e-5)


def test_fake_implementations_of_the_out_ops():
    # torch.library.opcheck on the out variants: the schema (out is declared mutated, nothing else
    # is) and the fakes (lse, or an empty [0] without return_lse) against the real ops.
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("this PyTorch has no torch.library.opcheck")
    g = torch.Generator().manual_seed(27)
    q, k, v = (torch.randn(1, 5, 2, 8, generator=g) for _ in range(3))  # bshd
    sinks = torch.tensor([0.5, -float("inf")])
    utils = ("test_schema", "test_faketensor")
    for return_lse in (False, True):
        torch.library.opcheck(torch.ops.selfattn.attention_out.default,
                              (q, k, v, torch.empty_like(q), "bottom_right", None, "auto", None, "bshd", 2, 0, 5.0,
                               None, None, None, None, sinks, return_lse), test_utils=utils)
        cu = torch.tensor([0, 2, 5], dtype=torch.int32)
        torch.library.opcheck(torch.ops.selfattn.attention_varlen_out.default,
                              (q[0], k[0], v[0], torch.empty_like(q[0]), cu, cu, 3, 3, None, None, "auto", None, -1, -1,
                               None, None, None, None, None, sinks, return_lse), test_utils=utils)
        cache = torch.randn(1, 6, 2, 8, generator=g)
        torch.library.opcheck(torch.ops.selfattn.attention_with_kv_cache_out.default,
                              (q[:, :1], cache, cache.clone(), torch.tensor([6], dtype=torch.int32), None,
                               torch.tensor([0], dtype=torch.int32), torch.empty_like(q[:, :1]), "bshd",
                               "bottom_right", None, "auto", None, None, False, None, 1, 0,
                               -1, -1, None, None, None, None, None, sinks, False, None, 0, return_lse),
                              test_utils=utils)
    _, lse = selfattn.attention(q, k, v, layout="bshd", return_lse=True)
    torch.library.opcheck(torch.ops.selfattn.merge_states_out.default,
                          (q, lse, k, lse.clone(), torch.empty_like(q), "bshd"), test_utils=utils)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake_q = torch.empty(2, 5, 4, 8)
        lse = torch.ops.selfattn.attention_out(fake_q, fake_q, fake_q, torch.empty_like(fake_q), None, None, "auto",
                                               None, "bshd", -1, -1, None, None, None, None, None, None, True)
        assert lse.shape == (2, 4, 5) and lse.dtype == torch.float32


def test_wrong_out_is_refused_naming_it():
    # The out ops check out as the direct call did: its shape and dtype, its framework (a NumPy out
    # takes the direct call, which names it), and an out that requires grad (written outside the graph).
    q, k, v = tensors((1, 2, 3, 8), seed=28)
    with pytest.raises(selfattn.InvalidArgument, match=r"attention: out.shape\[3\] \(head_dim\) expected 8"):
        selfattn.attention(q, k, v, out=torch.empty(1, 2, 3, 7))
    with pytest.raises(selfattn.InvalidArgument, match="attention: out.dtype expected f32"):
        selfattn.attention(q, k, v, out=torch.empty(1, 2, 3, 8, dtype=torch.float16))
    with pytest.raises(selfattn.InvalidArgument, match="out"):
        selfattn.attention(q, k, v, out=np.empty((1, 2, 3, 8), np.float32))
    with pytest.raises(selfattn.InvalidArgument, match=r"attention_varlen: out.shape\[0\]"):
        selfattn.attention_varlen(q[0], k[0], v[0], [0, 2], [0, 2], out=torch.empty(3, 3, 8))
    _, lse = selfattn.attention(q, k, v, return_lse=True)
    with pytest.raises(selfattn.InvalidArgument, match="merge_states: out.dtype"):
        selfattn.merge_states(q, lse, k, lse, out=q.half())
    with pytest.raises(selfattn.NotAvailable, match="attention: out requires grad, but out= and context= record no"):
        selfattn.attention(q, k, v, out=torch.empty_like(q).requires_grad_())
    with pytest.raises(selfattn.NotAvailable, match="merge_states: out requires grad"):
        selfattn.merge_states(q, lse, k, lse, out=torch.empty_like(q).requires_grad_())


def test_empty_torch_arrays_run():
    # torch gives empty tensors strides a contiguity check must not judge (seq_q = 0: lse [2, 4, 0]).
    q = torch.randn(2, 4, 0, 8)
    out, lse = selfattn.attention(q, q, q.clone(), return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 0)
    x, w = torch.randn(2, 0, 8, requires_grad=True), torch.randn(8, 32)
    assert selfattn.self_attention(x, w, w, w.clone(), 4).shape == (2, 4, 0, 8)
    with pytest.raises(selfattn.InvalidArgument, match="wq expected x's dtype and device"):
        selfattn.self_attention(torch.randn(1, 2, 8, requires_grad=True), w.half(), w, w, 4)


def test_varlen_rows_no_sequence_owns_through_the_ops():
    # The attention_varlen op allocates out and lse: rows no sequence owns (past cu_seqlens_q[-1])
    # are 0 and -inf, eagerly and compiled; the out variant leaves the caller's rows as they were.
    q, k, v = tensors((7, 2, 8), seed=37)
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)

    def run(q):
        return selfattn.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=3, max_seqlen_k=4, return_lse=True)

    want = None
    for call in (run, torch.compile(run, backend="eager", fullgraph=True)):
        out, lse = call(q)
        assert torch.all(out[5:] == 0) and torch.all(lse[:, 5:] == -float("inf"))
        assert want is None or torch.equal(out, want)
        want = out
    given = torch.full_like(q, float("nan"))
    selfattn.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=3, max_seqlen_k=4, out=given)
    assert torch.isnan(given[5:]).all() and torch.equal(given[:5], want[:5])
