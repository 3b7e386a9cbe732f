"""CUDA tensors (PyTorch or CuPy) on the cuda backend: zero-copy, on the caller's current stream,
output allocated by the framework. Skipped where there is no GPU (or neither framework)."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, reference, reference_backward, relative_error

# All of it runs in bench/device-check.sh on a lent GPU (conftest.py's markers).
pytestmark = [pytest.mark.device_check, pytest.mark.gpu]
if "cuda" not in selfattn.backends():
    pytest.skip("no usable GPU (or this build has no cuda backend)", allow_module_level=True)
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no CUDA device", allow_module_level=True)


def tensors(shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(shape, generator=g, device="cuda", dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_against_reference(dtype):
    q, k, v = tensors((2, 4, 113, 64), dtype)
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", return_lse=True)
    assert out.device == q.device and out.dtype == dtype
    want, want_lse = reference(*(a.float().cpu().numpy() for a in (q, k, v)), causal="bottom_right")
    name = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    assert relative_error(out.float().cpu().numpy(), want) <= TOLERANCE[name]
    np.testing.assert_allclose(lse.cpu().numpy(), want_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sinks_train_on_the_gpu(dtype):
    # Sinks on CUDA tensors (head 1 without one, batch 1 without keys): out and lse against the
    # reference, and loss.backward() gives the sinks the library's dsinks (deterministic: one block
    # per head), close to the reference's.
    q, k, v = (t.requires_grad_() for t in tensors((2, 4, 77, 64), dtype, seed=1))
    sinks = torch.tensor([0.5, -float("inf"), 1.5, 2.0], device="cuda", requires_grad=True)
    lengths = torch.tensor([77, 0], dtype=torch.int32, device="cuda")
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", key_lengths=lengths, sinks=sinks, return_lse=True)
    host = [a.detach().float().cpu().numpy() for a in (q, k, v)]
    host_sinks = sinks.detach().cpu().numpy()
    want, want_lse = reference(*host, "bottom_right", key_lengths=[77, 0], sinks=host_sinks)
    name = {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    assert relative_error(out.detach().float().cpu().numpy(), want) <= TOLERANCE[name]
    np.testing.assert_allclose(lse.detach().cpu().numpy(), want_lse, rtol=1e-3, atol=1e-3)
    assert torch.all(out[1] == 0)
    dout = torch.randn(out.shape, device="cuda", dtype=dtype)
    (out * dout).sum().backward()
    *_, dsinks = selfattn.attention_backward(*(a.detach() for a in (q, k, v)), out.detach(), dout, lse.detach(),
                                             causal="bottom_right", key_lengths=lengths, sinks=sinks.detach(),
                                             return_dsinks=True)
    assert torch.equal(sinks.grad, dsinks) and sinks.grad[1] == 0
    want_grads = reference_backward(*host, dout.float().cpu().numpy(), "bottom_right", key_lengths=[77, 0],
                                    sinks=host_sinks)
    assert relative_error(sinks.grad.cpu().numpy(), want_grads[3], per_row=False) <= 2 * TOLERANCE[name]


def test_zero_copy_into_out_on_the_current_stream():
    q, k, v = tensors((1, 2, 64, 64))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = torch.empty_like(q)
        result = selfattn.attention(q, k, v, out=out)
        assert result is out
        assert selfattn.default_context("cuda", 0, stream.cuda_stream).stream == stream.cuda_stream
    stream.synchronize()
    want, _ = reference(*(a.float().cpu().numpy() for a in (q, k, v)))
    assert relative_error(out.float().cpu().numpy(), want) <= TOLERANCE["bfloat16"]


def test_packed_qkv_views_without_copies():
    qkv = torch.randn(2, 50, 3, 4, 64, device="cuda", dtype=torch.float16)
    q, k, v = qkv.unbind(2)
    out = selfattn.attention(q, k, v, layout="bshd")
    want, _ = reference(*(a.transpose(1, 2).float().cpu().numpy() for a in (q, k, v)))
    assert relative_error(out.transpose(1, 2).float().cpu().numpy(), want) <= TOLERANCE["float16"]


def test_cupy_if_installed():
    cupy = pytest.importorskip("cupy")
    q, k, v = (cupy.random.standard_normal((1, 2, 33, 64)).astype(cupy.float16) for _ in range(3))
    out = selfattn.attention(q, k, v)
    assert isinstance(out, cupy.ndarray)
    want, _ = reference(*(cupy.asnumpy(a) for a in (q, k, v)))
    assert relative_error(cupy.asnumpy(out), want) <= TOLERANCE["float16"]
