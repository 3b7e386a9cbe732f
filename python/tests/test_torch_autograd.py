"""PyTorch autograd on CPU tensors (they run on the sim through DLPack): gradients through the
torch.library custom op reach the library's backward, with every mask and score modifier and
key_lengths, for attention and attention_varlen, through lse, and compiled (AOTAutograd) as eager;
deterministic=True carried to the library's backward (bitwise-stable gradients on the fused path);
self_attention trains as the same model on torch's SDPA; the refusal of inputs that require grad
where no gradient would reach them. Trainable sinks are in test_torch_sinks.py. Skipped without
PyTorch (scripts/setup-deps installs it where it can). The tests marked device_check take a
`torch_device` (conftest.py) and run on CUDA tensors too where there is a GPU:
bench/device-check.sh runs those on a lent one."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, host, reference, reference_backward, relative_error, same_values, tensors

torch = pytest.importorskip("torch")
# gradcheck warns that its inputs are float32 (the sim's fp32 path); its tolerances allow for that.
pytestmark = pytest.mark.filterwarnings("ignore:Input #.*double precision:UserWarning")


def test_requires_grad_inputs_are_accepted():
    q, k, v = tensors((1, 1, 4, 8))
    q.requires_grad_(True)
    out = selfattn.attention(q, k, v)
    assert relative_error(out.detach().numpy(), reference(q.detach().numpy(), k.numpy(), v.numpy())[0]) <= 1e-5


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


def test_autograd_v_head_dim_apart_compiled():
    # v (and out) of another head dim than q and k, as MLA's prefill: under torch.compile
    # (AOTAutograd, fullgraph) the gradients take each input's shape and match the float64 backward,
    # and gradcheck agrees with central differences on the naive path.
    if not hasattr(torch, "compile"):
        pytest.skip("this PyTorch has no torch.compile")
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_() for shape in ((1, 4, 6, 24), (1, 2, 7, 24), (1, 2, 7, 8)))

    def f(q, k, v):
        return selfattn.attention(q, k, v, causal="bottom_right")

    out = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    assert out.shape == (1, 4, 6, 8)
    dout = torch.randn(out.shape, generator=g)
    (out * dout).sum().backward()
    want = reference_backward(*(t.detach().numpy() for t in (q, k, v)), dout.numpy(), "bottom_right")
    for tensor, expected in zip((q, k, v), want):
        assert tensor.grad.shape == tensor.shape
        assert relative_error(tensor.grad.numpy(), expected, per_row=False) <= 2 * TOLERANCE["float32"]
    small = [t.detach()[:, :, :3].contiguous().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda a, b, c: selfattn.attention(a, b, c, path="naive"), small, eps=1e-2,
                                    atol=2e-3, rtol=2e-3)


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


def bits(t):
    """A float16/bfloat16 tensor's bytes as int16 (torch.equal on them compares bit for bit)."""
    return t.detach().cpu().contiguous().view(torch.int16)


@pytest.mark.device_check
@pytest.mark.parametrize("dtype,dim", [("float16", 32), ("bfloat16", 64), ("float16", 128)])
def test_deterministic_backward_is_bitwise_stable(torch_device, dtype, dim):
    # attention(..., deterministic=True) on the fused path (f16/bf16, head_dim 32/64/128, GQA,
    # causal): two loss.backward() give the same bytes, the bytes of
    # selfattn.attention_backward(..., deterministic=True) on the same values (on a GPU too, where
    # the default mode adds dQ with atomics), and the float64 reference's gradients to tolerance.
    torch_dtype = getattr(torch, dtype)
    q, dout = tensors((1, 4, 40, dim), torch_dtype, seed=21, device=torch_device)[:2]
    k, v = tensors((1, 2, 70, dim), torch_dtype, seed=22, device=torch_device)[:2]
    options = dict(causal="bottom_right", path="fused")

    def gradients():
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        selfattn.attention(*inputs, deterministic=True, **options).backward(dout)
        return [t.grad for t in inputs]

    first, second = gradients(), gradients()
    out, lse = selfattn.attention(q, k, v, return_lse=True, **options)
    direct = selfattn.attention_backward(q, k, v, out, dout, lse, deterministic=True, **options)
    want = reference_backward(*(host(t.float()) for t in (q, k, v, dout)), "bottom_right")
    for a, b, c, expected in zip(first, second, direct, want):
        assert a.dtype == torch_dtype and a.device == q.device
        assert torch.equal(bits(a), bits(b)) and torch.equal(bits(a), bits(c))
        assert relative_error(host(a.float()), expected, per_row=False) <= 2 * TOLERANCE[dtype]


