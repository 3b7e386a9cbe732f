"""Packed KV-cache calls (selfattn.append_kv(cu_seqlens_new=...), attention_with_kv_cache(
cu_seqlens_q=...)): one step of continuous batching, each sequence with its own number of new rows
(0 allowed), against the float64 reference of each sequence alone, on NumPy arrays and through the
torch ops (torch.compile(fullgraph=True) included); rows no sequence owns (0 and -inf in what the
call allocates, untouched in a caller's out=); wrong host metadata named on every path with nothing
written, and device metadata (played on the sim by hiding the host values) clamped or named by
validate_metadata and the naive path."""
import re

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


def check_rows(out, lse, want, want_lse, dtype, owned, out_given=True):
    """out (poisoned before the call when out_given, else a new array) and lse (a new array): rows
    no sequence owns stay NaN in the caller's out, 0 in a new one, -inf in lse."""
    if out_given:
        assert np.all(np.isnan(out[~owned])), "a row no sequence owns was written"
    else:
        assert np.all(out[~owned] == 0), "a row no sequence owns is not 0 in an out the call allocated"
    assert np.all(lse[:, ~owned] == -np.inf), "a row no sequence owns is not -inf in lse"
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
        check_rows(out, lse, want, want_lse, "float32", owned, out_given=False)

    # Rotary on q: row i of sequence b at its cache position lengths[b] - n_b + i.
    cos, sin = rotary_tables(rng, 16, 8)
    positions = np.concatenate([lengths[b] - COUNTS[b] + np.arange(COUNTS[b]) for b in range(len(COUNTS))])
    rotated = q.copy()
    rotated[:cu[-1]] = rope(q[:cu[-1]].transpose(1, 0, 2), positions, cos, sin, False).transpose(1, 0, 2)
    want, want_lse = expected_rows(rotated, cache, lengths, cu)
    out, lse = selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table,
                                                cu_seqlens_q=cu, rotary_cos=cos, rotary_sin=sin, return_lse=True)
    check_rows(out, lse, want, want_lse, "float32", owned, out_given=False)


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
    with pytest.raises(selfattn.InvalidArgument, match=r"cu_seqlens_q\[3\] = 0 is below cu_seqlens_q\[2\] = 1"):
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


def host_kinds():
    """The ways a caller may hold metadata on the host: NumPy arrays, lists, CPU torch tensors."""
    kinds = [lambda a: np.asarray(a, np.int32), lambda a: np.asarray(a).tolist()]
    try:
        import torch
        kinds.append(lambda a: torch.from_numpy(np.asarray(a, np.int32)))
    except ImportError:
        pass
    return kinds


# (cu_seqlens, max_seqlen, lengths, a block_table entry set (b, page, value) or None, the message's
# tail after "cu_seqlens_q" / "cu_seqlens_new" for the offsets). step(): 18 packed rows, capacity 24 in
# pages of 4, 32 pages in the pool. Sequence 3 holds 1 cached token, in its first page.
CU = offsets(COUNTS).tolist()  # [0, 1, 1, 6, 7, 16]
WRONG_OFFSETS = [
    ([0, 1, 1, 6, 7, 24], None, "[5] = 24 runs past {rows}'s 18 rows (sequence 4: rows [7, 24))"),
    ([0, 1, 0, 6, 7, 16], None, "[2] = 0 is below {name}[1] = 1 (sequence 1 would own -1 rows; the offsets must "
                                "not decrease)"),
    (CU, 4, "[3] - {name}[2] = 5 exceeds {bound} = 4 (sequence 2: rows [1, 6))"),
    ([2, 3, 3, 8, 9, 18], None, "[0] = 2 expected 0 (sequence 0 starts at {rows}'s first row)"),
]


def attend_and_append(cache, k_new, v_new, q, out, path):
    """(name, rows, call(cu, max_seqlen, lengths, table)) for the packed attention (into `out`) and
    the packed append (into the cache)."""
    def attend(cu, max_seqlen, lengths, table):
        selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=table, path=path, out=out,
                                         cu_seqlens_q=cu, max_seqlen_q=max_seqlen, return_lse=True)

    def append(cu, max_seqlen, lengths, table):
        selfattn.append_kv(cache.k, cache.v, lengths, k_new, v_new, block_table=table, cu_seqlens_new=cu,
                           max_seqlen_new=max_seqlen, return_lengths=True)

    return [("attention_with_kv_cache", "q", attend), ("append_kv", "new", append)]


