"""Attention sinks (sinks=, return_dsinks=) on NumPy arrays (the sim): attention, attention_varlen and
their backward against the float64 reference in conftest.py (a sink joins each row's softmax as a
key whose value is 0), on every path and dtype, with GQA and a head without a sink; rows that see no
key are their sink alone (out exactly 0, lse exactly the sink); dsinks against the reference and
against central differences of the library's own forward. The KV cache's sinks are tested in
test_kv_cache.py, self_attention's in test_varlen_self_attention.py, PyTorch's in test_torch_sinks.py."""
import numpy as np
import pytest

import selfattn
from conftest import (TOLERANCE, bias_with_holes, check, check_central_differences, check_varlen_backward, poisoned,
                      random, reference, reference_backward, relative_error, slopes, visible_range)


def sink_logits(rng, heads, without=()):
    """float32 [heads] sink logits of the scores' size, so each takes a visible share of its rows'
    softmax; -inf (no sink) for the heads in `without`."""
    sinks = rng.uniform(-1.0, 3.0, heads).astype(np.float32)
    sinks[list(without)] = -np.inf
    return sinks


def check_rows_without_keys(out, lse, sinks, key_lengths, causal=None, window=None):
    """The rows of BHSD out / [batch, heads, seq_q] lse that see no key: out exactly 0 and lse exactly
    their head's sink logit (-inf for a head without one). Returns how many rows per head that is."""
    batch, heads, seq_q = lse.shape
    keyless = 0
    for b in range(batch):
        for i in range(seq_q):
            begin, end, _ = visible_range(i, seq_q, key_lengths[b], causal, window)
            if begin == end:
                keyless += 1
                assert np.all(np.asarray(out[b, :, i], dtype=np.float64) == 0), (b, i)
                assert np.array_equal(lse[b, :, i], sinks), (b, i)
    return keyless


def qkv(rng, dtype, batch, heads, kv_heads, seq_q, seq_k, dim):
    return (random(rng, (batch, heads, seq_q, dim), dtype), random(rng, (batch, kv_heads, seq_k, dim), dtype),
            random(rng, (batch, kv_heads, seq_k, dim), dtype))


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_every_path_and_dtype(rng, path, dtype, causal):
    # GQA (4 query heads over 2 kv heads), head 2 without a sink; batch 1 sees no key, and under
    # bottom_right the first rows of batch 2 (20 keys, 37 rows) see none either.
    batch, heads, seq_q, seq_k = 3, 4, 37, 53
    q, k, v = qkv(rng, dtype, batch, heads, 2, seq_q, seq_k, 32)
    sinks, lengths = sink_logits(rng, heads, without=[2]), [seq_k, 0, 20]
    out = poisoned(q.shape, dtype)
    _, lse = selfattn.attention(q, k, v, causal=causal, key_lengths=lengths, path=path, out=out, return_lse=True,
                                sinks=sinks)
    check(out, lse, *reference(q, k, v, causal, key_lengths=lengths, sinks=sinks), dtype)
    assert check_rows_without_keys(out, lse, sinks, lengths, causal) == seq_q + (17 if causal else 0)


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
def test_with_every_modifier(rng, path):
    # Window, softcap, per-batch ALiBi and a bias with holes beside the sinks (which none of them
    # modifies); a bias that masks every key of a row leaves that row its sink alone.
    batch, heads, seq_q, seq_k = 2, 4, 29, 41
    q, k, v = qkv(rng, "float16", batch, heads, 2, seq_q, seq_k, 64)
    bias = bias_with_holes(rng, (batch, heads, seq_q, seq_k), "float16")
    bias[1, 0, 5] = -np.inf
    mods = dict(window=(9, 4), softcap=2.0, alibi_slopes=slopes(rng, batch, heads), bias=bias,
                sinks=sink_logits(rng, heads, without=[3]))
    out, lse = selfattn.attention(q, k, v, causal="top_left", key_lengths=[41, 17], path=path, return_lse=True,
                                  **mods)
    check(out, lse, *reference(q, k, v, "top_left", key_lengths=[41, 17], **mods), "float16")
    assert np.all(out[1, 0, 5] == 0) and lse[1, 0, 5] == mods["sinks"][0]


def test_any_sequence_of_numbers_and_bshd(rng):
    # sinks as a list (-inf included), with BSHD arrays: one logit per head whatever the layout.
    q = random(rng, (2, 9, 3, 16), "float32")  # [batch, seq, heads, dim]
    k, v = random(rng, (2, 11, 3, 16), "float32"), random(rng, (2, 11, 3, 16), "float32")
    sinks = [0.5, float("-inf"), 2.0]
    out, lse = selfattn.attention(q, k, v, layout="bshd", return_lse=True, sinks=sinks)
    t = lambda a: np.swapaxes(a, 1, 2)
    check(t(out), lse, *reference(t(q), t(k), t(v), sinks=sinks), "float32")


