"""attention_probabilities() (the softmax weights a call forms, dropped ones negated),
dropout_keep_mask() (the keep flags of dropout) and attention(..., return_dropout_seed=True) (the
seed a call drew): on NumPy arrays (the sim) against the float64 rule of conftest.py and its own
Philox4x32-10, with every mask and modifier, sinks, GQA, both layouts, varlen; on torch tensors, the
returned seed driving attention_backward by hand to the gradients autograd gave. Arguments refused
by name."""
import numpy as np
import pytest

import selfattn
from conftest import Mods, dropout_keep_mask, random, slopes, softmax_with_sink


def reference_probs(q, k, causal=None, scale=None, key_lengths=None, dropout=None, **mods):
    """float64 probs [b, h, sq, sk] of BHSD q, k: the weights of each row's visible keys, 0
    elsewhere, negated where dropout (p, keep) drops a visible key."""
    q, k = (np.asarray(a, dtype=np.float64) for a in (q, k))
    batch, heads, seq_q, dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(dim) if scale is None else scale
    rule = Mods((batch, heads, seq_q, seq_k), causal, **mods)
    probs = np.zeros((batch, heads, seq_q, seq_k))
    for b in range(batch):
        len_k = seq_k if key_lengths is None else min(max(int(key_lengths[b]), 0), seq_k)
        for h in range(heads):
            kh = h // (heads // kv_heads)
            for i in range(seq_q):
                keys, s, _ = rule.scores(lambda j: scale * (k[b, kh, j] @ q[b, h, i]), b, h, i, len_k)
                row = softmax_with_sink(s, rule.sink(h))
                if row is not None:
                    weights = row[0]
                    if dropout is not None:
                        weights = np.where(dropout[1][b, h, i, keys] > 0, weights, -weights)
                    probs[b, h, i, keys] = weights
    return probs


def check_probs(got, want):
    """Every element finite, the sign bit as expected (-0.0 for a dropped weight of 0), within
    fp32's rounding of the scores and exponentials (1e-4 relative, 10x what they give here)."""
    got = np.asarray(got)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.all(np.isfinite(got))
    assert np.array_equal(np.signbit(got), np.signbit(want)), "a sign (dropout's mark) differs"
    assert np.all(np.abs(got - want) <= 1e-4 * np.abs(want) + 1e-30)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_weights_with_every_modifier_and_dropout(rng, dtype, layout):
    batch, heads, kv_heads, seq_q, seq_k, dim, p, seed, offset = 2, 4, 2, 7, 113, 16, 0.3, 99, 8
    q, k, v = (random(rng, (batch, n, s, dim), dtype) for n, s in ((heads, seq_q), (kv_heads, seq_k), (kv_heads, seq_k)))
    mods = dict(window=(40, 2), softcap=5.0, alibi_slopes=slopes(rng, batch, heads),
                bias=rng.standard_normal((1, heads, seq_q, seq_k)).astype(np.float32),
                sinks=np.array([0.5, -np.inf, 1.0, 2.0], dtype=np.float32), key_start=[3, 0], q_offset=[50, 90])
    as_layout = (lambda a: a.transpose(0, 2, 1, 3)) if layout == "bshd" else (lambda a: a)
    got = selfattn.attention_probabilities(as_layout(q), as_layout(k), as_layout(v), causal="bottom_right",
                                           key_lengths=[113, 100], layout=layout, dropout_p=p, dropout_seed=seed,
                                           dropout_offset=offset, **mods)
    keep = dropout_keep_mask(p, seed, offset, batch, heads, seq_q, seq_k)
    want = reference_probs(q, k, "bottom_right", key_lengths=[113, 100], dropout=(p, keep), **mods)
    check_probs(got, want)
    assert np.sum(np.signbit(got) & (want != 0)) > 0  # some weight was dropped


def test_weights_reproduce_the_forward(rng):
    # out = sum over kept keys of P / (1 - p) v_j: the signs are attention()'s own dropout.
    q, k, v = (random(rng, (1, 2, n, 16), "float32") for n in (9, 30, 30))
    options = dict(causal="top_left", window=(12, 0), dropout_p=0.4, dropout_seed=5)
    probs = selfattn.attention_probabilities(q, k, v, **options)
    out = selfattn.attention(q, k, v, path="naive", **options)
    rebuilt = np.einsum("bhqk,bhkd->bhqd", np.where(np.signbit(probs), 0.0, probs / 0.6), v.astype(np.float64))
    np.testing.assert_allclose(out, rebuilt, rtol=1e-5, atol=1e-6)


