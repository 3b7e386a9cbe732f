"""PyTorch integration on CPU tensors (they run on the sim through DLPack): the torch.library custom
op, its fake implementation under FakeTensorMode, torch.compile, and autograd through the library's
backward, with every mask and score modifier, for attention and attention_varlen; attention sinks,
which train (their gradient is the library's dsinks); the refusal of inputs that require grad where
no gradient would reach them. Skipped without PyTorch (scripts/setup-deps installs it where it
can). The tests marked device_check take a `torch_device` (conftest.py) and run on CUDA tensors
too where there is a GPU: bench/device-check.sh runs those on a lent one."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, reference, reference_backward, relative_error

torch = pytest.importorskip("torch")
# gradcheck warns that its inputs are float32 (the sim's fp32 path); its tolerances allow for that.
pytestmark = pytest.mark.filterwarnings("ignore:Input #.*double precision:UserWarning")


def tensors(shape, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype).to(device) for _ in range(3)]


def host(t):
    """A tensor's values as a NumPy array, from any device."""
    return t.detach().cpu().numpy()


def same_values(got, want):
    """Two runs of the library on the same values: bit for bit on the sim; on a GPU the backward adds
    dQ's partial sums with atomics in an order that varies from run to run, so to rounding there."""
    if got.device.type == "cpu":
        return torch.equal(got, want)
    return relative_error(host(got), host(want), per_row=False) <= 1e-6


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


def test_requires_grad_inputs_are_accepted():
    q, k, v = tensors((1, 1, 4, 8))
    q.requires_grad_(True)
    out = selfattn.attention(q, k, v)
    assert relative_error(out.detach().numpy(), reference(q.detach().numpy(), k.numpy(), v.numpy())[0]) <= 1e-5


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


@pytest.mark.device_check
def test_autograd_reaches_the_library_backward(torch_device):
    # loss.backward() through the custom op: the gradients equal selfattn.attention_backward's on the
    # same values, and torch.autograd.gradcheck (float32, loose tolerances) agrees with central
    # differences.
    q, k, v = (t.requires_grad_() for t in tensors((1, 2, 5, 8), seed=3, device=torch_device))
    out = selfattn.attention(q, k, v, causal="top_left")
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    out2, lse = selfattn.attention(q.detach(), k.detach(), v.detach(), causal="top_left", return_lse=True)
    want = selfattn.attention_backward(q.detach(), k.detach(), v.detach(), out2, dout, lse, causal="top_left")
    for tensor, expected in zip((q, k, v), want):
        assert tensor.grad.device == q.device and same_values(tensor.grad, expected)
    small = [t.detach()[:, :, :3, :4].contiguous().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda a, b, c: selfattn.attention(a, b, c, path="naive"), small, eps=1e-2,
                                    atol=2e-3, rtol=2e-3)


def test_gradient_through_lse():
    # Both outputs are differentiable: gradcheck perturbs out's and lse's upstream gradients alike;
    # a loss of lse alone matches attention_backward with dout = 0; and under AOTAutograd (which
    # hands an unused lse a zero gradient) a compiled function returning lse trains as eager does.
    q, k, v = (t.requires_grad_() for t in tensors((1, 2, 4, 4), seed=4))
    assert torch.autograd.gradcheck(
        lambda a, b, c: selfattn.attention(a, b, c, causal="top_left", path="naive", return_lse=True),
        (q, k, v), eps=1e-2, atol=2e-3, rtol=2e-3)
    out, lse = selfattn.attention(q, k, v, return_lse=True)
    weights = torch.randn_like(lse)
    (lse * weights).sum().backward()
    want = selfattn.attention_backward(*(t.detach() for t in (q, k, v)), out.detach(), torch.zeros_like(out),
                                       lse.detach(), dlse=weights)
    for tensor, expected in zip((q, k, v), want):
        assert torch.equal(tensor.grad, expected)
        tensor.grad = None

    def f(q, k, v):
        return selfattn.attention(q, k, v, return_lse=True)

    out, lse = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    out.sum().backward()
    compiled = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    f(q, k, v)[0].sum().backward()
    for got, expected in zip(compiled, (q.grad, k.grad, v.grad)):
        assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6)


