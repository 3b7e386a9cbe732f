"""selfattn.attention_varlen() and selfattn.self_attention() on the sim, against the float64
reference in conftest.py."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, poisoned, random, reference, relative_error


@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_varlen_matches_each_sequence_alone(rng, causal):
    lengths_q, lengths_k = [5, 1, 0, 12], [7, 3, 4, 9]
    heads, kv_heads, dim = 4, 2, 16
    cu_q, cu_k = np.cumsum([0] + lengths_q), np.cumsum([0] + lengths_k)
    q = random(rng, (cu_q[-1], heads, dim), "float16")
    k = random(rng, (cu_k[-1], kv_heads, dim), "float16")
    v = random(rng, (cu_k[-1], kv_heads, dim), "float16")
    out, lse = selfattn.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == (heads, cu_q[-1])
    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])

        def bhsd(a):
            return a.transpose(1, 0, 2)[None]

        want, want_lse = reference(bhsd(q[rows]), bhsd(k[keys]), bhsd(v[keys]), causal)
        assert relative_error(bhsd(out[rows]), want) <= TOLERANCE["float16"]
        seen = np.isfinite(want_lse[0])
        np.testing.assert_allclose(lse[:, rows][seen], want_lse[0][seen], rtol=1e-5, atol=1e-5)
        assert np.all(lse[:, rows][~seen] == -np.inf)


def test_varlen_explicit_max_seqlen_and_out(rng):
    cu = np.array([0, 3, 10], dtype=np.int32)
    q, k, v = (random(rng, (10, 2, 8), "float32") for _ in range(3))
    out = poisoned(q.shape, "float32")
    assert selfattn.attention_varlen(q, k, v, cu, cu, max_seqlen_q=7, max_seqlen_k=7, out=out) is out
    for lo, hi in ((0, 3), (3, 10)):
        want, _ = reference(*(a[lo:hi].transpose(1, 0, 2)[None] for a in (q, k, v)))
        assert relative_error(out[lo:hi].transpose(1, 0, 2)[None], want) <= TOLERANCE["float32"]


def test_varlen_rows_no_sequence_owns(rng):
    # Rows past cu_seqlens_q[-1] (a batch packed with room to spare): 0 in an out the call
    # allocates and -inf in its lse, on every path; a caller's out= keeps what it held there.
    cu_q, cu_k = np.array([0, 3, 3, 7], np.int32), np.array([0, 5, 6, 9], np.int32)
    q = random(rng, (10, 2, 8), "float32")  # rows 7, 8 and 9 belong to no sequence
    k, v = (random(rng, (9, 2, 8), "float32") for _ in range(2))
    for path in selfattn.paths("sim"):
        out, lse = selfattn.attention_varlen(q, k, v, cu_q, cu_k, path=path, causal="bottom_right",
                                             return_lse=True)
        assert np.all(out[7:] == 0) and np.all(lse[:, 7:] == -np.inf), path
        for b in range(3):
            rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            want, _ = reference(*(a.transpose(1, 0, 2)[None] for a in (q[rows], k[keys], v[keys])), "bottom_right")
            assert relative_error(out[rows].transpose(1, 0, 2)[None], want) <= TOLERANCE["float32"], path
        given = poisoned(q.shape, "float32")
        _, given_lse = selfattn.attention_varlen(q, k, v, cu_q, cu_k, path=path, causal="bottom_right", out=given,
                                                 return_lse=True)
        assert np.all(np.isnan(given[7:])), path
        np.testing.assert_array_equal(given[:7], out[:7])
        np.testing.assert_array_equal(given_lse, lse)
        assert np.all(selfattn.attention_varlen(q, k, v, cu_q, cu_k, path=path)[7:] == 0), path


def projections_reference(x, wq, wk, wv, heads, wo=None, causal=None, **options):
    """float64 self_attention; options: key_lengths and the modifiers, as reference() takes them."""
    x, wq, wk, wv = (np.asarray(a, dtype=np.float64) for a in (x, wq, wk, wv))
    batch, seq, _ = x.shape
    dim = wq.shape[1] // heads
    kv_heads = wk.shape[1] // dim

    def split(y, h):  # [batch, seq, h * dim] -> [batch, h, seq, dim]
        return y.reshape(batch, seq, h, dim).transpose(0, 2, 1, 3)

    out, _ = reference(split(x @ wq, heads), split(x @ wk, kv_heads), split(x @ wv, kv_heads), causal, **options)
    if wo is None:
        return out
    return out.transpose(0, 2, 1, 3).reshape(batch, seq, heads * dim) @ np.asarray(wo, dtype=np.float64)


@pytest.mark.parametrize("with_wo", [False, True])
def test_self_attention(rng, with_wo):
    batch, seq, d_model, heads, kv_heads, dim = 2, 9, 24, 4, 2, 8
    x = random(rng, (batch, seq, d_model), "float32")
    wq = random(rng, (d_model, heads * dim), "float32") / float(np.sqrt(d_model))
    wk = random(rng, (d_model, kv_heads * dim), "float32") / float(np.sqrt(d_model))
    wv = random(rng, (d_model, kv_heads * dim), "float32") / float(np.sqrt(d_model))
    wo = random(rng, (heads * dim, 5), "float32") if with_wo else None
    out = selfattn.self_attention(x, wq, wk, wv, heads, wo=wo, causal="top_left")
    assert out.shape == ((batch, seq, 5) if with_wo else (batch, heads, seq, dim))
    assert relative_error(out, projections_reference(x, wq, wk, wv, heads, wo, "top_left")) <= 1e-4


@pytest.mark.parametrize("with_wo", [False, True])
def test_self_attention_with_every_modifier(rng, with_wo):
    # Key lengths, a window aligned at the last key, softcap, per-batch ALiBi, a bias that masks
    # key 3 of one head entirely and sinks (head 1 without one): the attention step applies them as
    # attention() does.
    batch, seq, d_model, heads, kv_heads, dim = 2, 7, 16, 4, 2, 8
    x = random(rng, (batch, seq, d_model), "float32")
    wq, wk, wv = (random(rng, (d_model, h * dim), "float32") / 4.0 for h in (heads, kv_heads, kv_heads))
    wo = random(rng, (heads * dim, 3), "float32") if with_wo else None
    bias = random(rng, (batch, heads, seq, seq), "float32")
    bias[1, 2, :, 3] = -np.inf
    options = dict(key_lengths=[5, 7], window=(2, 1), softcap=3.0,
                   alibi_slopes=rng.uniform(0.1, 0.5, (batch, heads)).astype(np.float32), bias=bias,
                   sinks=[0.5, -np.inf, 2.0, 1.0])
    out = selfattn.self_attention(x, wq, wk, wv, heads, wo=wo, causal="bottom_right", **options)
    assert relative_error(out, projections_reference(x, wq, wk, wv, heads, wo, "bottom_right", **options)) <= 1e-4
    with pytest.raises(selfattn.InvalidArgument, match="alibi_slopes expected shape"):
        selfattn.self_attention(x, wq, wk, wv, heads, alibi_slopes=np.ones(kv_heads, np.float32))
    with pytest.raises(selfattn.InvalidArgument, match="bias"):
        selfattn.self_attention(x, wq, wk, wv, heads, bias=bias[:, :, :, :4])
    with pytest.raises(selfattn.InvalidArgument, match=r"sinks expected shape \[4\] \(heads\)"):
        selfattn.self_attention(x, wq, wk, wv, heads, sinks=np.zeros(kv_heads, np.float32))


def test_self_attention_bad_heads(rng):
    x = random(rng, (1, 3, 8), "float32")
    w = random(rng, (8, 12), "float32")
    with pytest.raises(selfattn.InvalidArgument, match=r"self_attention: wq.shape\[1\] expected a positive multiple"):
        selfattn.self_attention(x, w, w, w, 5)