@pytest.mark.parametrize("kind", range(len(host_kinds())))
def test_host_metadata_checked_on_every_path(rng, kind):
    # Offsets, lengths and the pages of the cached tokens given on the host are checked before
    # anything runs, on every path (the fused one would clamp them), naming the argument and the
    # entry; out and the pool are unchanged.
    as_kind = host_kinds()[kind]
    cache, k_new, v_new, q = step(rng, "float32", "bhsd")
    lengths = np.array(LENGTHS, np.int32)
    pool_k, pool_v = cache.k.copy(), cache.v.copy()
    out = poisoned(q.shape, "float32")
    for path in paths():
        for function, rows, call in attend_and_append(cache, k_new, v_new, q, out, path):
            if function == "append_kv" and path != paths()[0]:
                continue  # append_kv has one path
            name, bound, array = f"cu_seqlens_{rows}", f"max_seqlen_{rows}", "q" if rows == "q" else "k_new"
            for cu, max_seqlen, tail in WRONG_OFFSETS:
                message = f"{function}: {name}" + tail.format(name=name, bound=bound, rows=array)
                with pytest.raises(selfattn.InvalidArgument, match=re.escape(message)):
                    call(as_kind(cu), max_seqlen, as_kind(lengths), as_kind(cache.table))
            for b, value in ((2, 25), (1, -1)):
                wrong = lengths.copy()
                wrong[b] = value
                message = (f"{function}: lengths[{b}] = {value} expected 0 to the cache's capacity, 24 tokens "
                           f"(block_table.shape[1] * page_size)")
                with pytest.raises(selfattn.InvalidArgument, match=re.escape(message)):
                    call(as_kind(CU), None, as_kind(wrong), as_kind(cache.table))
            table = cache.table.copy()
            table[3, 1] = 99  # past the page sequence 3's one cached token uses: never read
            table[3, 0] = 32
            if function == "attention_with_kv_cache":
                message = (f"{function}: block_table[3, 0] = 32 is outside the pool's 32 pages (k_cache.shape[0]), "
                           f"and sequence 3's 1 cached tokens (lengths[3]) use it")
                with pytest.raises(selfattn.InvalidArgument, match=re.escape(message)):
                    call(as_kind(CU), None, as_kind(lengths), as_kind(table))
            np.testing.assert_array_equal(cache.k, pool_k)
            np.testing.assert_array_equal(cache.v, pool_v)
            assert np.all(np.isnan(out)), f"{function} on {path}: a refused call wrote out"
    table[3, 0] = cache.table[3, 0]  # the entry past the used page alone: accepted
    got = selfattn.attention_with_kv_cache(q, cache.k, cache.v, as_kind(lengths), block_table=as_kind(table),
                                           cu_seqlens_q=as_kind(CU))
    assert np.all(np.isfinite(got))


