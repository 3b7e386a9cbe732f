"""Packed KV-cache calls (selfattn.append_kv(cu_seqlens_new=...), attention_with_kv_cache(
cu_seqlens_q=...)): one step of continuous batching, each sequence with its own number of new rows
(0 allowed), against the float64 reference of each sequence alone, on NumPy arrays and through the
torch ops (torch.compile(fullgraph=True) included)."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, poisoned, random, reference, relative_error
from test_kv_cache import PagedCache, paths, rope, rotary_tables

COUNTS = [1, 0, 5, 1, 9]  # decodes, a sequence with nothing new, prefill chunks
LENGTHS = [7, 3, 12, 1, 9]  # cached tokens before the step


def offsets(counts):
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def step(rng, dtype, layout, page_size=4, capacity=24, heads=4, kv_heads=2, dim=16, spare=2):
    """A paged cache, packed new tokens and queries (spare rows past the last sequence's)."""
    cache = PagedCache(rng, len(COUNTS), kv_heads, capacity, dim, page_size, dtype, layout)
    total = sum(COUNTS) + spare
    k_new, v_new = random(rng, (total, kv_heads, dim), dtype), random(rng, (total, kv_heads, dim), dtype)
    q = random(rng, (total, heads, dim), dtype)
    return cache, k_new, v_new, q


def expected_rows(q, cache, lengths, cu, **options):
    """Each sequence's rows against the reference of it alone: (want, want_lse) in the packed
    layouts ([total, heads, d], [heads, total]), NaN on rows no sequence owns."""
    total, heads, dim = q.shape
    want = np.full((total, heads, dim), np.nan)
    want_lse = np.full((heads, total), np.nan)
    keys_k, keys_v = cache.gather(cache.k), cache.gather(cache.v)
    for b in range(len(lengths)):
        first, last = cu[b], cu[b + 1]
        if first == last:
            continue
        q_b = q[first:last].astype(np.float64).transpose(1, 0, 2)[None]
        bias, slopes = options.get("bias"), options.get("alibi_slopes")
        mods = dict(options, bias=None if bias is None else bias[b:b + 1, :, :last - first])
        if slopes is not None and slopes.ndim == 2:  # [batch, heads]: the sequence's row
            mods["alibi_slopes"] = slopes[b:b + 1]
        out, lse = reference(q_b, keys_k[b:b + 1], keys_v[b:b + 1], "bottom_right",
                             key_lengths=np.array([lengths[b]], np.int32), **mods)
        want[first:last] = out[0].transpose(1, 0, 2)
        want_lse[:, first:last] = lse[0]
    return want, want_lse


def check_rows(out, lse, want, want_lse, dtype, owned):
    """out (poisoned before the call) and lse (a new array: rows no sequence owns hold anything)."""
    assert np.all(np.isnan(out[~owned])), "a row no sequence owns was written"
    assert relative_error(out[owned].astype(np.float64), want[owned]) <= TOLERANCE[dtype]
    np.testing.assert_allclose(lse[:, owned], want_lse[:, owned], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_append_then_attend_one_packed_step(rng, layout, dtype):
    cache, k_new, v_new, q = step(rng, dtype, layout)
    cu = offsets(COUNTS)
    lengths = np.array(LENGTHS, np.int32)
    pool_k, pool_v = cache.k.copy(), cache.v.copy()
    updated = selfattn.append_kv(cache.k, cache.v, lengths, k_new, v_new, block_table=cache.table, layout=layout,
                                 cu_seqlens_new=cu, return_lengths=True, validate_metadata=True)
    np.testing.assert_array_equal(updated, lengths + np.array(COUNTS))
    # Token t of sequence b in its page at position lengths[b] + t; nothing else changed.
    as_bhsd = (lambda a: a.transpose(0, 2, 1, 3)) if layout == "bshd" else (lambda a: a)
    expect_k, expect_v = as_bhsd(pool_k).copy(), as_bhsd(pool_v).copy()
    for b, count in enumerate(COUNTS):
        for t in range(count):
            position = lengths[b] + t
            page, row = cache.table[b, position // cache.page_size], position % cache.page_size
            expect_k[page, :, row] = k_new[cu[b] + t]
            expect_v[page, :, row] = v_new[cu[b] + t]
    np.testing.assert_array_equal(as_bhsd(cache.k), expect_k)
    np.testing.assert_array_equal(as_bhsd(cache.v), expect_v)

    owned = np.arange(q.shape[0]) < cu[-1]
    want, want_lse = expected_rows(q, cache, updated, cu)
    for path in paths():
        out = poisoned(q.shape, dtype)
        _, lse = selfattn.attention_with_kv_cache(q, cache.k, cache.v, updated, block_table=cache.table,
                                                  layout=layout, path=path, cu_seqlens_q=cu, out=out,
                                                  return_lse=True, validate_metadata=True)
        check_rows(out, lse, want, want_lse, dtype, owned)


def test_modifiers_and_rotary_per_sequence(rng):
    cache, _, _, q = step(rng, "float32", "bhsd")
    cu, lengths = offsets(COUNTS), np.array(LENGTHS, np.int32)
    heads, capacity = q.shape[1], cache.gather(cache.k).shape[2]
    bias = rng.standard_normal((len(COUNTS), heads, max(COUNTS), capacity)).astype(np.float32)
    slopes = rng.uniform(0.05, 0.5, (len(COUNTS), heads)).astype(np.float32)  # [batch, heads]: one row a sequence
    mods = dict(window=(6, 0), softcap=8.0, alibi_slopes=slopes, bias=bias,
                sinks=rng.standard_normal(heads).astype(np.float32))
    want, want_lse = expected_rows(q, cache, lengths, cu, **mods)
    owned = np.arange(q.shape[0]) < cu[-1]
    for path in paths():
        out, lse = selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table, path=path,
                                                    cu_seqlens_q=cu, max_seqlen_q=max(COUNTS), return_lse=True,
                                                    num_splits=2 if path == "fused" else 0, **mods)
        out[~owned] = np.nan  # a new array: what rows no sequence owns hold is not set
        check_rows(out, lse, want, want_lse, "float32", owned)

    # Rotary on q: row i of sequence b at its cache position lengths[b] - n_b + i.
    cos, sin = rotary_tables(rng, 16, 8)
    positions = np.concatenate([lengths[b] - COUNTS[b] + np.arange(COUNTS[b]) for b in range(len(COUNTS))])
    rotated = q.copy()
    rotated[:cu[-1]] = rope(q[:cu[-1]].transpose(1, 0, 2), positions, cos, sin, False).transpose(1, 0, 2)
    want, want_lse = expected_rows(rotated, cache, lengths, cu)
    out, lse = selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table,
                                                cu_seqlens_q=cu, rotary_cos=cos, rotary_sin=sin, return_lse=True)
    out[~owned] = np.nan
    check_rows(out, lse, want, want_lse, "float32", owned)


def test_errors_name_the_packed_arguments(rng):
    cache, k_new, v_new, q = step(rng, "float32", "bhsd")
    cu, lengths = offsets(COUNTS), np.array(LENGTHS, np.int32)
    with pytest.raises(selfattn.InvalidArgument, match=r"cu_seqlens_q expected shape \[6\] \(batch \+ 1\)"):
        selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table, cu_seqlens_q=cu[:-1])
    with pytest.raises(selfattn.InvalidArgument, match="q expected 3 dimensions"):
        selfattn.attention_with_kv_cache(q[None], cache.k, cache.v, lengths, block_table=cache.table, cu_seqlens_q=cu)
    with pytest.raises(selfattn.InvalidArgument, match="max_seqlen_new expected None without cu_seqlens_new"):
        selfattn.append_kv(cache.k, cache.v, lengths, k_new[None], v_new[None], block_table=cache.table,
                           max_seqlen_new=3)
    bad = cu.copy()
    bad[3] = 0  # out of order
    with pytest.raises(selfattn.InvalidArgument, match=r"cu_seqlens_q\[3\] - cu_seqlens_q\[2\] expected 0 to"):
        selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table, cu_seqlens_q=bad,
                                         max_seqlen_q=9, validate_metadata=True)


