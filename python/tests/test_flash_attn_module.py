"""selfattn.integrations.flash_attn (FlashAttention's calls over selfattn) on CPU tensors (the sim),
against the float64 torch reference of flash_attn_support.py (FlashAttention's terms): each
argument of flash_attn_func and flash_attn_varlen_func mapped, gradients through autograd, varlen
with an empty sequence, v of another head dim than q and k (FlashAttention-3's MLA shapes), dropout, FP8 descales, and the refusals and errors, all RuntimeError (the KV
cache calls: test_flash_attn_kvcache.py). Skipped without PyTorch."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, relative_error

torch = pytest.importorskip("torch")

from flash_attn_support import DTYPES, assert_close, cache, qkv, reference  # noqa: E402
from selfattn.integrations.flash_attn import (FlashAttnArgumentError, FlashAttnError, FlashAttnNotSupported,  # noqa: E402
                                              flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache)


# --- flash_attn_func ---


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("seq_q,seq_k,dim", [(1, 1, 32), (7, 33, 64), (33, 7, 32), (7, 7, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_func_matches_reference(dtype, seq_q, seq_k, dim, causal):
    # GQA (4 heads over 2); causal bottom-right, so with seq_q > seq_k the first rows see no key (0).
    q, k, v = qkv(seq_q * 100 + seq_k, 2, seq_q, seq_k, dim=dim, dtype=dtype)
    out = flash_attn_func(q, k, v, causal=causal)
    assert out.dtype == q.dtype and out.shape == q.shape
    want, _ = reference(q, k, v, causal=causal)
    assert_close(out, want, dtype)


@pytest.mark.parametrize("options", [
    dict(window_size=(3, 0)), dict(window_size=(2, 4)), dict(window_size=(-1, 2)), dict(window_size=(5, -1)),
    dict(softcap=5.0), dict(softmax_scale=0.3), dict(alibi_slopes="heads"), dict(alibi_slopes="batch_heads"),
    dict(window_size=(4, 1), softcap=3.0, alibi_slopes="heads", softmax_scale=0.2)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq_q,seq_k", [(7, 33), (33, 7)])
def test_func_options_mapped(options, causal, seq_q, seq_k):
    q, k, v = qkv(7, 2, seq_q, seq_k)
    options = dict(options)
    if options.get("alibi_slopes") == "heads":
        options["alibi_slopes"] = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    elif options.get("alibi_slopes") == "batch_heads":
        options["alibi_slopes"] = torch.linspace(0.05, 0.6, 8).reshape(2, 4)
    out = flash_attn_func(q, k, v, causal=causal, **options)
    want, _ = reference(q, k, v, causal=causal, **options)
    assert_close(out, want, "float32")
    # The option changes the result (so a mapping that dropped it would fail), but for a window's
    # right side under the causal mask, which already hides every key right of the row.
    if causal and options == dict(window_size=(-1, 2)):
        return
    plain, _ = reference(q, k, v, causal=causal)
    assert relative_error(out.double().numpy(), plain.numpy()) > 10 * TOLERANCE["float32"]


def test_func_positional_arguments_in_flash_attn_order():
    # q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    q, k, v = qkv(3, 1, 7, 7)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    out = flash_attn_func(q, k, v, 0.0, 0.25, True, (2, 0), 4.0, slopes, False, False)
    want, _ = reference(q, k, v, causal=True, window_size=(2, 0), softcap=4.0, alibi_slopes=slopes, softmax_scale=0.25)
    assert_close(out, want, "float32")


@pytest.mark.parametrize("options", [dict(causal=True), dict(causal=True, window_size=(3, 0), softcap=4.0),
                                     dict(window_size=(2, 3), alibi_slopes=[0.5, 0.25, 0.125, 0.0625])], ids=str)
def test_func_gradients_match_autograd_of_the_reference(options):
    q, k, v = qkv(11, 2, 7, 9)
    for x in (q, k, v):
        x.requires_grad_()
    out = flash_attn_func(q, k, v, **options)
    g = torch.Generator().manual_seed(12)
    dout = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    want = reference(q, k, v, **options)[0]
    want_grads = torch.autograd.grad(want, (q, k, v), dout.double())
    assert_close(out, want, "float32")
    for got, expected in zip(grads, want_grads):
        assert_close(got, expected, "float32", per_row=False, factor=2)


def test_func_deterministic_without_gradients_is_accepted():
    # The forward is deterministic anyway; only a backward would need the mode.
    q, k, v = qkv(5, 1, 7, 7)
    assert torch.equal(flash_attn_func(q, k, v, deterministic=True), flash_attn_func(q, k, v))


@pytest.mark.parametrize("varlen", [False, True], ids=["func", "varlen_func"])
def test_deterministic_with_gradients_runs_the_deterministic_backward(varlen, monkeypatch):
    # deterministic=True with gradients maps to selfattn's deterministic=: the library's backward
    # is called with it (a spy on the calls the backward ops make), and two backward passes give
    # the same bytes (float16, headdim 64) and the reference's gradients.
    from selfattn import _backward
    name = "attention_varlen_backward" if varlen else "attention_backward"
    seen = []

    def spy(*args, real=getattr(_backward, name), **kwargs):
        seen.append(kwargs["deterministic"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_backward, name, spy)
    q, k, v = qkv(6, 1, 24, 40, dim=64, dtype="float16")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).to(torch.float16)
    cu_q, cu_k = torch.tensor([0, 24], dtype=torch.int32), torch.tensor([0, 40], dtype=torch.int32)

    def gradients(deterministic):
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        if varlen:
            out = flash_attn_varlen_func(*(x[0] for x in inputs), cu_q, cu_k, 24, 40, causal=True,
                                         deterministic=deterministic)[None]
        else:
            out = flash_attn_func(*inputs, causal=True, deterministic=deterministic)
        out.backward(dout)
        return [x.grad for x in inputs]

    first, second = gradients(True), gradients(True)
    gradients(False)
    assert seen == [True, True, False]
    inputs = [x.double().requires_grad_() for x in (q, k, v)]
    want = torch.autograd.grad(reference(*inputs, causal=True)[0], inputs, dout.double())
    for a, b, expected in zip(first, second, want):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        assert_close(a, expected, "float16", per_row=False, factor=2)


# --- flash_attn_varlen_func ---


@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(causal=True, window_size=(2, 0)),
                                     dict(softcap=4.0, alibi_slopes="batch_heads", softmax_scale=0.3)], ids=str)
def test_varlen_matches_each_sequence(options):
    lengths_q, lengths_k = [3, 0, 7, 1], [5, 4, 2, 0]  # an empty q sequence, an empty k sequence
    cu_q = torch.tensor(np.cumsum([0] + lengths_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lengths_k), dtype=torch.int32)
    g = torch.Generator().manual_seed(21)
    q = torch.randn(int(cu_q[-1]), 4, 32, generator=g)
    k, v = (torch.randn(int(cu_k[-1]), 2, 32, generator=g) for _ in range(2))
    options = dict(options)
    if options.get("alibi_slopes") == "batch_heads":
        options["alibi_slopes"] = torch.linspace(0.05, 0.6, 16).reshape(4, 4)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), **options)
    assert out.shape == q.shape
    for b in range(4):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        per_sequence = dict(options)
        if "alibi_slopes" in options:
            per_sequence["alibi_slopes"] = options["alibi_slopes"][b]
        want, _ = reference(q[None, rows], k[None, keys], v[None, keys], **per_sequence)
        assert_close(out[None, rows], want, "float32")


def test_varlen_gradients_match_autograd_of_the_reference():
    lengths = [4, 0, 6]
    cu = torch.tensor(np.cumsum([0] + lengths), dtype=torch.int32)
    g = torch.Generator().manual_seed(22)
    q = torch.randn(10, 4, 32, generator=g, requires_grad=True)
    k, v = (torch.randn(10, 2, 32, generator=g, requires_grad=True) for _ in range(2))
    out = flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, causal=True)
    dout = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.cat([reference(q[None, a:b], k[None, a:b], v[None, a:b], causal=True)[0][0]
                      for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
    want_grads = torch.autograd.grad(want, (q, k, v), dout.double())
    for got, expected in zip(grads, want_grads):
        assert_close(got, expected, "float32", per_row=False, factor=2)


@pytest.mark.parametrize("varlen", [False, True], ids=["func", "varlen_func"])
def test_v_head_dim_apart_from_q_and_k(varlen):
    # As FlashAttention-3 takes MLA's prefill (q and k of 192, v of 128) in small: out takes v's head
    # dim, and the gradients flow to each input in its own shape.
    g = torch.Generator().manual_seed(31)
    lengths = [5, 0, 8]
    shapes = [(13, 4, 48), (13, 2, 48), (13, 2, 24)] if varlen else [(2, 6, 4, 48), (2, 9, 2, 48), (2, 9, 2, 24)]
    q, k, v = (torch.randn(shape, generator=g, requires_grad=True) for shape in shapes)
    if varlen:
        cu = torch.tensor(np.cumsum([0] + lengths), dtype=torch.int32)
        out = flash_attn_varlen_func(q, k, v, cu, cu, 8, 8, causal=True)
        want = torch.cat([reference(q[None, a:b], k[None, a:b], v[None, a:b], causal=True)[0][0]
                          for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
    else:
        out = flash_attn_func(q, k, v, causal=True, window_size=(3, 0))
        want = reference(q, k, v, causal=True, window_size=(3, 0))[0]
    assert out.shape == (*q.shape[:-1], 24)
    assert_close(out, want, "float32")
    dout = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for got, expected in zip(grads, torch.autograd.grad(want, (q, k, v), dout.double())):
        assert_close(got, expected, "float32", per_row=False, factor=2)


@pytest.mark.parametrize("varlen", [False, True], ids=["func", "varlen_func"])
def test_mla_prefill_pair_on_the_fused_kernels(varlen):
    # MLA's prefill at its own head dims and dtype (q and k of 192, v of 128, bf16): the fused
    # path's (192, 128) forward (the Hopper kernel where the sim's 9.0 takes it) and backward,
    # against float64, with GQA and a causal mask.
    g = torch.Generator().manual_seed(32)
    lengths = [21, 0, 40]
    shapes = [(61, 4, 192), (61, 2, 192), (61, 2, 128)] if varlen else [(2, 21, 4, 192), (2, 40, 2, 192),
                                                                         (2, 40, 2, 128)]
    q, k, v = (torch.randn(shape, generator=g).to(torch.bfloat16).requires_grad_() for shape in shapes)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]  # the reference's own leaves
    if varlen:
        cu = torch.tensor(np.cumsum([0] + lengths), dtype=torch.int32)
        out = flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=True)
        qd, kd, vd = exact
        want = torch.cat([reference(qd[None, a:b], kd[None, a:b], vd[None, a:b], causal=True)[0][0]
                          for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
    else:
        out = flash_attn_func(q, k, v, causal=True)
        want = reference(*exact, causal=True)[0]
    assert out.shape == (*q.shape[:-1], 128) and out.dtype == torch.bfloat16
    assert_close(out, want, "bfloat16")
    dout = torch.randn(out.shape, generator=g).to(torch.bfloat16)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for got, expected, like in zip(grads, torch.autograd.grad(want, exact, dout.double()), (q, k, v)):
        assert got.shape == like.shape and got.dtype == torch.bfloat16
        assert_close(got, expected, "bfloat16", per_row=False, factor=2)


# --- refusals and errors: every one a RuntimeError ---


def test_refusals_are_runtime_errors_naming_the_argument():
    # (deterministic=True with gradients is not among them: it maps to selfattn's deterministic=, tested above.)
    q, k, v = qkv(51, 1, 3, 3)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    k_cache, v_cache = cache(52, 1, 8)
    seqlens = torch.tensor([2], dtype=torch.int32)
    cases = [
        (lambda: flash_attn_varlen_func(q[0], k_cache, v_cache, cu, cu, 3, 3, dropout_p=0.1,
                                        block_table=torch.zeros(1, 1, dtype=torch.int32)), "dropout_p"),
        (lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, cache_batch_idx=seqlens * 0,
                                         block_table=seqlens[None] * 0), "cache_batch_idx"),
    ]
    for call, argument in cases:
        with pytest.raises(FlashAttnNotSupported, match=argument) as caught:
            call()
        assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, selfattn.NotAvailable)
    assert torch.equal(k_cache, cache(52, 1, 8)[0])  # a refused call wrote nothing


def test_dropout_as_flash_attention_applies_it():
    # dropout_p > 0 is attention dropout (0.0, evaluation, none): the seed from torch's default
    # generator, so torch.manual_seed reproduces a call and two calls differ; the same output as
    # selfattn.attention from the same generator state; loss.backward() regenerates the mask (the
    # gradients equal attention_backward's with the seed the call drew, read back from a generator
    # in the same state); a rate outside [0, 1) is an argument error.
    q, k, v = qkv(60, 2, 7, 9)
    cu = torch.tensor([0, 7, 14], dtype=torch.int32)
    cuk = torch.tensor([0, 9, 18], dtype=torch.int32)
    for call in (lambda a, b, c, **o: flash_attn_func(a, b, c, causal=True, **o),
                 lambda a, b, c, **o: flash_attn_varlen_func(a.flatten(0, 1), b.flatten(0, 1), c.flatten(0, 1), cu,
                                                             cuk, 7, 9, causal=True, **o)):
        torch.manual_seed(3)
        first = call(q, k, v, dropout_p=0.2)
        second = call(q, k, v, dropout_p=0.2)
        torch.manual_seed(3)
        assert torch.equal(call(q, k, v, dropout_p=0.2), first)
        assert not torch.equal(first, second)
        assert not torch.equal(first, call(q, k, v, dropout_p=0.0))
    torch.manual_seed(4)
    want = selfattn.attention(q, k, v, layout="bshd", causal="bottom_right", dropout_p=0.2)
    torch.manual_seed(4)
    assert torch.equal(flash_attn_func(q, k, v, dropout_p=0.2, causal=True), want)
    grads = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(5)
    out = flash_attn_func(*grads, dropout_p=0.3, causal=True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    (out * dout).sum().backward()
    torch.manual_seed(5)
    seed = int(torch.randint(0, 1 << 62, (1,), dtype=torch.int64).item())  # the draw the call made
    options = dict(layout="bshd", causal="bottom_right", dropout_p=0.3, dropout_seed=seed)
    out2, lse = selfattn.attention(q, k, v, return_lse=True, **options)
    assert torch.equal(out.detach(), out2)
    for tensor, same in zip(grads, selfattn.attention_backward(q, k, v, out2, dout, lse, **options)):
        assert torch.equal(tensor.grad, same)
    for bad in (1.0, -0.1):
        with pytest.raises(RuntimeError, match="dropout_p"):
            flash_attn_func(q, k, v, dropout_p=bad)


def test_library_errors_are_runtime_errors_too():
    q, k, v = qkv(56, 1, 3, 3)
    with pytest.raises(FlashAttnArgumentError, match="flash_attn_func: attention: k.shape") as caught:
        flash_attn_func(q, k[..., :16], v)
    error = caught.value
    assert isinstance(error, RuntimeError) and isinstance(error, ValueError)
    assert isinstance(error, selfattn.InvalidArgument) and isinstance(error.__cause__, selfattn.InvalidArgument)
    for call in (lambda: flash_attn_func(q, k, v, window_size=(-2, 0)),
                 lambda: flash_attn_func(q, k, v, softcap=-1.0),
                 lambda: flash_attn_func(q[0], k, v),
                 lambda: flash_attn_with_kvcache(q, *cache(57, 1, 8), k=k),
                 lambda: flash_attn_with_kvcache(q, *cache(57, 1, 8), k=k, v=v)):  # k without cache_seqlens
        with pytest.raises(FlashAttnError):
            call()



def test_fp8_descales_as_flash_attention_3_takes_them():
    # FP8 q, k, v with FlashAttention-3's q_descale/k_descale/v_descale ([batch, nheads_k]): out in
    # bfloat16 against the reference over the real values (stored x descale). The descales have few
    # significant bits, so the dequantized values are exact; the error is bf16 attention's.
    g = torch.Generator().manual_seed(5)
    batch, heads, kv_heads, dim = 2, 4, 2, 64
    q = torch.randn(batch, 7, heads, dim, generator=g).to(torch.float8_e4m3fn)
    k, v = (torch.randn(batch, 33, kv_heads, dim, generator=g).to(torch.float8_e4m3fn) for _ in range(2))
    choices = torch.tensor([0.375, 0.625, 1.25, 2.5])
    q_d, k_d, v_d = (choices[torch.randint(0, 4, (batch, kv_heads), generator=g)] for _ in range(3))

    def real(x, descale):  # [b, s, h, d] stored values x their kv head's descale
        return x.float() * descale.repeat_interleave(x.shape[2] // kv_heads, 1)[:, None, :, None]

    out = flash_attn_func(q, k, v, causal=True, q_descale=q_d, k_descale=k_d, v_descale=v_d)
    assert out.dtype == torch.bfloat16
    want, _ = reference(real(q, q_d), real(k, k_d), real(v, v_d), causal=True)
    assert_close(out, want, "bfloat16")
    # Packed: sequence b (rows of q[0], k[0], v[0]) takes row b of each descale.
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 20, 33], dtype=torch.int32)
    packed = flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 4, 20, q_descale=q_d, k_descale=k_d,
                                    v_descale=v_d)
    for b in range(batch):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want, _ = reference(real(q[0:1, rows], q_d[b:b + 1]), real(k[0:1, keys], k_d[b:b + 1]),
                            real(v[0:1, keys], v_d[b:b + 1]))
        assert_close(packed[None, rows], want, "bfloat16")
    with pytest.raises(FlashAttnNotSupported, match="q_descale with block_table"):
        flash_attn_varlen_func(q[0], k, v, cu_q, cu_k, 4, 20, block_table=torch.zeros(2, 1, dtype=torch.int32),
                               q_descale=q_d)
