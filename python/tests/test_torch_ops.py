"""PyTorch integration on CPU tensors (they run on the sim through DLPack): torch tensors in and
out (on the inputs' device, zero-copy views, bf16 and bshd, empty tensors), the torch.library
custom ops and their fake implementations (FakeTensorMode, torch.library.opcheck), and
torch.compile (merge_states included, and a compiled call as a fresh process's first). Autograd
is in test_torch_autograd.py, the KV cache's ops in test_torch_kv_cache.py, trainable sinks in
test_torch_sinks.py. Skipped without PyTorch (scripts/setup-deps installs it where it can). The
tests marked device_check take a `torch_device` (conftest.py) and run on CUDA tensors too where
there is a GPU: bench/device-check.sh runs those on a lent one."""
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
        out, lse = torch.ops.selfattn.attention(q, k, v, None, None, "auto", None, "bshd", -1, -1, None, None, None,
                                                None)
        assert out.shape == q.shape and lse.shape == (2, 4, 5) and lse.dtype == torch.float32


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
        out, lse = torch.ops.selfattn.attention_varlen(q, k, k, cu, cu, 5, 6, None, None, "auto", -1, -1, None, None,
                                                        None, None)
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
    # schema; with and without sinks, and the backward ops with and without dsinks.
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("this PyTorch has no torch.library.opcheck")
    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(1, 5, 2, 8, generator=g).to(torch_device).transpose(1, 2) for _ in range(3))  # bhsd of bshd
    bias = torch.randn(1, 2, 5, 5, generator=g).to(torch_device)
    sinks = torch.tensor([0.5, -float("inf")], device=torch_device)
    utils = ("test_schema", "test_faketensor")
    for with_sinks in (None, sinks):
        torch.library.opcheck(torch.ops.selfattn.attention.default,
                              (q, k, v, "bottom_right", None, "auto", None, "bhsd", 2, 0, 5.0, None, bias, with_sinks),
                              test_utils=utils)
    out, lse = selfattn.attention(q, k, v, return_lse=True, sinks=sinks)
    for with_sinks, return_dsinks in ((None, False), (sinks, False), (sinks, True)):
        torch.library.opcheck(torch.ops.selfattn.attention_backward.default,
                              (q, k, v, out, torch.randn_like(out), lse, torch.randn_like(lse), None, None, "auto",
                               None, "bhsd", -1, -1, None, None, None, with_sinks, return_dsinks), test_utils=utils)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=torch_device)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]  # [total, heads, dim], strided
    for with_sinks in (None, sinks):
        torch.library.opcheck(torch.ops.selfattn.attention_varlen.default,
                              (*packed, cu, cu, 3, 3, None, None, "auto", -1, -1, None, None, None, with_sinks),
                              test_utils=utils)
    out, lse = selfattn.attention_varlen(*packed, cu, cu, return_lse=True, sinks=sinks)
    torch.library.opcheck(torch.ops.selfattn.attention_varlen_backward.default,
                          (*packed, out, torch.randn_like(out), lse, None, cu, cu, 3, 3, "top_left", None, "auto",
                           -1, -1, None, None, None, sinks, True), test_utils=utils)
    cache = torch.randn(1, 2, 6, 8, generator=g).to(torch_device)
    for with_sinks in (None, sinks):
        torch.library.opcheck(torch.ops.selfattn.attention_with_kv_cache.default,
                              (q, cache, cache.clone(), torch.tensor([6], dtype=torch.int32, device=torch_device),
                               None, "bhsd", "bottom_right", None, "auto", None, None, False, 0, -1, -1, None, None,
                               None, with_sinks, False), test_utils=utils)


def test_compile_as_the_first_call_in_a_fresh_process():
    # With torch imported before selfattn, the ops are registered at import, so a compiled function
    # may be the first to reach them (registration cannot be traced).
    import subprocess
    import sys
    code = ("import torch, selfattn\n"
            "q = torch.randn(1, 2, 4, 8)\n"
            "f = torch.compile(lambda q: selfattn.attention(q, q, q.clone()) * 2, backend='eager', fullgraph=True)\n"
            "assert torch.allclose(f(q), selfattn.attention(q, q, q.clone()) * 2)\n")
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


def test_empty_torch_arrays_run():
    # torch gives empty tensors strides a contiguity check must not judge (seq_q = 0: lse [2, 4, 0]).
    q = torch.randn(2, 4, 0, 8)
    out, lse = selfattn.attention(q, q, q.clone(), return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 0)
    x, w = torch.randn(2, 0, 8, requires_grad=True), torch.randn(8, 32)
    assert selfattn.self_attention(x, w, w, w.clone(), 4).shape == (2, 4, 0, 8)
    with pytest.raises(selfattn.InvalidArgument, match="wq expected x's dtype and device"):
        selfattn.self_attention(torch.randn(1, 2, 8, requires_grad=True), w.half(), w, w, 4)