def test_varlen_slices(rng):
    lengths_q, lengths_k, heads, dim = [5, 0, 9, 1], [20, 4, 0, 13], 2, 8
    cu_q, cu_k = np.cumsum([0] + lengths_q).astype(np.int32), np.cumsum([0] + lengths_k).astype(np.int32)
    q = random(rng, (int(cu_q[-1]), heads, dim), "float32")
    k, v = (random(rng, (int(cu_k[-1]), 1, dim), "float32") for _ in range(2))
    got = selfattn.attention_probabilities(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal="bottom_right",
                                           dropout_p=0.2, dropout_seed=3)
    assert got.shape == (4, heads, max(lengths_q), max(lengths_k))
    for b, (len_q, len_k) in enumerate(zip(lengths_q, lengths_k)):
        qb = q[cu_q[b]:cu_q[b + 1]].transpose(1, 0, 2)[None]
        kb = k[cu_k[b]:cu_k[b + 1]].transpose(1, 0, 2)[None]
        keep = dropout_keep_mask(0.2, 3, 0, 1, heads, len_q, len_k, first_batch=b)
        want = np.zeros((1, heads, max(lengths_q), max(lengths_k)))
        want[:, :, :len_q, :len_k] = reference_probs(qb, kb, "bottom_right", dropout=(0.2, keep))
        check_probs(got[b:b + 1], want)


@pytest.mark.parametrize("shape, p, seed, offset, first_batch", [
    ((2, 3, 7, 113), 0.3, 1234, 0, 0), ((1, 2, 33, 5), 0.9, 2**63 + 5, 2**40, 3), ((1, 1, 1, 1), 0.5, 0, 0, 0),
    ((2, 2, 4, 4), 0.0, 7, 0, 0)])
def test_keep_mask_is_the_librarys_rule(shape, p, seed, offset, first_batch):
    got = selfattn.dropout_keep_mask(shape, p, seed, offset, first_batch=first_batch)
    assert got.dtype == bool and got.shape == shape
    assert np.array_equal(got, dropout_keep_mask(p, seed, offset, *shape, first_batch=first_batch) > 0)


def test_arguments_refused_by_name(rng):
    q, k, v = (random(rng, (1, 2, 4, 8), "float32") for _ in range(3))
    cu = np.array([0, 4], dtype=np.int32)
    cases = [
        (lambda: selfattn.attention_probabilities(q, k, v, dropout_p=0.1), "dropout_seed"),
        (lambda: selfattn.attention_probabilities(q[0], k[0], v[0], cu_seqlens_q=cu), "cu_seqlens_q and cu_seqlens_k"),
        (lambda: selfattn.attention_probabilities(q[0], k[0], v[0], cu_seqlens_q=cu, cu_seqlens_k=cu, layout="bshd"),
         "layout"),
        (lambda: selfattn.attention_probabilities(q, k[..., :4], v), "k"),
        (lambda: selfattn.dropout_keep_mask((1, 2, 3), 0.1, 1), "shape"),
        (lambda: selfattn.dropout_keep_mask((1, 2, 3, 4), 1.5, 1), "dropout_p"),
        (lambda: selfattn.dropout_keep_mask((1, 2, 3, 4), 0.5, -1), "dropout_seed"),
    ]
    for call, name in cases:
        with pytest.raises(selfattn.InvalidArgument, match=name):
            call()
    with pytest.raises(selfattn.NotAvailable, match="naive"):
        selfattn.attention_probabilities(q, k, v, path="fused")


def test_return_dropout_seed_drives_the_backward_by_hand():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g).requires_grad_() for n in (11, 11, 11))
    out, lse, seed = selfattn.attention(q, k, v, causal="top_left", dropout_p=0.3, return_lse=True,
                                        return_dropout_seed=True)
    assert isinstance(seed, int) and 0 < seed < 2**64
    dout = torch.randn(out.shape, generator=g)
    (out * dout).sum().backward()
    by_hand = selfattn.attention_backward(q.detach(), k.detach(), v.detach(), out.detach(), dout, lse.detach(),
                                          causal="top_left", dropout_p=0.3, dropout_seed=seed)
    for tensor, grad in zip((q, k, v), by_hand):
        assert torch.equal(tensor.grad, grad)
    # The mask the seed names is the one the call used (its probabilities' signs, its keep flags).
    probs = selfattn.attention_probabilities(q, k, v, causal="top_left", dropout_p=0.3, dropout_seed=seed)
    keep = selfattn.dropout_keep_mask((2, 3, 11, 11), 0.3, seed)
    seen = probs.numpy() != 0
    assert np.array_equal(~np.signbit(probs.numpy())[seen], keep[seen])
    # Given, it comes back as given; without dropout it is 0; NumPy arrays and varlen return it too.
    assert selfattn.attention(q.detach(), k.detach(), v.detach(), dropout_p=0.1, dropout_seed=42,
                              return_dropout_seed=True)[1] == 42
    assert selfattn.attention(q.detach(), k.detach(), v.detach(), return_dropout_seed=True)[1] == 0
    assert selfattn.attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), dropout_p=0.2,
                              dropout_seed=9, return_dropout_seed=True)[1] == 9
    cu = torch.tensor([0, 5, 11], dtype=torch.int32)
    flat = [x.detach()[0].transpose(0, 1).contiguous() for x in (q, k, v)]
    out_v, lse_v, seed_v = selfattn.attention_varlen(*flat, cu, cu, dropout_p=0.2, return_lse=True,
                                                     return_dropout_seed=True)
    assert out_v.shape == flat[0].shape and lse_v.shape == (3, 11) and isinstance(seed_v, int)