def test_torch_ops_and_compile(rng):
    torch = pytest.importorskip("torch")
    cache, k_new, v_new, q = step(rng, "float32", "bshd")
    cu, lengths = offsets(COUNTS), np.array(LENGTHS, np.int32)
    t = torch.from_numpy
    pool_k, pool_v, table = t(cache.k.copy()), t(cache.v.copy()), t(cache.table)
    cu_t, lengths_t = t(cu), t(lengths)

    def packed_step(q, k_new, v_new, pool_k, pool_v, lengths):
        updated = selfattn.append_kv(pool_k, pool_v, lengths, k_new, v_new, block_table=table, layout="bshd",
                                     cu_seqlens_new=cu_t, max_seqlen_new=max(COUNTS), return_lengths=True)
        out = selfattn.attention_with_kv_cache(q, pool_k, pool_v, updated, block_table=table, layout="bshd",
                                               cu_seqlens_q=cu_t, max_seqlen_q=max(COUNTS), num_splits=2)
        return out, updated

    eager_k, eager_v = pool_k.clone(), pool_v.clone()
    want, want_lengths = packed_step(t(q), t(k_new), t(v_new), eager_k, eager_v, lengths_t)
    selfattn.append_kv(cache.k, cache.v, lengths, k_new, v_new, block_table=cache.table, layout="bshd",
                       cu_seqlens_new=cu)
    owned = np.arange(q.shape[0]) < cu[-1]
    expect, _ = expected_rows(q, cache, lengths + np.array(COUNTS), cu)
    assert relative_error(want.numpy()[owned].astype(np.float64), expect[owned]) <= TOLERANCE["float32"]
    compiled = torch.compile(packed_step, backend="eager", fullgraph=True)
    got, got_lengths = compiled(t(q), t(k_new), t(v_new), pool_k, pool_v, lengths_t)
    assert torch.equal(got[:cu[-1]], want[:cu[-1]]) and torch.equal(got_lengths, want_lengths)
    assert torch.equal(pool_k, eager_k) and torch.equal(pool_v, eager_v)