def test_device_metadata_is_clamped_or_named_by_the_library(rng, monkeypatch):
    # Metadata on a CUDA device is not read by the package: played here by hiding the host values
    # from its check. The fused path clamps the offsets (rows no sequence then owns are not written);
    # the naive and cublas paths read cu_seqlens_q back and name the entry; validate_metadata names
    # it on every path and says what the kernels would have clamped. Nothing written when refused.
    from selfattn import _kv_metadata
    monkeypatch.setattr(_kv_metadata, "_host_ints", lambda values: None)
    cache, k_new, v_new, q = step(rng, "float32", "bhsd")
    lengths = np.array(LENGTHS, np.int32)
    past = np.array([0, 1, 1, 6, 7, 24], np.int32)
    named = "attention_with_kv_cache_varlen: cu_seqlens_q[5] = 24 runs past q's 18 rows (sequence 4: rows [7, 24))"
    for path in paths():
        out = poisoned(q.shape, "float32")
        if path == "fused":
            selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table, path=path,
                                             out=out, cu_seqlens_q=past, max_seqlen_q=17)
            assert np.all(np.isfinite(out)), "the clamped sequence 4 owns rows [7, 18)"
            out = poisoned(q.shape, "float32")
        else:
            with pytest.raises(selfattn.InvalidArgument, match=re.escape(
                    named + " (the naive and cublas paths read cu_seqlens_q back and refuse it; the fused path "
                    "clamps it unless validate_metadata is set)")):
                selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table, path=path,
                                                 out=out, cu_seqlens_q=past, max_seqlen_q=17)
        with pytest.raises(selfattn.InvalidArgument, match=re.escape(
                named + " (validate_metadata; without it the kernels clamp cu_seqlens_q: read in order, each entry "
                "into [0, 18], each sequence cut to max_seqlen_q rows)")):
            selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table, path=path,
                                             out=out, cu_seqlens_q=past, max_seqlen_q=17, validate_metadata=True)
        assert np.all(np.isnan(out)), path
    pool_k = cache.k.copy()
    with pytest.raises(selfattn.InvalidArgument, match=re.escape(
            "append_kv_varlen: cu_seqlens_new[5] = 24 runs past k_new's 18 rows (sequence 4: rows [7, 24)) "
            "(validate_metadata; without it the kernels clamp cu_seqlens_new")):
        selfattn.append_kv(cache.k, cache.v, lengths, k_new, v_new, block_table=cache.table, cu_seqlens_new=past,
                           max_seqlen_new=17, validate_metadata=True)
    np.testing.assert_array_equal(cache.k, pool_k)


def test_metadata_on_the_host_beside_a_device_q_is_checked_before_the_op():
    # A torch call on CUDA tensors hands its metadata to the custom op where q lives: host metadata
    # is checked before it moves (the op's implementation then sees device tensors). A stand-in for
    # a CUDA q: the check reads only its shape and its DLPack device.
    from selfattn._kv_metadata import check_packed

    class OnDevice:
        def __init__(self, *shape):
            self.shape = shape

        def __dlpack_device__(self):
            return 2, 0

    q, pool = OnDevice(18, 4, 16), OnDevice(32, 2, 4, 16)
    table = np.arange(30, dtype=np.int32).reshape(5, 6)
    with pytest.raises(selfattn.InvalidArgument, match=re.escape("cu_seqlens_q[5] = 24 runs past q's 18 rows")):
        check_packed("attention_with_kv_cache", "q", [0, 1, 1, 6, 7, 24], None, q, pool, "bhsd", LENGTHS, table,
                     before_op=True)
    check_packed("attention_with_kv_cache", "q", CU, None, q, pool, "bhsd", LENGTHS, table, before_op=True)
    # q on the host: the op's implementation checks (it gets the host tensors), not the public function.
    check_packed("attention_with_kv_cache", "q", [0, 1, 1, 6, 7, 24], None, np.empty((18, 4, 16)),
                 np.empty((32, 2, 4, 16)), "bhsd", LENGTHS, table, before_op=True)


def test_rows_no_sequence_owns_every_path(rng):
    # Package-allocated out and lse: 0 and -inf on rows no sequence owns (here the two spare rows
    # past cu_seqlens_q[-1]); a caller's out= keeps what it held there.
    cache, _, _, q = step(rng, "float32", "bshd")
    cu, lengths = offsets(COUNTS), np.array(LENGTHS, np.int32)
    owned = np.arange(q.shape[0]) < cu[-1]
    want, want_lse = expected_rows(q, cache, lengths, cu)
    for path in paths():
        out, lse = selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table,
                                                    layout="bshd", path=path, cu_seqlens_q=cu, return_lse=True)
        check_rows(out, lse, want, want_lse, "float32", owned, out_given=False)
        out = selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table,
                                               layout="bshd", path=path, cu_seqlens_q=cu)
        assert np.all(out[~owned] == 0), path
        given = poisoned(q.shape, "float32")
        _, lse = selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table,
                                                  layout="bshd", path=path, cu_seqlens_q=cu, out=given,
                                                  return_lse=True)
        check_rows(given, lse, want, want_lse, "float32", owned)