@pytest.mark.device_check
def test_deterministic_varlen_backward_is_bitwise_stable(torch_device):
    # attention_varlen(..., deterministic=True): packed sequences of 17 and 23 rows (keys 25 and
    # 40), bfloat16, head_dim 64, fused: two loss.backward() give the bytes of
    # attention_varlen_backward(..., deterministic=True), and the reference's gradients per sequence.
    q, dout = (t[0].transpose(0, 1).contiguous() for t in tensors((1, 4, 40, 64), torch.bfloat16, seed=25,
                                                                  device=torch_device)[:2])
    k, v = (t[0].transpose(0, 1).contiguous() for t in tensors((1, 2, 65, 64), torch.bfloat16, seed=26,
                                                               device=torch_device)[:2])
    cu_q, cu_k = (torch.tensor(cu, dtype=torch.int32, device=torch_device) for cu in ([0, 17, 40], [0, 25, 65]))
    options = dict(causal="top_left", path="fused", max_seqlen_q=23, max_seqlen_k=40)

    def gradients():
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        selfattn.attention_varlen(*inputs, cu_q, cu_k, deterministic=True, **options).backward(dout)
        return [t.grad for t in inputs]

    first, second = gradients(), gradients()
    out, lse = selfattn.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **options)
    direct = selfattn.attention_varlen_backward(q, k, v, out, dout, lse, cu_q, cu_k, deterministic=True, **options)
    for a, b, c in zip(first, second, direct):
        assert torch.equal(bits(a), bits(b)) and torch.equal(bits(a), bits(c))

    def bhsd(t):
        return host(t.float()).transpose(1, 0, 2)[None]

    for rows, keys in ((slice(0, 17), slice(0, 25)), (slice(17, 40), slice(25, 65))):
        want = reference_backward(bhsd(q[rows]), bhsd(k[keys]), bhsd(v[keys]), bhsd(dout[rows]), "top_left")
        for got, expected in zip((first[0][rows], first[1][keys], first[2][keys]), want):
            assert relative_error(bhsd(got), expected, per_row=False) <= 2 * TOLERANCE["bfloat16"]


def test_deterministic_reaches_the_library_backward(monkeypatch):
    # The ops carry the flag from the forward call to the library's backward: a spy on the backward
    # calls the backward ops make sees each value given (on the sim a dropped flag would still give
    # stable bytes within one process, so the bitwise tests above cannot tell). Without autograd
    # (NumPy arrays, out=) the flag is accepted and changes nothing: the forward is deterministic.
    from selfattn import _backward
    seen = []
    for name in ("attention_backward", "attention_varlen_backward"):
        def spy(*args, real=getattr(_backward, name), name=name, **kwargs):
            seen.append((name, kwargs["deterministic"]))
            return real(*args, **kwargs)
        monkeypatch.setattr(_backward, name, spy)
    q, k, v = (t.requires_grad_() for t in tensors((1, 2, 5, 8), seed=24))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]
    selfattn.attention(q, k, v).sum().backward()
    selfattn.attention_varlen(*packed, cu, cu).sum().backward()
    for deterministic in (False, True):
        selfattn.attention(q, k, v, deterministic=deterministic).sum().backward()
        selfattn.attention_varlen(*packed, cu, cu, deterministic=deterministic).sum().backward()
    assert seen == [(name, flag) for flag in (False, False, True)
                    for name in ("attention_backward", "attention_varlen_backward")]
    arrays = [host(t) for t in (q, k, v)]
    assert np.array_equal(selfattn.attention(*arrays, deterministic=True), selfattn.attention(*arrays))
    with torch.no_grad():
        out = torch.empty_like(q)
        assert torch.equal(selfattn.attention(q, k, v, out=out, deterministic=True), selfattn.attention(q, k, v))


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


def test_options_changed_in_place_before_backward_raise():
    # bias (like key_lengths and alibi_slopes) is saved for the backward: changing it in between is
    # caught by torch's version counter instead of giving gradients of another bias.
    q, k, v = (t.requires_grad_() for t in tensors((1, 1, 4, 8), seed=16))
    bias = torch.zeros(1, 1, 4, 4)
    out = selfattn.attention(q, k, v, bias=bias)
    bias.fill_(-float("inf"))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


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