def modifiers(heads, seq_q, seq_k, seed):
    """window, softcap, ALiBi and a bias that masks key 0 of head 1, as torch tensors."""
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(1, heads, seq_q, seq_k, generator=g)
    bias[0, 1 % heads, :, 0] = -float("inf")
    return dict(window=(3, 1), softcap=4.0, alibi_slopes=torch.linspace(0.1, 0.4, heads), bias=bias)


def numpy_mods(mods):
    return {name: (host(value) if isinstance(value, torch.Tensor) else value) for name, value in mods.items()}


@pytest.mark.device_check
def test_autograd_with_every_modifier_and_key_lengths(torch_device):
    # Through the op, the modifiers reach the forward and the backward: out against the float64
    # reference, the gradients against float64 central differences of that reference's loss... and
    # against selfattn.attention_backward on the same values (bitwise on the sim).
    q, k, v = (t.requires_grad_() for t in tensors((2, 2, 7, 8), seed=7, device=torch_device))
    mods = {name: (value.to(torch_device) if isinstance(value, torch.Tensor) else value)
            for name, value in modifiers(2, 7, 7, seed=8).items()}
    lengths = torch.tensor([5, 7], dtype=torch.int32, device=torch_device)
    out = selfattn.attention(q, k, v, causal="bottom_right", key_lengths=lengths, **mods)
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    detached = [t.detach() for t in (q, k, v)]
    want, _ = reference(*(host(t) for t in detached), "bottom_right", key_lengths=host(lengths), **numpy_mods(mods))
    assert relative_error(host(out), want) <= TOLERANCE["float32"]
    want_grads = reference_backward(*(host(t) for t in detached), host(dout), "bottom_right",
                                    key_lengths=host(lengths), **numpy_mods(mods))
    out2, lse = selfattn.attention(*detached, causal="bottom_right", key_lengths=lengths, return_lse=True, **mods)
    library = selfattn.attention_backward(*detached, out2, dout, lse, causal="bottom_right", key_lengths=lengths,
                                          **mods)
    for tensor, expected, same in zip((q, k, v), want_grads, library):
        assert relative_error(host(tensor.grad), expected, per_row=False) <= 2 * TOLERANCE["float32"]
        assert same_values(tensor.grad, same)


