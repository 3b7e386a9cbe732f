"""selfattn.append_kv, attention_with_kv_cache, merge_states and cu_seqlens_from_lengths on the sim:
the cache's contents after appending (written slots exactly, every other element untouched), and
attention against the float64 reference over each sequence's valid tokens, contiguous and paged,
with rotary embedding, the score modifiers and attention sinks."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, check, poisoned, random, reference, relative_error


def paths():
    return selfattn.paths("sim")


def as_bhsd(a, layout):
    return a.transpose(0, 2, 1, 3) if layout == "bshd" else a


def rope(x, positions, cos, sin, interleaved):
    """float64 rotary embedding of x [..., rows, head_dim], row r at positions[r] (clamped to the
    tables, as the library does for out-of-range positions)."""
    x = np.array(x, dtype=np.float64)
    rows = np.clip(positions, 0, cos.shape[0] - 1)
    c, s = cos[rows].astype(np.float64), sin[rows].astype(np.float64)
    half = cos.shape[1]
    first, second = (slice(0, 2 * half, 2), slice(1, 2 * half, 2)) if interleaved else \
        (slice(0, half), slice(half, 2 * half))
    a, b = x[..., first].copy(), x[..., second].copy()
    x[..., first], x[..., second] = a * c - b * s, a * s + b * c
    return x


def rotary_tables(rng, max_position, rotary_dim):
    angles = rng.uniform(0, 2 * np.pi, (max_position, rotary_dim // 2))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class PagedCache:
    """A pool of pages in a shuffled order ([pages, kv_heads, page_size, d] or bshd), its block
    table, and the contiguous view of it (gather) that the reference reads."""

    def __init__(self, rng, batch, kv_heads, capacity, dim, page_size, dtype, layout):
        self.page_size, self.layout = page_size, layout
        pages_per_seq = -(-capacity // page_size)
        pages = batch * pages_per_seq + 2  # two pages no sequence uses
        self.table = rng.permutation(pages)[:batch * pages_per_seq].reshape(batch, pages_per_seq).astype(np.int32)
        shape = (pages, page_size, kv_heads, dim) if layout == "bshd" else (pages, kv_heads, page_size, dim)
        self.k, self.v = random(rng, shape, dtype), random(rng, shape, dtype)

    def gather(self, pool):
        """[batch, kv_heads, pages_per_seq * page_size, d] of sequence b's tokens in order."""
        pool = as_bhsd(pool, self.layout)
        return np.concatenate([pool[self.table[:, p]] for p in range(self.table.shape[1])], axis=2)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_append_then_attend_contiguous(rng, layout, dtype):
    batch, heads, kv_heads, capacity, dim, seq_new = 3, 4, 2, 9, 16, 2
    shape = (batch, capacity, kv_heads, dim) if layout == "bshd" else (batch, kv_heads, capacity, dim)
    k_cache, v_cache = random(rng, shape, dtype), random(rng, shape, dtype)
    before_k, before_v = k_cache.copy(), v_cache.copy()
    lengths = np.array([3, 0, 8], np.int32)  # the last fills the cache and drops its second token
    new_shape = (batch, seq_new, kv_heads, dim) if layout == "bshd" else (batch, kv_heads, seq_new, dim)
    k_new, v_new = random(rng, new_shape, dtype), random(rng, new_shape, dtype)
    updated = selfattn.append_kv(k_cache, v_cache, lengths, k_new, v_new, layout=layout, return_lengths=True)
    np.testing.assert_array_equal(updated, np.minimum(lengths + seq_new, capacity))
    want_k, want_v = as_bhsd(before_k, layout).copy(), as_bhsd(before_v, layout).copy()
    for b in range(batch):
        n = min(seq_new, capacity - lengths[b])
        want_k[b, :, lengths[b]:lengths[b] + n] = as_bhsd(k_new, layout)[b, :, :n]
        want_v[b, :, lengths[b]:lengths[b] + n] = as_bhsd(v_new, layout)[b, :, :n]
    np.testing.assert_array_equal(as_bhsd(k_cache, layout), want_k)
    np.testing.assert_array_equal(as_bhsd(v_cache, layout), want_v)

    q_shape = (batch, seq_new, heads, dim) if layout == "bshd" else (batch, heads, seq_new, dim)
    q = random(rng, q_shape, dtype)
    for path in paths():
        out = poisoned(q_shape, dtype)
        _, lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, updated, layout=layout, path=path, out=out,
                                                  return_lse=True)
        want, want_lse = reference(as_bhsd(q, layout), want_k, want_v, "bottom_right", key_lengths=updated)
        assert relative_error(as_bhsd(out, layout), want) <= TOLERANCE[dtype], path
        np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("page_size", [1, 4, 7])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_paged_cache(rng, page_size, layout):
    batch, heads, kv_heads, capacity, dim, seq_new = 3, 2, 1, 13, 8, 3
    cache = PagedCache(rng, batch, kv_heads, capacity, dim, page_size, "float32", layout)
    pool_k, pool_v = cache.k.copy(), cache.v.copy()
    lengths = np.array([0, 5, 9], np.int32)
    new_shape = (batch, seq_new, kv_heads, dim) if layout == "bshd" else (batch, kv_heads, seq_new, dim)
    k_new, v_new = random(rng, new_shape, "float32"), random(rng, new_shape, "float32")
    updated = selfattn.append_kv(cache.k, cache.v, lengths, k_new, v_new, block_table=cache.table, layout=layout,
                                 return_lengths=True)
    np.testing.assert_array_equal(updated, lengths + seq_new)
    # Each new token sits in its page; nothing else in the pool changed (the spare pages included).
    expect_k, expect_v = as_bhsd(pool_k, layout).copy(), as_bhsd(pool_v, layout).copy()
    for b in range(batch):
        for t in range(seq_new):
            position = lengths[b] + t
            page, row = cache.table[b, position // page_size], position % page_size
            expect_k[page, :, row] = as_bhsd(k_new, layout)[b, :, t]
            expect_v[page, :, row] = as_bhsd(v_new, layout)[b, :, t]
    np.testing.assert_array_equal(as_bhsd(cache.k, layout), expect_k)
    np.testing.assert_array_equal(as_bhsd(cache.v, layout), expect_v)

    q_shape = (batch, seq_new, heads, dim) if layout == "bshd" else (batch, heads, seq_new, dim)
    q = random(rng, q_shape, "float32")
    want, _ = reference(as_bhsd(q, layout), cache.gather(cache.k), cache.gather(cache.v), "bottom_right",
                        key_lengths=updated)
    for path in paths():
        out = selfattn.attention_with_kv_cache(q, cache.k, cache.v, updated, block_table=cache.table, layout=layout,
                                               path=path, validate_metadata=True)
        assert relative_error(as_bhsd(out, layout), want) <= TOLERANCE["float32"], path


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding(rng, interleaved):
    # k_new rotated on the way into the cache at its positions; q rotated at its own before attending.
    batch, heads, capacity, dim, rotary_dim, seq_new = 2, 2, 10, 16, 8, 3
    cos, sin = rotary_tables(rng, 16, rotary_dim)
    k_cache, v_cache = random(rng, (batch, heads, capacity, dim), "float32"), random(rng, (batch, heads, capacity, dim),
                                                                                      "float32")
    lengths = np.array([2, 7], np.int32)
    k_new, v_new = random(rng, (batch, heads, seq_new, dim), "float32"), random(rng, (batch, heads, seq_new, dim),
                                                                                "float32")
    updated = selfattn.append_kv(k_cache, v_cache, lengths, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                 rotary_interleaved=interleaved, return_lengths=True)
    for b in range(batch):
        slots = slice(lengths[b], lengths[b] + seq_new)
        positions = np.arange(lengths[b], lengths[b] + seq_new)
        np.testing.assert_allclose(k_cache[b, :, slots], rope(k_new[b], positions, cos, sin, interleaved),
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(v_cache[b, :, slots], v_new[b])  # v is never rotated
    q = random(rng, (batch, heads, seq_new, dim), "float32")
    rotated_q = np.stack([rope(q[b], np.arange(updated[b] - seq_new, updated[b]), cos, sin, interleaved)
                          for b in range(batch)])
    want, _ = reference(rotated_q, k_cache, v_cache, "bottom_right", key_lengths=updated)
    for path in paths():
        out = selfattn.attention_with_kv_cache(q, k_cache, v_cache, updated, rotary_cos=cos, rotary_sin=sin,
                                               rotary_interleaved=interleaved, path=path)
        assert relative_error(out, want) <= TOLERANCE["float32"], path


@pytest.mark.parametrize("step", [1, 0])
def test_rotary_at_the_callers_positions(rng, step):
    # rotary_positions: k_new's token t at positions[b] + t; q's row i at positions[b] + step * i;
    # rotary_embedding() rotating the same rows on its own agrees with both.
    batch, heads, capacity, dim, rotary_dim, seq_new = 2, 2, 10, 16, 8, 3
    cos, sin = rotary_tables(rng, 16, rotary_dim)
    k_cache, v_cache = (random(rng, (batch, heads, capacity, dim), "float32") for _ in range(2))
    lengths, positions = np.array([2, 7], np.int32), np.array([0, 5], np.int32)  # left padding 2 in each
    k_new, v_new = (random(rng, (batch, heads, seq_new, dim), "float32") for _ in range(2))
    updated = selfattn.append_kv(k_cache, v_cache, lengths, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                 rotary_positions=positions, return_lengths=True)
    alone = selfattn.rotary_embedding(k_new, cos, sin, positions=positions)
    for b in range(batch):
        want_k = rope(k_new[b], positions[b] + np.arange(seq_new), cos, sin, False)
        np.testing.assert_allclose(k_cache[b, :, lengths[b]:lengths[b] + seq_new], want_k, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(alone[b], want_k, rtol=1e-6, atol=1e-6)
    q = random(rng, (batch, heads, seq_new, dim), "float32")
    rows = lambda b: positions[b] + step * np.arange(seq_new)
    rotated_q = np.stack([rope(q[b], rows(b), cos, sin, False) for b in range(batch)])
    want, _ = reference(rotated_q, k_cache, v_cache, "bottom_right", key_lengths=updated)
    for path in paths():
        out = selfattn.attention_with_kv_cache(q, k_cache, v_cache, updated, rotary_cos=cos, rotary_sin=sin,
                                               rotary_positions=positions, rotary_position_step=step, path=path)
        assert relative_error(out, want) <= TOLERANCE["float32"], path
    bshd = np.ascontiguousarray(q.transpose(0, 2, 1, 3))  # the standalone call in the other layout
    q_alone = selfattn.rotary_embedding(bshd, cos, sin, positions=positions, position_step=step, layout="bshd")
    np.testing.assert_allclose(q_alone.transpose(0, 2, 1, 3), rotated_q, rtol=1e-6, atol=1e-6)
    # float16 tables are read as they are: the same as their values in float32.
    half = selfattn.rotary_embedding(q, cos.astype(np.float16), sin.astype(np.float16), positions=positions)
    wide = selfattn.rotary_embedding(q, cos.astype(np.float16).astype(np.float32),
                                     sin.astype(np.float16).astype(np.float32), positions=positions)
    np.testing.assert_array_equal(half, wide)
    with pytest.raises(selfattn.InvalidArgument, match="rotary_position_step expected 0 or 1"):
        selfattn.rotary_embedding(q, cos, sin, position_step=2)
    with pytest.raises(selfattn.InvalidArgument, match="out expected not to overlap x"):
        selfattn.rotary_embedding(q, cos, sin, out=q)


@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_modifiers_and_splits(rng, causal):
    # Window, softcap, per-batch ALiBi and a bias over cache positions (masking one key of one
    # head), rows placed at their cache positions; num_splits only changes how the fused path works.
    batch, heads, kv_heads, capacity, dim, seq_q = 2, 4, 2, 113, 16, 2
    k_cache, v_cache = (random(rng, (batch, kv_heads, capacity, dim), "float32") for _ in range(2))
    lengths = np.array([7, 100], np.int32)
    q = random(rng, (batch, heads, seq_q, dim), "float32")
    bias = random(rng, (batch, heads, seq_q, capacity), "float32")
    bias[1, 3, :, 95] = -np.inf
    mods = dict(window=(40, 0), softcap=5.0, alibi_slopes=rng.uniform(0.01, 0.1, (batch, heads)).astype(np.float32),
                bias=bias)
    want, want_lse = reference(q, k_cache, v_cache, causal, key_lengths=lengths, **mods)
    for path in paths():
        for splits in (0, 1, 3, 64):
            out, lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, causal=causal, path=path,
                                                        num_splits=splits, return_lse=True, **mods)
            assert relative_error(out, want) <= TOLERANCE["float32"], (path, splits)
            np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sinks_and_splits(rng, paged, dtype):
    # Sinks (head 1 without one) in the decode's softmax on every path, however the fused path splits
    # the keys (the combine of several splits takes each sink once); sequence 0 is empty, so its rows
    # are their sinks alone: out exactly 0 and lse exactly the sink. head_dim 64: the decode kernel's
    # tensor-core variant for bfloat16.
    batch, heads, kv_heads, capacity, dim, seq_q = 3, 4, 2, 70, 64, 2
    lengths = np.array([0, 9, 70], np.int32)
    if paged:
        cache = PagedCache(rng, batch, kv_heads, capacity, dim, 16, dtype, "bhsd")
        k_cache, v_cache, table = cache.k, cache.v, cache.table
        contiguous = cache.gather(k_cache), cache.gather(v_cache)
    else:
        k_cache, v_cache = (random(rng, (batch, kv_heads, capacity, dim), dtype) for _ in range(2))
        table, contiguous = None, (k_cache, v_cache)
    q = random(rng, (batch, heads, seq_q, dim), dtype)
    sinks = rng.uniform(-1.0, 3.0, heads).astype(np.float32)
    sinks[1] = -np.inf
    want, want_lse = reference(q, *contiguous, "bottom_right", key_lengths=lengths, sinks=sinks)
    for path in paths():
        for splits in (0, 1, 3, 64):
            out = poisoned(q.shape, dtype)
            _, lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, block_table=table, path=path,
                                                      num_splits=splits, out=out, return_lse=True, sinks=sinks)
            check(out, lse, want, want_lse, dtype)
            assert np.all(np.asarray(out[0], np.float64) == 0), (path, splits)
            assert np.array_equal(lse[0], np.broadcast_to(sinks[:, None], (heads, seq_q))), (path, splits)
    with pytest.raises(selfattn.InvalidArgument, match=r"sinks expected shape \[4\] \(heads\), got \[2\]"):
        selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, block_table=table, sinks=sinks[:2])


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_v_head_dim_apart_from_k(rng, layout):
    # V's rows shorter than K's (MLA's expanded cache, scaled down): append and attention, every path.
    batch, heads, kv_heads, capacity, dim, dim_v, seq_new = 2, 4, 2, 9, 24, 16, 2
    def shape(seq, d, h=kv_heads):
        return (batch, seq, h, d) if layout == "bshd" else (batch, h, seq, d)
    k_cache, v_cache = random(rng, shape(capacity, dim), "float32"), random(rng, shape(capacity, dim_v), "float32")
    lengths = np.array([3, 7], np.int32)
    k_new, v_new = random(rng, shape(seq_new, dim), "float32"), random(rng, shape(seq_new, dim_v), "float32")
    updated = selfattn.append_kv(k_cache, v_cache, lengths, k_new, v_new, layout=layout, return_lengths=True)
    np.testing.assert_array_equal(updated, lengths + seq_new)
    for b in range(batch):
        got = as_bhsd(v_cache, layout)[b, :, lengths[b]:lengths[b] + seq_new]
        np.testing.assert_array_equal(got, as_bhsd(v_new, layout)[b])
    q = random(rng, shape(seq_new, dim, heads), "float32")
    want, want_lse = reference(as_bhsd(q, layout), as_bhsd(k_cache, layout), as_bhsd(v_cache, layout),
                               "bottom_right", key_lengths=updated)
    for path in paths():
        out, lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, updated, layout=layout, path=path,
                                                    return_lse=True)
        assert out.shape == shape(seq_new, dim_v, heads), path
        assert relative_error(as_bhsd(out, layout), want) <= TOLERANCE["float32"], path
        np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rope_dim", [0, 8])
