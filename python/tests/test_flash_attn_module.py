"""selfattn.integrations.flash_attn (FlashAttention's calls over selfattn) on CPU tensors (the sim),
against a float64 torch reference written here in FlashAttention's terms ([batch, seqlen, nheads,
headdim]; masks aligned bottom-right; a row without keys gives 0 and LSE +inf): each argument
mapped, gradients through autograd, varlen with an empty sequence, the KV cache (append, paged,
rotary, the capacity check), and the refusals and errors, all RuntimeError. Skipped without
PyTorch."""
import math

import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, relative_error

torch = pytest.importorskip("torch")

from selfattn.integrations import flash_attn as fa  # noqa: E402  (needs torch)
from selfattn.integrations.flash_attn import (FlashAttnArgumentError, FlashAttnError, FlashAttnNotSupported,  # noqa: E402
                                              flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def reference(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, softmax_scale=None,
              key_lengths=None, key_starts=None):
    """float64 (out [b, sq, h, d], lse [b, h, sq]) in FlashAttention's terms, differentiable."""
    q, k, v = (x.double() for x in (q, k, v))
    batch, seq_q, heads, dim = q.shape
    seq_k, kv_heads = k.shape[1], k.shape[2]
    k, v = (x.repeat_interleave(heads // kv_heads, dim=2) for x in (k, v))
    scale = 1 / math.sqrt(dim) if softmax_scale is None else softmax_scale
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    lengths = [seq_k] * batch if key_lengths is None else [int(n) for n in key_lengths]
    rows, cols = torch.arange(seq_q)[:, None], torch.arange(seq_k)[None, :]
    visible, distance = [], []
    for b in range(batch):
        aligned = rows + lengths[b] - seq_q
        see = cols < lengths[b]
        if key_starts is not None:
            see = see & (cols >= int(key_starts[b]))  # left padding (cache_leftpad)
        if causal:
            see = see & (cols <= aligned)
        if window_size[0] >= 0:
            see = see & (cols >= aligned - window_size[0])
        if window_size[1] >= 0:
            see = see & (cols <= aligned + window_size[1])
        visible.append(see)
        distance.append((aligned - cols).abs().double())
    visible = torch.stack(visible)[:, None]  # [b, 1, sq, sk]
    if alibi_slopes is not None:
        slopes = torch.as_tensor(alibi_slopes, dtype=torch.float64).expand(batch, heads)
        s = s - slopes[:, :, None, None] * torch.stack(distance)[:, None]
    empty = ~visible.any(-1, keepdim=True)
    s = s.masked_fill(~visible, -math.inf).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse).masked_fill(empty, 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    lse = lse.squeeze(-1).masked_fill(empty.squeeze(-1).expand_as(lse.squeeze(-1)), math.inf)
    return out, lse


def qkv(seed, batch, seq_q, seq_k, heads=4, kv_heads=2, dim=32, dtype="float32"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq_q, heads, dim, generator=g).to(DTYPES[dtype])
    k, v = (torch.randn(batch, seq_k, kv_heads, dim, generator=g).to(DTYPES[dtype]) for _ in range(2))
    return q, k, v


def assert_close(got, want, dtype, per_row=True, factor=1):
    assert got.shape == want.shape
    assert relative_error(got.detach().double().numpy(), want.detach().numpy(), per_row) <= factor * TOLERANCE[dtype]


def assert_lse(got, want):
    """float32 LSE against the reference's: +inf exactly where a row sees no key (FlashAttention)."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(torch.isposinf(got), torch.isposinf(want)) and not torch.isneginf(got).any()
    finite = torch.isfinite(want)
    np.testing.assert_allclose(got[finite].double().numpy(), want[finite].numpy(), rtol=2e-5, atol=2e-5)


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


# --- flash_attn_with_kvcache ---


def cache(seed, batch, capacity, kv_heads=2, dim=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, capacity, kv_heads, dim, generator=g).to(dtype) for _ in range(2)]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("seqlen_new", [0, 1, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_appends_then_attends(dtype, seqlen_new, causal):
    k_cache, v_cache = cache(31, 3, 12, dtype=DTYPES[dtype])
    before_k, before_v = k_cache.clone(), v_cache.clone()
    seqlens = torch.tensor([0, 5, 9], dtype=torch.int32)
    q, k, v = qkv(32, 3, max(seqlen_new, 1), seqlen_new, dtype=dtype)
    new = dict(k=k, v=v) if seqlen_new else {}
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=causal,
                                       return_softmax_lse=True, **new)
    assert torch.equal(seqlens, torch.tensor([0, 5, 9], dtype=torch.int32))  # the caller advances it
    for b, n in enumerate(seqlens.tolist()):
        before_k[b, n:n + seqlen_new], before_v[b, n:n + seqlen_new] = k[b], v[b]
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)  # written in place, nothing else
    want, want_lse = reference(q, k_cache, v_cache, causal=causal, key_lengths=seqlens + seqlen_new)
    assert_close(out, want, dtype)
    assert_lse(lse, want_lse)
    if seqlen_new == 0:
        assert torch.isposinf(lse[0]).all() and torch.equal(out[0], torch.zeros_like(out[0]))  # no key: +inf, 0


@pytest.mark.parametrize("causal, window_size", [(True, (-1, -1)), (False, (-1, -1)), (True, (4, 0))])
def test_kvcache_cache_leftpad(causal, window_size):
    # Slots before cache_leftpad[b] are padding (NaN here, never read); new tokens go at cache_seqlens[b].
    k_cache, v_cache = cache(35, 3, 20)
    leftpad = torch.tensor([6, 0, 13], dtype=torch.int32)
    for b, n in enumerate(leftpad.tolist()):
        k_cache[b, :n], v_cache[b, :n] = math.nan, math.nan
    seqlens = torch.tensor([11, 4, 13], dtype=torch.int32)  # sequence 2: its first token is the new one
    q, k, v = qkv(36, 3, 2, 2)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, cache_leftpad=leftpad,
                                       causal=causal, window_size=window_size, return_softmax_lse=True)
    want, want_lse = reference(q, k_cache.nan_to_num(), v_cache.nan_to_num(), causal=causal,
                               window_size=window_size, key_lengths=seqlens + 2, key_starts=leftpad)
    assert_close(out, want, "float32")
    assert_lse(lse, want_lse)


def test_kvcache_cache_batch_idx():
    # Sequence b appends to and reads row cache_batch_idx[b] of a cache with more rows than q's batch.
    k_cache, v_cache = cache(37, 4, 10)
    before_k = k_cache.clone()
    rows = torch.tensor([3, 0], dtype=torch.int32)
    seqlens = torch.tensor([5, 2], dtype=torch.int32)
    q, k, v = qkv(38, 2, 1, 1)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, cache_batch_idx=rows, causal=True)
    for b, (row, n) in enumerate(zip(rows.tolist(), seqlens.tolist())):
        before_k[row, n] = k[b, 0]
    assert torch.equal(k_cache, before_k)  # rows 1 and 2 untouched
    want, _ = reference(q, k_cache[rows.long()], v_cache[rows.long()], causal=True, key_lengths=seqlens + 1)
    assert_close(out, want, "float32")


@pytest.mark.parametrize("options", [dict(window_size=(3, 0)), dict(softcap=4.0), dict(softmax_scale=0.2),
                                     dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625]), dict(num_splits=3)], ids=str)
def test_kvcache_options_mapped(options):
    k_cache, v_cache = cache(33, 2, 40)
    q, k, v = qkv(34, 2, 2, 2)
    seqlens = torch.tensor([30, 11], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True, **options)
    want, _ = reference(q, k_cache, v_cache, causal=True, key_lengths=seqlens + 2,
                        **{key: value for key, value in options.items() if key != "num_splits"})
    assert_close(out, want, "float32")


def test_kvcache_int_seqlens_none_seqlens_and_a_larger_cache_batch():
    k_cache, v_cache = cache(35, 4, 8)  # 4 cache rows for a batch of 2: rows 0 and 1 are used
    q, k, v = qkv(36, 2, 1, 1)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=6)
    assert torch.equal(k_cache[:2, 6], k[:, 0])
    want, _ = reference(q, k_cache[:2], v_cache[:2], key_lengths=[7, 7])
    assert_close(out, want, "float32")
    # Without cache_seqlens every cached token is attended.
    out = flash_attn_with_kvcache(q, k_cache, v_cache)
    assert_close(out, reference(q, k_cache[:2], v_cache[:2])[0], "float32")


def paged(pool, table, capacity):
    """The contiguous [batch, capacity, kv_heads, d] view of a paged pool through its block table."""
    page = pool.shape[1]
    return torch.stack([torch.cat([pool[p] for p in row.tolist()])[:capacity] for row in table])


def test_kvcache_paged_with_block_table():
    # FlashAttention's paged layout [num_blocks, page_block_size, nheads_k, d] is selfattn's bshd pool.
    g = torch.Generator().manual_seed(37)
    pool_k, pool_v = (torch.randn(7, 4, 2, 32, generator=g) for _ in range(2))
    table = torch.tensor([[5, 0, 3], [2, 6, 1]], dtype=torch.int32)
    seqlens = torch.tensor([3, 9], dtype=torch.int32)
    q, k, v = qkv(38, 2, 2, 2)
    out, lse = flash_attn_with_kvcache(q, pool_k, pool_v, k, v, cache_seqlens=seqlens, block_table=table,
                                       causal=True, return_softmax_lse=True)
    assert torch.equal(pool_k[5, 3], k[0, 0]) and torch.equal(pool_k[0, 0], k[0, 1])  # across a page boundary
    assert torch.equal(pool_v[1, 1], v[1, 0]) and torch.equal(pool_v[1, 2], v[1, 1])  # tokens 9, 10: page 2
    want, want_lse = reference(q, paged(pool_k, table, 12), paged(pool_v, table, 12), causal=True,
                               key_lengths=seqlens + 2)
    assert_close(out, want, "float32")
    assert_lse(lse, want_lse)


@pytest.mark.parametrize("options", [dict(causal=True), dict(), dict(causal=True, window_size=(3, 0), softcap=5.0)],
                         ids=str)
def test_varlen_paged_with_block_table(options):
    # A serving engine's step: each sequence's new rows packed in q over a paged cache whose first
    # cu_seqlens_k[b + 1] - cu_seqlens_k[b] tokens are sequence b's keys (its new tokens included).
    g = torch.Generator().manual_seed(39)
    pool_k, pool_v = (torch.randn(9, 4, 2, 32, generator=g) for _ in range(2))
    table = torch.tensor([[5, 0, 3], [2, 6, 1], [8, 7, 4]], dtype=torch.int32)
    lengths_q, lengths_k = [1, 0, 5], [6, 3, 11]
    cu_q = torch.tensor(np.cumsum([0] + lengths_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lengths_k), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), 4, 32, generator=g)
    out = flash_attn_varlen_func(q, pool_k, pool_v, cu_q, cu_k, max(lengths_q), max(lengths_k), block_table=table,
                                 **options)
    keys_k, keys_v = paged(pool_k, table, 12), paged(pool_v, table, 12)
    for b in range(3):
        rows = slice(cu_q[b], cu_q[b + 1])
        want, _ = reference(q[None, rows], keys_k[b:b + 1, :lengths_k[b]], keys_v[b:b + 1, :lengths_k[b]], **options)
        assert_close(out[None, rows], want, "float32")


def rotate(x, cos, sin, positions, interleaved):
    """x [b, s, h, d] rotated at positions [b, s] (float64), FlashAttention's rotary rule."""
    x = x.double()
    half = cos.shape[1]
    c, s = cos.double()[positions][:, :, None], sin.double()[positions][:, :, None]  # [b, s, 1, half]
    if interleaved:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        rotated = torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)
    else:
        a, b = x[..., :half], x[..., half:2 * half]
        rotated = torch.cat([a * c - b * s, a * s + b * c], -1)
    return torch.cat([rotated, x[..., 2 * half:]], -1)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("seqlen_q,seqlen_new,causal,window_size,leftpad", [
    (3, 3, True, (-1, -1), False), (1, 1, False, (-1, -1), False), (2, 2, False, (4, 0), False),
    (3, 3, False, (-1, -1), False),   # not causal or local: FlashAttention rotates every q row at cache_seqlens
    (3, 1, True, (-1, -1), False),    # 3 rows over 1 new token: q's rows at cache_seqlens + i
    (2, 2, True, (-1, -1), True),     # left padding: positions are the cache's slots, padding or not
    (3, 3, False, (-1, -1), True)])
def test_kvcache_rotary_at_flash_attentions_positions(interleaved, seqlen_q, seqlen_new, causal, window_size, leftpad):
    k_cache, v_cache = cache(39, 2, 16)
    g = torch.Generator().manual_seed(40)
    angles = torch.arange(16)[:, None] * torch.rand(1, 8, generator=g)  # rotary_dim 16 of 32
    cos, sin = torch.cos(angles), torch.sin(angles)
    q, k, v = qkv(41, 2, seqlen_q, seqlen_new)
    seqlens = torch.tensor([4, 10], dtype=torch.int32)
    pads = torch.tensor([3, 1] if leftpad else [0, 0], dtype=torch.int32)
    before_k = k_cache.clone()
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, seqlens, causal=causal,
                                  window_size=window_size, rotary_interleaved=interleaved,
                                  cache_leftpad=pads if leftpad else None)
    first = seqlens[:, None].long()  # FlashAttention adds cache_leftpad back into the rotary offset
    k_positions = first + torch.arange(seqlen_new)[None, :]
    rows_own_position = causal or window_size != (-1, -1)
    q_positions = first + (torch.arange(seqlen_q)[None, :] if rows_own_position else 0 * torch.arange(seqlen_q))
    k_rotated = rotate(k, cos, sin, k_positions, interleaved)
    for b, n in enumerate(seqlens.tolist()):
        before_k[b, n:n + seqlen_new] = k_rotated[b].float()
    assert_close(k_cache, before_k.double(), "float32")
    want, _ = reference(rotate(q, cos, sin, q_positions, interleaved), k_cache, v_cache, causal=causal,
                        window_size=window_size, key_lengths=seqlens + seqlen_new,
                        key_starts=pads if leftpad else None)
    assert_close(out, want, "float32")


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


def test_kvcache_capacity_checked_on_the_host():
    k_cache, v_cache = cache(53, 2, 8)
    q, k, v = qkv(54, 2, 3, 3)
    with pytest.raises(RuntimeError, match=r"cache_seqlens\[1\] \+ seqlen_new \(6 \+ 3\) exceeds the KV cache's "
                                           r"capacity \(8 tokens\)"):
        flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=torch.tensor([5, 6], dtype=torch.int32))
    g = torch.Generator().manual_seed(55)
    pool_k, pool_v = (torch.randn(4, 4, 2, 32, generator=g) for _ in range(2))
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(FlashAttnArgumentError, match=r"cache_seqlens\[0\] \+ seqlen_new \(7 \+ 3\).*8 tokens"):
        flash_attn_with_kvcache(q, pool_k, pool_v, k, v, cache_seqlens=7, block_table=table)
    with pytest.raises(FlashAttnArgumentError, match=r"cache_seqlens\[0\] expected >= 0"):
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=-1)
    # The check can be turned off (no host read); the library then drops what does not fit.
    fa.check_cache_capacity = False
    try:
        flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=torch.tensor([5, 6], dtype=torch.int32))
    finally:
        fa.check_cache_capacity = True
    assert torch.equal(k_cache[1, 6:], k[1, :2])


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
