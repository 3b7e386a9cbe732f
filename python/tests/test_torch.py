"""PyTorch integration on CPU tensors (they run on the sim through DLPack): the torch.library custom
op, its fake implementation under FakeTensorMode, torch.compile, and autograd through the library's
backward; the masks and score modifiers, which go around the op. Skipped without PyTorch
(scripts/setup-deps installs it where it can)."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, reference, relative_error

torch = pytest.importorskip("torch")


def tensors(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(3)]


def test_cpu_tensors_run_on_the_sim():
    q, k, v = tensors((2, 3, 9, 16))
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and lse.dtype == torch.float32
    want, want_lse = reference(q.numpy(), k.numpy(), v.numpy(), "bottom_right")
    assert relative_error(out.numpy(), want) <= TOLERANCE["float32"]
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-4, atol=1e-4)


def test_bf16_and_bshd():
    q, k, v = tensors((1, 7, 2, 8), torch.bfloat16, seed=1)  # [batch, seq, heads, dim]
    out = selfattn.attention(q, k, v, layout="bshd")
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    want, _ = reference(*(a.transpose(1, 2).float().numpy() for a in (q, k, v)))
    assert relative_error(out.transpose(1, 2).float().numpy(), want) <= TOLERANCE["bfloat16"]


def test_requires_grad_inputs_are_accepted():
    q, k, v = tensors((1, 1, 4, 8))
    q.requires_grad_(True)
    out = selfattn.attention(q, k, v)
    assert relative_error(out.detach().numpy(), reference(q.detach().numpy(), k.numpy(), v.numpy())[0]) <= 1e-5


def test_fake_implementation_gives_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from selfattn import _torch
    if _torch.attention_op() is None:
        pytest.skip("this PyTorch has no torch.library.custom_op")
    with FakeTensorMode():
        q = torch.empty(2, 5, 4, 8)
        k = v = torch.empty(2, 6, 2, 8)
        out, lse = torch.ops.selfattn.attention(q, k, v, None, None, "auto", None, "bshd")
        assert out.shape == q.shape and lse.shape == (2, 4, 5) and lse.dtype == torch.float32


def test_torch_compile():
    if not hasattr(torch, "compile"):
        pytest.skip("this PyTorch has no torch.compile")
    q, k, v = tensors((1, 2, 5, 8), seed=2)

    def f(q, k, v):
        return selfattn.attention(q, k, v, causal="top_left") * 2

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    assert relative_error(compiled(q, k, v).numpy() / 2, reference(q.numpy(), k.numpy(), v.numpy(), "top_left")[0]) \
        <= TOLERANCE["float32"]


def test_autograd_reaches_the_library_backward():
    # loss.backward() through the custom op: the gradients equal selfattn.attention_backward's on the
    # same values, and torch.autograd.gradcheck (float32 on the sim, loose tolerances) agrees with
    # central differences.
    q, k, v = (t.requires_grad_() for t in tensors((1, 2, 5, 8), seed=3))
    out = selfattn.attention(q, k, v, causal="top_left")
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    out2, lse = selfattn.attention(q.detach(), k.detach(), v.detach(), causal="top_left", return_lse=True)
    want = selfattn.attention_backward(q.detach(), k.detach(), v.detach(), out2, dout, lse, causal="top_left")
    for tensor, expected in zip((q, k, v), want):
        assert torch.equal(tensor.grad, expected)
    small = [t.detach()[:, :, :3, :4].contiguous().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda a, b, c: selfattn.attention(a, b, c, path="naive"), small, eps=1e-2,
                                    atol=2e-3, rtol=2e-3)


def test_gradient_through_lse_is_refused():
    q, k, v = (t.requires_grad_() for t in tensors((1, 1, 3, 4), seed=4))
    out, lse = selfattn.attention(q, k, v, return_lse=True)
    with pytest.raises(NotImplementedError, match="lse"):
        lse.sum().backward()


def test_masks_without_grad_go_around_the_op():
    # The custom op takes no masks or score modifiers yet: tensors that do not require grad run the
    # library directly (torch alibi_slopes and bias, converted and checked like NumPy ones).
    q, k, v = tensors((2, 2, 5, 8), seed=5)
    alibi, bias = torch.tensor([0.5, 0.25]), torch.zeros(1, 2, 5, 5)
    bias[0, 1, :, 0] = -float("inf")
    out, lse = selfattn.attention(q, k, v, window=(2, 0), softcap=5.0, alibi_slopes=alibi, bias=bias, return_lse=True)
    want, want_lse = reference(q.numpy(), k.numpy(), v.numpy(), window=(2, 0), softcap=5.0,
                               alibi_slopes=alibi.numpy(), bias=bias.numpy())
    assert relative_error(out.numpy(), want) <= TOLERANCE["float32"]
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-4, atol=1e-4)


def test_masks_with_autograd_are_refused():
    q, k, v = tensors((1, 1, 3, 4), seed=6)
    k.requires_grad_()
    with pytest.raises(selfattn.NotAvailable, match="autograd"):
        selfattn.attention(q, k, v, softcap=5.0)
    with pytest.raises(selfattn.NotAvailable, match="autograd"):
        selfattn.attention(q.detach(), k.detach(), v, bias=torch.zeros(1, 1, 3, 3, requires_grad=True))