@pytest.mark.device_check
def test_autograd_of_varlen_with_modifiers(torch_device):
    # Packed sequences of 3 and 5 rows (keys 4 and 5): each sequence's gradients against the
    # float64 backward of it alone, and torch.autograd.gradcheck on the naive path.
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(shape, generator=g).to(torch_device).requires_grad_()
               for shape in ((8, 2, 8), (9, 2, 8), (9, 2, 8)))
    cu_q, cu_k = (torch.tensor(cu, dtype=torch.int32, device=torch_device) for cu in ([0, 3, 8], [0, 4, 9]))
    mods = {name: (value.to(torch_device) if isinstance(value, torch.Tensor) else value)
            for name, value in modifiers(2, 5, 5, seed=10).items()}
    mods["bias"] = mods["bias"].expand(2, 2, 5, 5)
    out = selfattn.attention_varlen(q, k, v, cu_q, cu_k, causal="top_left", **mods)
    dout = torch.randn(out.shape, generator=g).to(torch_device)
    (out * dout).sum().backward()

    def bhsd(t):
        return host(t).transpose(1, 0, 2)[None]

    for b, (rows, keys) in enumerate(((slice(0, 3), slice(0, 4)), (slice(3, 8), slice(4, 9)))):
        one = dict(window=mods["window"], softcap=mods["softcap"], alibi_slopes=host(mods["alibi_slopes"]),
                   bias=host(mods["bias"][b:b + 1, :, :rows.stop - rows.start, :keys.stop - keys.start]))
        want_out, _ = reference(bhsd(q[rows]), bhsd(k[keys]), bhsd(v[keys]), "top_left", **one)
        assert relative_error(bhsd(out[rows]), want_out) <= TOLERANCE["float32"], b
        want = reference_backward(bhsd(q[rows]), bhsd(k[keys]), bhsd(v[keys]), bhsd(dout[rows]), "top_left", **one)
        for got, expected in zip((q.grad[rows], k.grad[keys], v.grad[keys]), want):
            assert relative_error(bhsd(got), expected, per_row=False) <= 2 * TOLERANCE["float32"], b
    small = [t.detach()[:5, :, :4].contiguous().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(
        lambda a, b, c: selfattn.attention_varlen(a, b, c, cu_q.clamp(max=5), cu_q.clamp(max=5), causal="top_left",
                                                  path="naive", window=(1, 1), softcap=4.0,
                                                  alibi_slopes=mods["alibi_slopes"]),
        small, eps=1e-2, atol=2e-3, rtol=2e-3)


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


def test_calls_without_a_gradient_refuse_inputs_that_require_one():
    # out= and context= record no autograd graph, and alibi_slopes and bias get no
    # gradient: a tensor that requires grad there is refused rather than silently left without one.
    q, k, v = tensors((1, 2, 3, 4), seed=12)
    wants = q.clone().requires_grad_()
    for call in (lambda: selfattn.attention(wants, k, v, out=torch.empty_like(q)),
                 lambda: selfattn.attention(q, wants, v, context=selfattn.default_context()),
                 lambda: selfattn.attention_varlen(wants[0].transpose(0, 1), k[0].transpose(0, 1),
                                                   v[0].transpose(0, 1), [0, 3], [0, 3], out=torch.empty(3, 2, 4))):
        with pytest.raises(selfattn.NotAvailable, match="requires grad, but out= and context= record no autograd"):
            call()
    with pytest.raises(selfattn.NotAvailable, match="alibi_slopes requires grad"):
        selfattn.attention(wants, k, v, alibi_slopes=torch.ones(2, requires_grad=True))
    with pytest.raises(selfattn.NotAvailable, match="bias requires grad"):
        selfattn.attention(q, k, v, bias=torch.zeros(1, 1, 3, 3, requires_grad=True))
    with pytest.raises(selfattn.NotAvailable, match="sinks requires grad, but out= and context= record no autograd"):
        selfattn.attention(q, k, v, out=torch.empty_like(q), sinks=torch.zeros(2, requires_grad=True))
    x, w = torch.randn(1, 3, 4), torch.randn(4, 4, requires_grad=True)
    with pytest.raises(selfattn.NotAvailable, match="self_attention: wk requires grad, but out= and context="):
        selfattn.self_attention(x, w.detach(), w, w.detach(), 2, out=torch.empty(1, 2, 3, 2))
    with torch.no_grad():  # nothing to differentiate: these run
        assert selfattn.attention(wants, k, v, out=torch.empty_like(q)).shape == q.shape
        assert selfattn.self_attention(x, w, w, w, 2).shape == (1, 2, 3, 2)


@pytest.mark.device_check
def test_kv_cache_on_torch_tensors(torch_device):
    # The decode calls on torch tensors (lists for lengths converted), with no autograd graph.
    g = torch.Generator().manual_seed(13)
    k_cache, v_cache = (torch.randn(2, 6, 1, 8, generator=g).to(torch_device) for _ in range(2))  # bshd
    k_new, v_new, q = (torch.randn(2, 1, 1, 8, generator=g).to(torch_device) for _ in range(3))
    lengths = selfattn.append_kv(k_cache, v_cache, [2, 5], k_new, v_new, layout="bshd", return_lengths=True)
    assert lengths.dtype == torch.int32 and lengths.device == k_cache.device and lengths.tolist() == [3, 6]
    assert torch.equal(k_cache[0, 2], k_new[0, 0]) and torch.equal(k_cache[1, 5], k_new[1, 0])
    out, lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, layout="bshd", return_lse=True)
    want, want_lse = reference(*(host(a.transpose(1, 2)) for a in (q, k_cache, v_cache)), "bottom_right",
                               key_lengths=host(lengths))
    assert relative_error(host(out.transpose(1, 2)), want) <= TOLERANCE["float32"]
    np.testing.assert_allclose(host(lse), want_lse, rtol=1e-5, atol=1e-5)
    with pytest.raises(selfattn.NotAvailable, match="attention_with_kv_cache: q requires grad"):
        selfattn.attention_with_kv_cache(q.requires_grad_(), k_cache, v_cache, lengths, layout="bshd")


