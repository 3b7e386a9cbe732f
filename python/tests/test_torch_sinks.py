"""Attention sinks that train on torch tensors (CPU tensors run on the sim through DLPack): their
gradient, through the op's autograd formula, is the library's dsinks, against the float64
reference and torch.autograd.gradcheck, for attention and attention_varlen, compiled
(AOTAutograd) as eager, and through self_attention. The NumPy side is test_sinks.py; the KV
cache's sinks on torch tensors are in test_torch_kv_cache.py. Skipped without PyTorch
(scripts/setup-deps installs it where it can). The tests marked device_check take a
`torch_device` (conftest.py) and run on CUDA tensors too where there is a GPU:
bench/device-check.sh runs those on a lent one."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, host, reference_backward, relative_error, same_values

torch = pytest.importorskip("torch")
# gradcheck warns that its inputs are float32 (the sim's fp32 path); its tolerances allow for that.
pytestmark = pytest.mark.filterwarnings("ignore:Input #.*double precision:UserWarning")


@pytest.mark.device_check
def test_sinks_train(torch_device):
    # sinks that require grad get the library's dsinks through the op's autograd formula: equal to
    # attention_backward(return_dsinks=True) on the same values (q, k, v's gradients too), close to
    # the float64 reference, for a loss of out and lse; GQA, head 1 without a sink, and rows that
    # see no key (batch 1's first two: their lse is the sink, so dL/dsink takes their dlse).
    g = torch.Generator().manual_seed(19)
    q = torch.randn(2, 4, 6, 8, generator=g).to(torch_device).requires_grad_()
    k, v = (torch.randn(2, 2, 9, 8, generator=g).to(torch_device).requires_grad_() for _ in range(2))
    sinks = torch.tensor([0.5, -float("inf"), 1.5, 2.0], device=torch_device, requires_grad=True)
    options = dict(causal="bottom_right", key_lengths=torch.tensor([9, 4], dtype=torch.int32, device=torch_device))
    out, lse = selfattn.attention(q, k, v, sinks=sinks, return_lse=True, **options)
    dout, weights = (torch.randn(shape, generator=g).to(torch_device) for shape in (out.shape, lse.shape))
    finite = torch.isfinite(lse.detach())
    dlse = torch.where(finite, weights, 0.0)
    ((out * dout).sum() + (lse.masked_fill(~finite, 0) * weights).sum()).backward()
    detached = [t.detach() for t in (q, k, v)]
    library = selfattn.attention_backward(*detached, out.detach(), dout, lse.detach(), dlse=dlse,
                                          sinks=sinks.detach(), return_dsinks=True, **options)
    for tensor, same in zip((q, k, v, sinks), library):
        assert same_values(tensor.grad, same)
    assert sinks.grad[1] == 0
    want = reference_backward(*(host(t) for t in detached), host(dout), dlse=host(dlse),
                              sinks=host(sinks), causal="bottom_right", key_lengths=[9, 4])
    for tensor, expected in zip((q, k, v, sinks), want):
        assert relative_error(host(tensor.grad), expected, per_row=False) <= 2 * TOLERANCE["float32"]
    small = [t.detach()[:1, :, :3, :4].contiguous().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(
        lambda a, b, c, s: selfattn.attention(a, b, c, path="naive", causal="top_left", sinks=s, return_lse=True),
        (*small, torch.tensor([0.3, -1.0, 0.8, 2.0], device=torch_device, requires_grad=True)), eps=1e-2, atol=2e-3,
        rtol=2e-3)


def test_sinks_train_through_varlen():
    # Packed sequences of 3 and 5 rows, the first without keys (its rows are their sinks alone):
    # dsinks against the sum of each sequence's float64 reference, q, k, v's gradients against
    # each sequence's own; torch.autograd.gradcheck on the naive path, sinks included.
    g = torch.Generator().manual_seed(20)
    q = torch.randn(8, 2, 8, generator=g).requires_grad_()
    k, v = (torch.randn(5, 2, 8, generator=g).requires_grad_() for _ in range(2))
    sinks = torch.tensor([1.0, 0.25], requires_grad=True)
    cu_q, cu_k = torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([0, 0, 5], dtype=torch.int32)
    out = selfattn.attention_varlen(q, k, v, cu_q, cu_k, causal="bottom_right", softcap=4.0, sinks=sinks)
    dout = torch.randn(out.shape, generator=g)
    (out * dout).sum().backward()
    assert torch.all(out[:3] == 0)

    def bhsd(t):
        return t.detach().numpy().transpose(1, 0, 2)[None]

    want_dsinks = np.zeros(2)
    for rows, keys in ((slice(0, 3), slice(0, 0)), (slice(3, 8), slice(0, 5))):
        want = reference_backward(bhsd(q[rows]), bhsd(k[keys]), bhsd(v[keys]), bhsd(dout[rows]), "bottom_right",
                                  softcap=4.0, sinks=sinks.detach().numpy())
        for got, expected in zip((q.grad[rows], k.grad[keys], v.grad[keys]), want):
            assert relative_error(bhsd(got), expected, per_row=False) <= 2 * TOLERANCE["float32"]
        want_dsinks += want[3]
    assert relative_error(sinks.grad.numpy(), want_dsinks, per_row=False) <= 2 * TOLERANCE["float32"]
    small = [t.detach()[:5, :, :4].contiguous().requires_grad_() for t in (q, k, v)]
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    assert torch.autograd.gradcheck(
        lambda a, b, c, s: selfattn.attention_varlen(a, b, c, cu, cu, causal="top_left", path="naive", sinks=s),
        (*small, sinks.detach().clone().requires_grad_()), eps=1e-2, atol=2e-3, rtol=2e-3)


def test_sinks_compile_and_train_as_eager():
    # fullgraph under AOTAutograd (attention and attention_varlen): the sinks' gradients compiled
    # equal eager's, as q's do.
    g = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g).requires_grad_() for _ in range(3))
    sinks = torch.tensor([0.5, 1.5], requires_grad=True)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)

    def f(q, k, v, sinks):
        out, lse = selfattn.attention(q, k, v, causal="top_left", sinks=sinks, return_lse=True)
        packed = selfattn.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu,
                                           max_seqlen_q=3, max_seqlen_k=3, sinks=sinks * 2)
        return out.sum() + lse.sum() + (packed * packed).sum()

    gradients = []
    for run in (torch.compile(f, backend="aot_eager", fullgraph=True), f):
        run(q, k, v, sinks).backward()
        gradients.append([t.grad.clone() for t in (q, k, v, sinks)])
        for t in (q, k, v, sinks):
            t.grad = None
    for compiled, eager in zip(*gradients):
        assert torch.allclose(compiled, eager, rtol=1e-6, atol=1e-6)
    assert torch.all(gradients[1][3] != 0)


def test_self_attention_trains_sinks():
    # Sinks alone requiring grad take self_attention's torch path: their gradient is the one
    # attention() gives on the same projections, bitwise.
    g = torch.Generator().manual_seed(23)
    batch, seq, d_model, heads, dim = 2, 5, 8, 2, 4
    x = torch.randn(batch, seq, d_model, generator=g)
    wq, wk, wv = (torch.randn(d_model, heads * dim, generator=g) for _ in range(3))
    sinks, twin = (torch.tensor([0.5, 1.0], requires_grad=True) for _ in range(2))
    upstream = torch.randn(batch, heads, seq, dim, generator=g)
    (selfattn.self_attention(x, wq, wk, wv, heads, causal="top_left", sinks=sinks) * upstream).sum().backward()
    q, k, v = ((x @ w).view(batch, seq, heads, dim) for w in (wq, wk, wv))
    out = selfattn.attention(q, k, v, layout="bshd", causal="top_left", sinks=twin)
    (out.transpose(1, 2) * upstream).sum().backward()
    assert sinks.grad is not None and torch.equal(sinks.grad, twin.grad)
