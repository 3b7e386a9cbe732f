"""selfattn.integrations.flash_attn's flash_attn_with_kvcache (and flash_attn_varlen_func over a
paged cache) on CPU tensors (the sim), against the float64 reference of flash_attn_support.py:
append then attend, cache_leftpad, cache_batch_idx, the options, int and missing cache_seqlens,
paged caches, rotary at FlashAttention's positions, and the capacity checked on the host. Skipped
without PyTorch."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flash_attn_support import DTYPES, assert_close, assert_lse, cache, qkv, reference  # noqa: E402
from selfattn.integrations import flash_attn as fa  # noqa: E402  (needs torch)
from selfattn.integrations.flash_attn import (FlashAttnArgumentError, flash_attn_varlen_func,  # noqa: E402
                                              flash_attn_with_kvcache)

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


@pytest.mark.parametrize("latent", [False, True])
def test_kvcache_v_head_dim_apart_from_k(latent):
    # MLA's caches, scaled down: V's rows shorter than K's in a cache of their own, or (latent) V a
    # view of K's leading columns, appended as the same view of k. out has V's head dim.
    k_cache, v_cache = cache(38, 3, 12, kv_heads=1, dim=40)
    v_cache = k_cache[..., :32] if latent else v_cache[..., :32].contiguous()
    q, k, _ = qkv(39, 3, 2, 2, heads=8, kv_heads=1, dim=40)
    v = k[..., :32] if latent else torch.randn(3, 2, 1, 32, generator=torch.Generator().manual_seed(40))
    seqlens = torch.tensor([0, 4, 10], dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True,
                                       return_softmax_lse=True)
    assert out.shape == (3, 2, 8, 32)
    for b, n in enumerate(seqlens.tolist()):
        assert torch.equal(k_cache[b, n:n + 2], k[b]) and torch.equal(v_cache[b, n:n + 2], v[b])
    want, want_lse = reference(q, k_cache, v_cache, causal=True, key_lengths=seqlens + 2)
    assert_close(out, want, "float32")
    assert_lse(lse, want_lse)


@pytest.mark.parametrize("one_pool", [True, False])
def test_kvcache_qv_is_flash_attention_3s_absorbed_mla(one_pool):
    # FlashAttention-3's qv=: scores q . k + qv . v over k_cache (the rope part, 16 here) and
    # v_cache (the latent part, 32), appending k and v first; v_cache and k_cache adjacent columns
    # of one pool (read in place) or two tensors (a copy). out has v's head dim, the scale
    # 1 / sqrt(16 + 32) by default.
    g = torch.Generator().manual_seed(41)
    batch, capacity, heads, rope, latent = 3, 12, 8, 16, 32
    if one_pool:
        pool = torch.randn(batch, capacity, 1, latent + rope, generator=g)
        v_cache, k_cache = pool[..., :latent], pool[..., latent:]
    else:
        k_cache = torch.randn(batch, capacity, 1, rope, generator=g)
        v_cache = torch.randn(batch, capacity, 1, latent, generator=g)
    q, qv = torch.randn(batch, 2, heads, rope, generator=g), torch.randn(batch, 2, heads, latent, generator=g)
    k, v = torch.randn(batch, 2, 1, rope, generator=g), torch.randn(batch, 2, 1, latent, generator=g)
    seqlens = torch.tensor([0, 4, 10], dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True,
                                       return_softmax_lse=True, qv=qv)
    assert out.shape == (batch, 2, heads, latent)
    for b, n in enumerate(seqlens.tolist()):  # appended in place, into the caller's tensors
        assert torch.equal(k_cache[b, n:n + 2], k[b]) and torch.equal(v_cache[b, n:n + 2], v[b])
    keys = torch.cat([v_cache, k_cache], dim=-1)
    want, want_lse = reference(torch.cat([qv, q], dim=-1), keys, v_cache, causal=True, key_lengths=seqlens + 2)
    assert_close(out, want, "float32")
    assert_lse(lse, want_lse)
    with pytest.raises(FlashAttnArgumentError, match="qv expected q's batch, seqlen and nheads with v_cache's headdim"):
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, qv=qv[..., :16])


def test_kvcache_qv_rotary_in_one_pool_or_two():
    # With rotary (q and k rotated at FlashAttention's positions), one pool read in place and two
    # tensors read through a copy give the same caches and the same out.
    g = torch.Generator().manual_seed(42)
    pool = torch.randn(2, 10, 1, 48, generator=g)
    q, qv = torch.randn(2, 1, 4, 16, generator=g), torch.randn(2, 1, 4, 32, generator=g)
    k, v = torch.randn(2, 1, 1, 16, generator=g), torch.randn(2, 1, 1, 32, generator=g)
    angles = torch.rand(12, 4, generator=g) * 6.28
    seqlens = torch.tensor([3, 7], dtype=torch.int32)
    two = (pool[..., 32:].clone(), pool[..., :32].clone())
    outs = []
    for k_cache, v_cache in ((pool[..., 32:], pool[..., :32]), two):
        outs.append(flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=angles.cos(),
                                            rotary_sin=angles.sin(), cache_seqlens=seqlens, causal=True, qv=qv))
    assert torch.equal(pool[..., 32:], two[0]) and torch.equal(pool[..., :32], two[1])
    torch.testing.assert_close(outs[0], outs[1])
    assert not torch.equal(pool[0, 3, 0, 32:], k[0, 0, 0])  # k was rotated on the way in


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