@pytest.mark.device_check
def test_a_decode_step_compiles_whole(torch_device):
    # append_kv (which writes the cache in place) and attention_with_kv_cache are custom ops, so a
    # decode step traces with fullgraph=True; compiled and eager agree, caches included.
    g = torch.Generator().manual_seed(14)
    pool_k, pool_v = (torch.randn(5, 4, 2, 8, generator=g).to(torch_device) for _ in range(2))  # bshd pages of 4
    table = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32, device=torch_device)
    lengths = torch.tensor([2, 6], dtype=torch.int32, device=torch_device)
    k_new, v_new = (torch.randn(2, 1, 2, 8, generator=g).to(torch_device) for _ in range(2))
    q = torch.randn(2, 1, 4, 8, generator=g).to(torch_device)

    def step(q, k_new, v_new, pool_k, pool_v, lengths):
        updated = selfattn.append_kv(pool_k, pool_v, lengths, k_new, v_new, block_table=table, layout="bshd",
                                     return_lengths=True)
        out = selfattn.attention_with_kv_cache(q, pool_k, pool_v, updated, block_table=table, layout="bshd",
                                               softcap=20.0)
        return out, updated

    eager_k, eager_v = pool_k.clone(), pool_v.clone()
    want, want_lengths = step(q, k_new, v_new, eager_k, eager_v, lengths)
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    got, got_lengths = compiled(q, k_new, v_new, pool_k, pool_v, lengths)
    assert torch.equal(got, want) and torch.equal(got_lengths, want_lengths)
    assert torch.equal(pool_k, eager_k) and torch.equal(pool_v, eager_v)
    assert torch.equal(pool_k[3, 2], k_new[0, 0]) and torch.equal(pool_k[4, 2], k_new[1, 0])  # tokens 2 and 6

    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake_q = torch.empty(3, 2, 7, 16)
        pool = torch.empty(9, 2, 4, 16)
        cu = torch.empty(3, dtype=torch.int32)
        out, lse = torch.ops.selfattn.attention_with_kv_cache(fake_q, pool, pool, cu, None, "bhsd", "bottom_right",
                                                              None, "auto", None, None, False, 0, -1, -1, None, None,
                                                              None, None, False)
        assert out.shape == fake_q.shape and lse.shape == (3, 2, 7)


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


def test_options_changed_in_place_before_backward_raise():
    # bias (like key_lengths and alibi_slopes) is saved for the backward: changing it in between is
    # caught by torch's version counter instead of giving gradients of another bias.
    q, k, v = (t.requires_grad_() for t in tensors((1, 1, 4, 8), seed=16))
    bias = torch.zeros(1, 1, 4, 4)
    out = selfattn.attention(q, k, v, bias=bias)
    bias.fill_(-float("inf"))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_rotary_tables_that_require_grad_are_refused():
    cache, q = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 1, 8)
    cos = torch.ones(4, 2, requires_grad=True)
    with pytest.raises(selfattn.NotAvailable, match="append_kv: rotary_cos requires grad"):
        selfattn.append_kv(cache, cache.clone(), [0], q, q, rotary_cos=cos, rotary_sin=cos.detach())
    with pytest.raises(selfattn.NotAvailable, match="attention_with_kv_cache: rotary_sin requires grad"):
        selfattn.attention_with_kv_cache(q, cache, cache.clone(), [1], rotary_cos=cos.detach(), rotary_sin=cos)


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