def test_sinks_change_the_result(rng):
    # Guards the tests above against sinks that silently never reach the library: they lower every
    # row's weights, and -inf sinks are no sinks.
    q, k, v = qkv(rng, "float32", 2, 2, 2, 6, 6, 8)
    plain, plain_lse = selfattn.attention(q, k, v, return_lse=True)
    out, lse = selfattn.attention(q, k, v, return_lse=True, sinks=[1.0, 1.0])
    assert np.all(lse > plain_lse) and np.all(np.linalg.norm(out, axis=-1) < np.linalg.norm(plain, axis=-1))
    out, lse = selfattn.attention(q, k, v, return_lse=True, sinks=[-np.inf, -np.inf])
    assert relative_error(out, plain) <= TOLERANCE["float32"] and np.allclose(lse, plain_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
def test_varlen_with_an_empty_sequence(rng, path):
    # Sequence 1 has no query rows, sequence 3 no key (its rows are their sinks alone); head 1 has
    # no sink.
    lengths_q, lengths_k = [5, 0, 12, 7], [7, 4, 9, 0]
    heads, kv_heads, dim = 4, 2, 32
    cu_q, cu_k = np.cumsum([0] + lengths_q), np.cumsum([0] + lengths_k)
    q = random(rng, (cu_q[-1], heads, dim), "float16")
    k, v = random(rng, (cu_k[-1], kv_heads, dim), "float16"), random(rng, (cu_k[-1], kv_heads, dim), "float16")
    sinks = sink_logits(rng, heads, without=[1])
    out = poisoned(q.shape, "float16")
    _, lse = selfattn.attention_varlen(q, k, v, cu_q, cu_k, causal="bottom_right", path=path, return_lse=True,
                                       out=out, sinks=sinks)

    def bhsd(a):
        return a.transpose(1, 0, 2)[None]

    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want, want_lse = reference(bhsd(q[rows]), bhsd(k[keys]), bhsd(v[keys]), "bottom_right", sinks=sinks)
        check(bhsd(out[rows]), lse[None, :, rows], want, want_lse, "float16")
    check_rows_without_keys(bhsd(out[cu_q[3]:]), lse[None, :, cu_q[3]:], sinks, [0])


def test_calls_without_keys_or_rows(rng):
    # No key at all (seq_k 0, varlen total_k 0): every row outputs 0 with lse its sink, and dsinks is
    # the sum of dlse over the head's rows (D = 0, each row's sink probability 1). No query rows:
    # dsinks 0 for every head.
    q = random(rng, (2, 3, 4, 8), "float32")
    empty = np.empty((2, 1, 0, 8), np.float32)  # GQA: 3 query heads over 1 kv head
    sinks = sink_logits(rng, 3, without=[0])
    out, lse = selfattn.attention(q, empty, empty, return_lse=True, sinks=sinks)
    assert np.all(out == 0) and np.array_equal(lse, np.broadcast_to(sinks[:, None], lse.shape))
    dlse = random(rng, lse.shape, "float32")
    dq, dk, dv, dsinks = selfattn.attention_backward(q, empty, empty, out, random(rng, q.shape, "float32"), lse,
                                                     sinks=sinks, dlse=dlse, return_dsinks=True)
    assert np.all(dq == 0) and dk.shape == dv.shape == empty.shape
    np.testing.assert_allclose(dsinks, np.where(np.isfinite(sinks), dlse.sum(axis=(0, 2)), 0), rtol=1e-5, atol=1e-5)
    packed, cu = q[0].transpose(1, 0, 2), np.array([0, 1, 4], np.int32)  # [4 tokens, 3 heads, 8]
    out, lse = selfattn.attention_varlen(packed, empty[0, 0, :, None], empty[0, 0, :, None], cu, [0, 0, 0],
                                         return_lse=True, sinks=sinks)
    assert np.all(out == 0) and np.array_equal(lse, np.broadcast_to(sinks[:, None], lse.shape))
    no_rows = q[:, :, :0]
    k, v = random(rng, (2, 1, 5, 8), "float32"), random(rng, (2, 1, 5, 8), "float32")
    out, lse = selfattn.attention(no_rows, k, v, return_lse=True, sinks=sinks)
    *_, dsinks = selfattn.attention_backward(no_rows, k, v, out, out, lse, sinks=sinks, return_dsinks=True)
    assert np.array_equal(dsinks, np.zeros(3, np.float32))


# The fused backward runs on tensor cores: f16/bf16 only.
@pytest.mark.parametrize("dtype,path", [("float32", "naive"), ("float32", "cublas"), ("float16", "cublas"),
                                        ("float16", "fused"), ("bfloat16", "naive"), ("bfloat16", "fused")])
def test_backward_with_dsinks_and_dlse(rng, dtype, path):
    # GQA, head 3 without a sink (dsinks 0), batch 1 without keys (its rows add their dlse to
    # dsinks), causal rows without keys in batch 2, and a loss that uses lse too (dlse).
    batch, heads, seq_q, seq_k = 3, 4, 19, 27
    q, k, v = qkv(rng, dtype, batch, heads, 2, seq_q, seq_k, 32)  # 32: a fused backward head_dim
    dout, dlse = random(rng, q.shape, dtype), random(rng, (batch, heads, seq_q), "float32")
    options = dict(causal="bottom_right", key_lengths=[27, 0, 9], sinks=sink_logits(rng, heads, without=[3]))
    out, lse = selfattn.attention(q, k, v, return_lse=True, path=path, **options)
    dq, dk, dv, dsinks = selfattn.attention_backward(q, k, v, out, dout, lse, dlse=dlse, path=path,
                                                     return_dsinks=True, **options)
    want = reference_backward(q, k, v, dout, dlse=dlse, **options)
    for got, expected in zip((dq, dk, dv), want):
        # Twice the forward's tolerance, as test_backward.py: dS = P (dP - D) cancels.
        assert relative_error(got, expected, per_row=False) <= 2 * TOLERANCE[dtype]
    assert dsinks.shape == (heads,) and dsinks.dtype == np.float32 and dsinks[3] == 0
    assert relative_error(dsinks, want[3], per_row=False) <= 2 * TOLERANCE[dtype]


def test_backward_without_dsinks_and_in_bshd(rng):
    # return_dsinks=False gives the same dq, dk, dv (the sinks still shape P through lse, unlike a
    # call without them); in BSHD, dsinks has the heads axis's extent.
    q = random(rng, (2, 7, 3, 16), "float32")  # [batch, seq, heads, dim]
    k, v = random(rng, (2, 5, 3, 16), "float32"), random(rng, (2, 5, 3, 16), "float32")
    dout, sinks = random(rng, q.shape, "float32"), sink_logits(rng, 3)
    out, lse = selfattn.attention(q, k, v, layout="bshd", return_lse=True, sinks=sinks, path="naive")
    with_dsinks = selfattn.attention_backward(q, k, v, out, dout, lse, layout="bshd", sinks=sinks, path="naive",
                                              return_dsinks=True)
    without = selfattn.attention_backward(q, k, v, out, dout, lse, layout="bshd", sinks=sinks, path="naive")
    assert len(without) == 3 and all(np.array_equal(a, b) for a, b in zip(without, with_dsinks))
    t = lambda a: np.swapaxes(a, 1, 2)
    want = reference_backward(t(q), t(k), t(v), t(dout), sinks=sinks)
    for got, expected in zip(map(t, with_dsinks[:3]), want):
        assert relative_error(got, expected, per_row=False) <= 2 * TOLERANCE["float32"]
    assert with_dsinks[3].shape == (3,)
    assert relative_error(with_dsinks[3], want[3], per_row=False) <= 2 * TOLERANCE["float32"]
    plain_out, plain_lse = selfattn.attention(q, k, v, layout="bshd", return_lse=True, path="naive")
    plain = selfattn.attention_backward(q, k, v, plain_out, dout, plain_lse, layout="bshd", path="naive")
    assert not np.allclose(plain[0], without[0])


@pytest.mark.parametrize("path", [p for p in selfattn.paths("sim") if p != "fused"])
def test_dsinks_against_central_differences(rng, path):
    # L = sum(dout * out) + sum(dlse * lse) through selfattn.attention itself (float32, so not the
    # fused path): its central differences in q, k, v and the sinks against attention_backward's
    # gradients. Batch 0 sees no key (its lse is the sink: dL/dsink takes its dlse); head 1 has no
    # sink (-inf stays -inf when perturbed: gradient 0).
    options = dict(causal="bottom_right", key_lengths=[0, 5], window=(2, 0), softcap=3.0, path=path)
    q, k, v = qkv(rng, "float32", 2, 3, 3, 3, 5, 4)
    dout, dlse = random(rng, q.shape, "float32"), random(rng, (2, 3, 3), "float32")
    sinks = sink_logits(rng, 3, without=[1])
    out, lse = selfattn.attention(q, k, v, return_lse=True, sinks=sinks, **options)
    grads = selfattn.attention_backward(q, k, v, out, dout, lse, dlse=dlse, sinks=sinks, return_dsinks=True,
                                        **options)

    def loss(q, k, v, sinks):
        out, lse = selfattn.attention(q, k, v, return_lse=True, sinks=sinks, **options)
        finite = np.isfinite(lse)
        return float(np.sum(dout.astype(np.float64) * out) + np.sum(dlse[finite] * lse[finite].astype(np.float64)))

    check_central_differences(loss, [q, k, v, sinks], grads)


def test_reference_dsinks_against_central_differences(rng):
    # The judge itself: reference_backward's gradients, dsinks included, against central differences
    # of reference()'s float64 loss.
    options = dict(causal="top_left", key_lengths=[4, 0], softcap=2.0, alibi_slopes=[0.3, 0.1])
    q, k, v = (rng.standard_normal(shape) for shape in ((2, 2, 3, 4), (2, 1, 4, 4), (2, 1, 4, 4)))
    dout, dlse, sinks = rng.standard_normal(q.shape), rng.standard_normal((2, 2, 3)), np.array([0.7, 1.9])
    grads = reference_backward(q, k, v, dout, dlse=dlse, sinks=sinks, **options)

    def loss(q, k, v, sinks):
        out, lse = reference(q, k, v, sinks=sinks, **options)
        return float(np.sum(dout * out) + np.sum(dlse * lse))

    check_central_differences(loss, [q, k, v, sinks], grads, h=1e-5)


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
def test_varlen_backward_with_dsinks(rng, path):
    # Each sequence's dq, dk, dv against the float64 backward of it alone, dsinks against the sum of
    # theirs; a sequence without rows, one without keys, and spare rows outside every sequence.
    lengths_q, lengths_k = [5, 0, 12, 3], [7, 4, 9, 0]
    check_varlen_backward(rng, "float16", lengths_q, lengths_k, dim=32, causal="bottom_right", path=path,
                          spare_rows=2, window=(4, 1), sinks=sink_logits(rng, 4, without=[2]))


def test_sinks_checked(rng):
    q, k, v = qkv(rng, "float32", 2, 3, 3, 5, 5, 8)
    with pytest.raises(selfattn.InvalidArgument, match=r"sinks expected shape \[3\] \(heads\), got \[2\]"):
        selfattn.attention(q, k, v, sinks=[0.0, 1.0])
    with pytest.raises(selfattn.InvalidArgument, match=r"sinks expected 1 dimension, got 2 \(shape \(1, 3\)\)"):
        selfattn.attention(q, k, v, sinks=np.zeros((1, 3), np.float32))
    with pytest.raises(selfattn.InvalidArgument, match="sinks expected real numbers"):
        selfattn.attention(q, k, v, sinks=["a", "b", "c"])
    out = np.zeros_like(q)
    with pytest.raises(selfattn.InvalidArgument, match="attention: sinks expected not to overlap out"):
        selfattn.attention(q, k, v, out=out, sinks=out.reshape(-1)[:3])  # a float32 view: used as it is
    out, lse = selfattn.attention(q, k, v, return_lse=True, sinks=np.zeros(3))  # float64 is converted
    with pytest.raises(selfattn.InvalidArgument, match=r"return_dsinks=True expected sinks"):
        selfattn.attention_backward(q, k, v, out, out.copy(), lse, return_dsinks=True)
    with pytest.raises(selfattn.InvalidArgument, match=r"sinks expected shape \[3\]"):
        selfattn.attention_backward(q, k, v, out, out.copy(), lse, sinks=[1.0], return_dsinks=True)
    packed, cu = q[0].transpose(1, 0, 2), [0, 2, 5]
    out, lse = selfattn.attention_varlen(packed, packed, packed, cu, cu, return_lse=True)
    with pytest.raises(selfattn.InvalidArgument, match=r"return_dsinks=True expected sinks"):
        selfattn.attention_varlen_backward(packed, packed, packed, out, out.copy(), lse, cu, cu, return_dsinks=True)
    with pytest.raises(selfattn.InvalidArgument, match=r"sinks expected shape \[3\] \(heads\), got \[4\]"):
        selfattn.attention_varlen(packed, packed, packed, cu, cu, sinks=np.zeros(4, np.float32))