def test_latent_cache_reads_v_from_k(rng, rope_dim):
    # DeepSeek's absorbed MLA, scaled down: one pool of rows [c_kv (32) | k_rope (8)], V its first 32
    # columns as a view; append writes K's rows whole, rotary on the rope part only (first_dim).
    batch, heads, page_size, pages, latent, rope_width, seq_new = 2, 8, 4, 6, 32, 8, 2
    pool = random(rng, (pages, page_size, 1, latent + rope_width), "bfloat16")  # bshd pages, one kv head
    table = np.array([[4, 1, 0], [2, 5, 3]], np.int32)
    lengths = np.array([5, 0], np.int32)
    k_new = random(rng, (batch, seq_new, 1, latent + rope_width), "bfloat16")
    before = pool.copy()
    rotary = {}
    if rope_dim:
        cos, sin = rotary_tables(rng, 16, rope_dim)
        rotary = dict(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=True, rotary_first_dim=latent)
    updated = selfattn.append_kv(pool, pool[..., :latent], lengths, k_new, k_new[..., :latent], block_table=table,
                                 layout="bshd", return_lengths=True, **rotary)
    want_pool = before.astype(np.float64)
    for b in range(batch):
        for t in range(seq_new):
            position = lengths[b] + t
            row = k_new[b, t, 0].astype(np.float64)
            if rope_dim:
                row[latent:] = rope(row[None, None, None, latent:], np.array([position]), cos, sin, True)[0, 0, 0]
            want_pool[table[b, position // page_size], position % page_size, 0] = row
    assert relative_error(pool.astype(np.float64), want_pool) <= TOLERANCE["bfloat16"]
    q = random(rng, (batch, 1, heads, latent + rope_width), "bfloat16")
    gathered = np.stack([np.concatenate([pool[p] for p in table[b]]) for b in range(batch)]).transpose(0, 2, 1, 3)
    q_rotated = q.astype(np.float64)
    if rope_dim:  # the one new row of sequence b at position updated[b] - 1
        for b in range(batch):
            q_rotated[b, :, :, latent:] = rope(q_rotated[b, :, :, latent:], np.array([updated[b] - 1]), cos, sin, True)
    want, _ = reference(q_rotated.transpose(0, 2, 1, 3), gathered, gathered[..., :latent], "bottom_right",
                        key_lengths=updated)
    for path in paths():
        out = selfattn.attention_with_kv_cache(q, pool, pool[..., :latent], updated, block_table=table,
                                               layout="bshd", path=path, **rotary)
        assert out.shape == (batch, 1, heads, latent), path
        assert relative_error(out.astype(np.float64).transpose(0, 2, 1, 3), want) <= TOLERANCE["bfloat16"], path


@pytest.mark.parametrize("splits", [1, 3])
def test_deepseek_latent_decode_every_path(rng, splits):
    # DeepSeek's absorbed decode at its own sizes: rows [c_kv (512) | k_rope (64)] in 64-token pages,
    # 16 query heads over one kv head, 2 new rows each (speculative decoding); the fused path runs
    # the latent tensor-core kernel, the others gather.
    batch, heads, page_size, latent = 2, 16, 64, 512
    pool = random(rng, (5, page_size, 1, latent + 64), "bfloat16")
    table = np.array([[3, 0], [1, 4]], np.int32)
    lengths = np.array([70, 128], np.int32)
    q = random(rng, (batch, 2, heads, latent + 64), "bfloat16")
    gathered = np.stack([np.concatenate([pool[p] for p in table[b]]) for b in range(batch)]).transpose(0, 2, 1, 3)
    want, want_lse = reference(q.astype(np.float64).transpose(0, 2, 1, 3), gathered, gathered[..., :latent],
                               "bottom_right", key_lengths=lengths)
    for path in paths():
        out, lse = selfattn.attention_with_kv_cache(q, pool, pool[..., :latent], lengths, block_table=table,
                                                    layout="bshd", path=path, num_splits=splits, return_lse=True)
        assert out.shape == (batch, 2, heads, latent), path
        assert relative_error(out.astype(np.float64).transpose(0, 2, 1, 3), want) <= TOLERANCE["bfloat16"], path
        np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-4)


def test_merge_states_gives_attention_over_the_union(rng):
    batch, heads, seq_q, seq_k, dim = 2, 3, 5, 11, 8
    q = random(rng, (batch, heads, seq_q, dim), "float32")
    k, v = random(rng, (batch, heads, seq_k, dim), "float32"), random(rng, (batch, heads, seq_k, dim), "float32")
    out_a, lse_a = selfattn.attention(q, k[:, :, :4], v[:, :, :4], return_lse=True)
    out_b, lse_b = selfattn.attention(q, k[:, :, 4:], v[:, :, 4:], return_lse=True)
    want, want_lse = reference(q, k, v)
    out, lse = selfattn.merge_states(out_a, lse_a, out_b, lse_b)
    assert relative_error(out, want) <= TOLERANCE["float32"]
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    merged, _ = selfattn.merge_states(out_a, lse_a, out_b, lse_b, out=out_a)  # in place
    assert merged is out_a and relative_error(out_a, want) <= TOLERANCE["float32"]
    bshd = [a.transpose(0, 2, 1, 3).copy() for a in (out_b, out_b)]
    out, lse = selfattn.merge_states(bshd[0], lse_b, bshd[1], lse_b, layout="bshd")  # a result merged with itself
    assert relative_error(out, bshd[0]) <= 1e-6
    np.testing.assert_allclose(lse, lse_b + np.log(2), rtol=1e-6, atol=1e-6)


def test_cu_seqlens_from_lengths():
    np.testing.assert_array_equal(selfattn.cu_seqlens_from_lengths([3, 0, 5, 1]), [0, 3, 3, 8, 9])
    np.testing.assert_array_equal(selfattn.cu_seqlens_from_lengths(np.array([7], np.int32)), [0, 7])
    assert selfattn.cu_seqlens_from_lengths(np.zeros(0, np.int32)).tolist() == [0]
    np.testing.assert_array_equal(selfattn.cu_seqlens_from_lengths(np.array([2, 4])), [0, 2, 6])  # int64


def test_errors_name_the_argument(rng):
    cache = PagedCache(rng, 2, 1, 8, 8, 4, "float32", "bhsd")
    q = random(rng, (2, 1, 1, 8), "float32")
    lengths = np.array([3, 4], np.int32)
    with pytest.raises(selfattn.InvalidArgument, match="block_table expected integers"):
        selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table.astype(np.float32))
    with pytest.raises(selfattn.InvalidArgument, match=r"lengths expected shape \[2\]"):
        selfattn.attention_with_kv_cache(q, cache.k, cache.v, [3, 4, 5], block_table=cache.table)
    with pytest.raises(selfattn.InvalidArgument, match="top_left"):
        selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table, causal="top_left")
    cos, sin = rotary_tables(rng, 4, 4)
    with pytest.raises(selfattn.InvalidArgument, match="rotary_sin expected rotary_cos's shape"):
        selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table, rotary_cos=cos,
                                         rotary_sin=sin[:2])
    with pytest.raises(selfattn.InvalidArgument, match="both or neither"):
        selfattn.append_kv(cache.k, cache.v, lengths, q, q, block_table=cache.table, rotary_cos=cos)
    bad = cache.table.copy()
    bad[1, 0] = 99
    pool = cache.k.copy()
    with pytest.raises(selfattn.InvalidArgument, match="block_table"):
        selfattn.append_kv(cache.k, cache.v, lengths, q, q, block_table=bad, validate_metadata=True)
    np.testing.assert_array_equal(cache.k, pool)  # nothing written on a throw
    with pytest.raises(selfattn.InvalidArgument,
                       match=r"lse_b expected shape \[2, 1, 1\] \(batch, heads, seq of out_a\), got \[10\]"):
        selfattn.merge_states(q, np.zeros((2, 1, 1), np.float32), q, np.zeros(10, np.float32))


def test_wrong_metadata_stays_inside_the_pool(rng):
    # Without validation, page indices outside the pool and lengths past the capacity give wrong
    # numbers but touch nothing outside the arrays (the sim's guarded memory would report it).
    cache = PagedCache(rng, 2, 1, 8, 8, 4, "float32", "bhsd")
    bad = cache.table.copy()
    bad[0, 1], bad[1, 0] = -5, 1 << 30
    q = random(rng, (2, 1, 2, 8), "float32")
    selfattn.append_kv(cache.k, cache.v, [7, 1 << 20], q, q, block_table=bad)
    for path in paths():
        out = selfattn.attention_with_kv_cache(q, cache.k, cache.v, [1 << 20, -3], block_table=bad, path=path)
        assert np.all(np.isfinite(out[0])) and np.all(out[1] == 0), path