@pytest.mark.parametrize("with_wo", [False, True])
def test_self_attention_trains(with_wo):
    # With weights that require grad, self_attention projects with torch and attends through the
    # op: its output and every gradient match the same model built on torch's own SDPA (GQA: each
    # kv head repeated for its query heads), and its output the library's own self_attention.
    g = torch.Generator().manual_seed(18)
    batch, seq, d_model, heads, kv_heads, dim = 2, 7, 12, 4, 2, 8
    x = torch.randn(batch, seq, d_model, generator=g)
    weights = [torch.randn(d_model, n * dim, generator=g) / 4 for n in (heads, kv_heads, kv_heads)]
    wo = torch.randn(heads * dim, 5, generator=g) if with_wo else None
    leaves = [t.clone().requires_grad_() for t in [x, *weights] + ([wo] if with_wo else [])]
    out = selfattn.self_attention(*leaves[:4], heads, wo=leaves[4] if with_wo else None, causal="top_left")
    assert torch.allclose(out, selfattn.self_attention(x, *weights, heads, wo=wo, causal="top_left"), atol=1e-5)
    upstream = torch.randn(out.shape, generator=g)
    (out * upstream).sum().backward()

    twins = [t.clone().requires_grad_() for t in [x, *weights] + ([wo] if with_wo else [])]
    tx, twq, twk, twv = twins[:4]

    def split(y, n):  # [batch, seq, n * dim] -> [batch, heads, seq, dim], kv heads repeated
        return y.view(batch, seq, n, dim).transpose(1, 2).repeat_interleave(heads // n, dim=1)

    sdpa = torch.nn.functional.scaled_dot_product_attention(split(tx @ twq, heads), split(tx @ twk, kv_heads),
                                                            split(tx @ twv, kv_heads), is_causal=True)
    want = sdpa if not with_wo else sdpa.transpose(1, 2).reshape(batch, seq, heads * dim) @ twins[4]
    (want * upstream).sum().backward()
    assert torch.allclose(out, want, atol=1e-5)
    for got, expected in zip(leaves, twins):
        assert torch.allclose(got.grad, expected.grad, rtol=1e-4, atol=1e-5)


def test_empty_torch_arrays_run():
    # torch gives empty tensors strides a contiguity check must not judge (seq_q = 0: lse [2, 4, 0]).
    q = torch.randn(2, 4, 0, 8)
    out, lse = selfattn.attention(q, q, q.clone(), return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 0)
    x, w = torch.randn(2, 0, 8, requires_grad=True), torch.randn(8, 32)
    assert selfattn.self_attention(x, w, w, w.clone(), 4).shape == (2, 4, 0, 8)
    with pytest.raises(selfattn.InvalidArgument, match="wq expected x's dtype and device"):
        selfattn.self_attention(torch.randn(1, 2, 8, requires_grad=True), w.half(), w, w, 4)


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


def test_kv_cache_passes_sinks_and_refuses_their_gradient():
    # The decode op takes sinks (eager and compiled alike, against the reference), but has no
    # backward: sinks that require grad are refused.
    g = torch.Generator().manual_seed(22)
    k_cache, v_cache = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(2))
    q = torch.randn(2, 4, 1, 8, generator=g)
    lengths, sinks = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0.5, -float("inf"), 1.0, 2.0])

    def step(q, sinks):
        return selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, sinks=sinks, return_lse=True)

    out, lse = step(q, sinks)
    want, want_lse = reference(q.numpy(), k_cache.numpy(), v_cache.numpy(), "bottom_right", key_lengths=lengths.numpy(),
                               sinks=sinks.numpy())
    assert relative_error(out.numpy(), want) <= TOLERANCE["float32"] and torch.all(out[0] == 0)
    assert torch.equal(lse[0], sinks[:, None])
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(step, backend="eager", fullgraph=True)(q, sinks)
    assert torch.equal(compiled[0], out) and torch.equal(compiled[1], lse)
    with pytest.raises(selfattn.NotAvailable, match="attention_with_kv_cache: sinks requires grad"):
        step(q, sinks.clone().requires_grad_())


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
