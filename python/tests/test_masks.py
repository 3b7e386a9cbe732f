"""The masks and score modifiers (window, softcap, alibi_slopes, bias) of selfattn.attention,
attention_varlen and attention_backward on NumPy arrays (the sim), against the float64 reference in
conftest.py, which applies them by selfattn/attention.h's rule."""
import numpy as np
import pytest

import selfattn
from conftest import (TOLERANCE, bias_with_holes, check, check_central_differences, check_varlen_backward, poisoned,
                      random, reference, reference_backward, relative_error, slopes)


def run_case(rng, dtype="float32", batch=1, heads=2, kv_heads=None, seq_q=7, seq_k=None, dim=16, causal=None,
             key_lengths=None, path="auto", **mods):
    kv_heads = kv_heads or heads
    seq_k = seq_q if seq_k is None else seq_k
    q = random(rng, (batch, heads, seq_q, dim), dtype)
    k = random(rng, (batch, kv_heads, seq_k, dim), dtype)
    v = random(rng, (batch, kv_heads, seq_k, dim), dtype)
    out, lse = selfattn.attention(q, k, v, causal=causal, key_lengths=key_lengths, path=path, return_lse=True,
                                  **mods)
    assert out.shape == q.shape and out.dtype == q.dtype
    check(out, lse, *reference(q, k, v, causal, None, key_lengths, **mods), dtype)


# Each modifier alone, for shapes (batch, heads, seq_q, seq_k) -> keyword arguments.
ALONE = {
    "window": lambda rng, b, h, sq, sk: dict(window=(3, 2)),
    "window_left_only": lambda rng, b, h, sq, sk: dict(window=(5, -1)),
    "window_diagonal": lambda rng, b, h, sq, sk: dict(window=(0, 0)),
    "softcap": lambda rng, b, h, sq, sk: dict(softcap=1.5),
    "alibi": lambda rng, b, h, sq, sk: dict(alibi_slopes=slopes(rng, h)),
    "bias": lambda rng, b, h, sq, sk: dict(bias=bias_with_holes(rng, (b, h, sq, sk))),
}


@pytest.mark.parametrize("mod", sorted(ALONE))
@pytest.mark.parametrize("seq_q,seq_k", [(1, 7), (7, 113), (113, 7)])
def test_each_modifier_alone(rng, mod, seq_q, seq_k):
    run_case(rng, batch=2, seq_q=seq_q, seq_k=seq_k, **ALONE[mod](rng, 2, 2, seq_q, seq_k))


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_all_combined_gqa(rng, path, dtype, causal):
    batch, heads, seq_q, seq_k = 2, 4, 37, 53
    run_case(rng, dtype=dtype, batch=batch, heads=heads, kv_heads=2, seq_q=seq_q, seq_k=seq_k, dim=32, causal=causal,
             path=path, window=(9, 4), softcap=2.0, alibi_slopes=slopes(rng, batch, heads),
             bias=bias_with_holes(rng, (batch, heads, seq_q, seq_k), dtype))


@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_key_lengths_align_window_and_alibi(rng, causal):
    # i' = i + len_k - seq_q counts the batch's key length, not seq_k; a length of 0 sees nothing.
    run_case(rng, batch=3, seq_q=5, seq_k=20, dim=8, causal=causal, key_lengths=[20, 9, 0], window=(2, 1),
             alibi_slopes=slopes(rng, 2))


def test_bshd_layout_keeps_bias_in_bhqk_order(rng):
    batch, heads, kv_heads, seq_q, seq_k, dim = 2, 4, 2, 11, 9, 16
    q = random(rng, (batch, seq_q, heads, dim), "float16")  # [batch, seq, heads, dim]
    k = random(rng, (batch, seq_k, kv_heads, dim), "float16")
    v = random(rng, (batch, seq_k, kv_heads, dim), "float16")
    mods = dict(window=(4, 0), softcap=3.0, alibi_slopes=slopes(rng, heads),
                bias=bias_with_holes(rng, (batch, heads, seq_q, seq_k), "float16"))
    out, lse = selfattn.attention(q, k, v, layout="bshd", return_lse=True, causal="top_left", **mods)
    t = lambda a: np.swapaxes(a, 1, 2)
    check(t(out), lse, *reference(t(q), t(k), t(v), "top_left", **mods), "float16")


@pytest.mark.parametrize("shape", [(1, 3, 6, 10), (2, 1, 6, 10), (1, 1, 6, 10), (1, 1, 1, 10)])
def test_broadcast_bias(rng, shape):
    bias = bias_with_holes(rng, shape, masked=0.1)
    run_case(rng, batch=2, heads=3, seq_q=6, seq_k=10, dim=8, bias=bias)
    # The full shape as a view of one copy (strides of 0), as np.broadcast_to makes it.
    run_case(rng, batch=2, heads=3, seq_q=6, seq_k=10, dim=8, bias=np.broadcast_to(bias, (2, 3, 6, 10)))


def test_bias_in_q_dtype_or_float32(rng):
    for bias_dtype in ("bfloat16", "float32"):
        run_case(rng, dtype="bfloat16", batch=1, heads=2, seq_q=9, seq_k=12,
                 bias=bias_with_holes(rng, (1, 2, 9, 12), bias_dtype))


def test_bias_masking_a_whole_row(rng):
    q, k, v = (random(rng, (1, 2, 4, 8), "float32") for _ in range(3))
    bias = np.zeros((1, 2, 4, 4), dtype=np.float32)
    bias[0, 1, 2] = -np.inf  # head 1, row 2 sees no key
    out = poisoned(q.shape, "float32")
    _, lse = selfattn.attention(q, k, v, bias=bias, out=out, return_lse=True)
    assert np.all(out[0, 1, 2] == 0) and lse[0, 1, 2] == -np.inf
    check(out, lse, *reference(q, k, v, bias=bias), "float32")


@pytest.mark.parametrize("per_batch", [False, True])
def test_alibi_per_head_or_per_batch_and_head(rng, per_batch):
    batch, heads = 3, 2
    alibi = slopes(rng, batch, heads) if per_batch else slopes(rng, heads)
    run_case(rng, batch=batch, heads=heads, seq_q=8, seq_k=13, causal="bottom_right", alibi_slopes=alibi)
    run_case(rng, batch=batch, heads=heads, seq_q=8, seq_k=13, alibi_slopes=alibi.tolist())  # any sequence


# The fused backward runs on tensor cores: f16/bf16 only.
@pytest.mark.parametrize("dtype,path", [("float32", "naive"), ("float32", "cublas"), ("float16", "cublas"),
                                        ("float16", "fused"), ("bfloat16", "naive"), ("bfloat16", "fused")])
def test_backward_with_modifiers(rng, dtype, path):
    batch, heads, kv_heads, seq_q, seq_k, dim = 2, 4, 2, 19, 27, 32  # 32: a fused backward head_dim
    q = random(rng, (batch, heads, seq_q, dim), dtype)
    k = random(rng, (batch, kv_heads, seq_k, dim), dtype)
    v = random(rng, (batch, kv_heads, seq_k, dim), dtype)
    dout = random(rng, q.shape, dtype)
    mods = dict(window=(6, 3), softcap=1.5, alibi_slopes=slopes(rng, batch, heads),
                bias=bias_with_holes(rng, (1, heads, seq_q, seq_k), dtype))
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", return_lse=True, path=path, **mods)
    grads = selfattn.attention_backward(q, k, v, out, dout, lse, causal="bottom_right", path=path, **mods)
    for got, want in zip(grads, reference_backward(q, k, v, dout, "bottom_right", **mods)):
        # Twice the forward's tolerance, as test_backward.py: dS = P (dP - D) cancels.
        assert relative_error(got, want) <= 2 * TOLERANCE[dtype]


def test_gradcheck_with_modifiers_against_the_library_forward(rng):
    # As test_backward.py's gradcheck: central differences of sum(dout * attention(...)) through
    # selfattn.attention (float32, naive path) against attention_backward, with every modifier on.
    q, k, v = (random(rng, (1, 2, n, 4), "float32") for n in (4, 6, 6))
    dout = random(rng, (1, 2, 4, 4), "float32")
    bias = bias_with_holes(rng, (1, 2, 4, 6), masked=0.15)
    mods = dict(causal="top_left", path="naive", window=(2, -1), softcap=1.0, alibi_slopes=[0.3, 0.1], bias=bias)
    out, lse = selfattn.attention(q, k, v, return_lse=True, **mods)
    grads = selfattn.attention_backward(q, k, v, out, dout, lse, **mods)

    def loss(*inputs):
        return float(np.sum(dout.astype(np.float64) * selfattn.attention(*inputs, **mods)))

    check_central_differences(loss, [q, k, v], grads)


@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_varlen_with_window_alibi_and_bias(rng, causal):
    lengths_q, lengths_k = [5, 1, 0, 12], [7, 3, 4, 9]
    batch, heads, kv_heads, dim = 4, 4, 2, 16
    cu_q, cu_k = np.cumsum([0] + lengths_q), np.cumsum([0] + lengths_k)
    q = random(rng, (cu_q[-1], heads, dim), "float16")
    k = random(rng, (cu_k[-1], kv_heads, dim), "float16")
    v = random(rng, (cu_k[-1], kv_heads, dim), "float16")
    alibi = slopes(rng, batch, heads)  # one row per sequence
    bias = bias_with_holes(rng, (batch, 1, max(lengths_q), max(lengths_k)), "float16", masked=0.1)
    out, lse = selfattn.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, return_lse=True, window=(3, 1),
                                         alibi_slopes=alibi, bias=bias)
    for b in range(batch):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])

        def bhsd(a):
            return a.transpose(1, 0, 2)[None]

        want, want_lse = reference(bhsd(q[rows]), bhsd(k[keys]), bhsd(v[keys]), causal, window=(3, 1),
                                   alibi_slopes=alibi[b], bias=bias[b:b + 1, :, :lengths_q[b], :lengths_k[b]])
        check(bhsd(out[rows]), lse[None, :, rows], want, want_lse, "float16")


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_varlen_backward_with_every_modifier(rng, path, causal):
    lengths_q, lengths_k = [5, 1, 0, 12], [7, 3, 4, 9]
    batch, heads = len(lengths_q), 4
    check_varlen_backward(rng, "float16", lengths_q, lengths_k, heads=heads, dim=32, causal=causal, path=path,
                          window=(3, 1), softcap=2.0, alibi_slopes=slopes(rng, batch, heads),
                          bias=bias_with_holes(rng, (batch, 1, max(lengths_q), max(lengths_k)), masked=0.1))

def test_varlen_window_alone(rng):
    cu = np.array([0, 6, 19], dtype=np.int32)
    q, k, v = (random(rng, (19, 2, 8), "float32") for _ in range(3))
    out = selfattn.attention_varlen(q, k, v, cu, cu, window=(2, 2))
    for lo, hi in ((0, 6), (6, 19)):
        want, _ = reference(*(a[lo:hi].transpose(1, 0, 2)[None] for a in (q, k, v)), window=(2, 2))
        assert relative_error(out[lo:hi].transpose(1, 0, 2)[None], want) <= TOLERANCE["float32"]


def test_modifiers_change_the_result(rng):
    # Guards the tests above against modifiers that silently never reach the library.
    q, k, v = (random(rng, (2, 2, 6, 8), "float32") for _ in range(3))
    plain = selfattn.attention(q, k, v)
    for mods in (dict(window=(1, 1)), dict(softcap=0.5), dict(alibi_slopes=[0.5, 0.5]),
                 dict(bias=rng.standard_normal((2, 2, 6, 6)).astype(np.float32))):
        assert not np.allclose(selfattn.attention(q, k, v, **mods), plain), mods


def arrays(rng, shape=(2, 2, 5, 8)):
    return [random(rng, shape, "float32") for _ in range(3)]


@pytest.mark.parametrize("window", [(1,), (1, 2, 3), "ab", (1.5, 2), (True, 0), (2 ** 40, 0), 3])
def test_window_not_a_pair_of_ints(rng, window):
    with pytest.raises(selfattn.InvalidArgument, match=r"window expected None or a pair \(left, right\) of ints"):
        selfattn.attention(*arrays(rng), window=window)


def test_window_values_checked_by_the_library(rng):
    with pytest.raises(selfattn.InvalidArgument, match=r"window\[0\] expected -1 \(unbounded\) or >= 0, got -2"):
        selfattn.attention(*arrays(rng), window=(-2, 0))
    with pytest.raises(selfattn.InvalidArgument, match=r"window\[1\] expected -1"):
        selfattn.attention(*arrays(rng), window=(0, -5))
    selfattn.attention(*arrays(rng), window=(np.int64(2), np.int32(0)))  # NumPy integers are ints


@pytest.mark.parametrize("softcap", [0, -1.0, float("nan"), float("inf")])
def test_softcap_not_positive(rng, softcap):
    q, k, v = arrays(rng)
    out = np.full(q.shape, 3.0, dtype=np.float32)
    with pytest.raises(selfattn.InvalidArgument, match="softcap expected a finite number > 0"):
        selfattn.attention(q, k, v, softcap=softcap, out=out)
    assert np.all(out == 3.0), "a refused call writes nothing"
    with pytest.raises(selfattn.InvalidArgument, match="softcap expected a number"):
        selfattn.attention(q, k, v, softcap="large")


def test_alibi_checked(rng):
    q, k, v = arrays(rng)  # batch 2, heads 2
    with pytest.raises(selfattn.InvalidArgument, match=r"alibi_slopes expected shape \[2\] \(heads\) or \[2, 2\]"):
        selfattn.attention(q, k, v, alibi_slopes=[0.5, 0.5, 0.5])
    with pytest.raises(selfattn.InvalidArgument, match=r"alibi_slopes expected shape .* got \[2, 3\]"):
        selfattn.attention(q, k, v, alibi_slopes=np.ones((2, 3), dtype=np.float32))
    with pytest.raises(selfattn.InvalidArgument, match=r"alibi_slopes expected shape .* got \[1, 2, 2\]"):
        selfattn.attention(q, k, v, alibi_slopes=np.ones((1, 2, 2), dtype=np.float32))
    with pytest.raises(selfattn.InvalidArgument, match="alibi_slopes expected real numbers, got complex128"):
        selfattn.attention(q, k, v, alibi_slopes=[0.5j, 1])
    with pytest.raises(selfattn.InvalidArgument, match="alibi_slopes expected real numbers"):
        selfattn.attention(q, k, v, alibi_slopes=["a", "b"])
    out, lse = selfattn.attention(q, k, v, return_lse=True)
    with pytest.raises(selfattn.InvalidArgument, match="alibi_slopes expected shape"):
        selfattn.attention_backward(q, k, v, out, out.copy(), lse, alibi_slopes=[1.0])


def test_bias_checked(rng):
    q, k, v = arrays(rng)  # [2, 2, 5, 8]
    with pytest.raises(selfattn.InvalidArgument, match=r"bias expected 4 dimensions, got 3 \(shape \(2, 5, 5\)\)"):
        selfattn.attention(q, k, v, bias=np.zeros((2, 5, 5), np.float32))
    with pytest.raises(selfattn.InvalidArgument,
                       match="bias.dtype expected float32, float16, bfloat16 or bool, got float64"):
        selfattn.attention(q, k, v, bias=np.zeros((2, 2, 5, 5)))
    with pytest.raises(selfattn.InvalidArgument,
                       match=r"attention: bias.dtype expected f32, b8 \(a boolean mask\) or q.dtype \(f32\), got f16"):
        selfattn.attention(q, k, v, bias=np.zeros((2, 2, 5, 5), np.float16))
    with pytest.raises(selfattn.InvalidArgument, match=r"attention: bias.shape\[3\] \(seq_k\) expected 5 or 1"):
        selfattn.attention(q, k, v, bias=np.zeros((2, 2, 5, 4), np.float32))
    with pytest.raises(selfattn.InvalidArgument, match="bias expected an array with __dlpack__"):
        selfattn.attention(q, k, v, bias=[[[[0.0]]]])
    out, lse = selfattn.attention(q, k, v, return_lse=True)
    with pytest.raises(selfattn.InvalidArgument, match=r"attention_backward: bias.shape\[2\] \(seq_q\)"):
        selfattn.attention_backward(q, k, v, out, out.copy(), lse, bias=np.zeros((1, 1, 4, 5), np.float32))


def test_bias_overlapping_out(rng):
    q, k, v = arrays(rng, (1, 1, 8, 8))  # seq_k == head_dim: out itself has a bias's shape
    out = np.zeros_like(q)
    with pytest.raises(selfattn.InvalidArgument, match="attention: bias expected not to overlap out"):
        selfattn.attention(q, k, v, out=out, bias=out)


def test_varlen_modifiers_checked(rng):
    q, k, v = (random(rng, (6, 2, 8), "float32") for _ in range(3))
    cu = [0, 2, 6]
    with pytest.raises(selfattn.InvalidArgument, match=r"alibi_slopes expected shape \[2\] \(heads\) or \[2, 2\]"):
        selfattn.attention_varlen(q, k, v, cu, cu, alibi_slopes=np.ones((3, 2), np.float32))
    with pytest.raises(selfattn.InvalidArgument, match=r"attention_varlen: bias.shape\[3\] .* expected 4 or 1"):
        selfattn.attention_varlen(q, k, v, cu, cu, bias=np.zeros((2, 2, 4, 3), np.float32))
    with pytest.raises(selfattn.InvalidArgument, match="window expected"):
        selfattn.attention_varlen(q, k, v, cu, cu, window=[1])


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_boolean_bias_is_read_as_a_mask(rng, path, dtype):
    # bias of dtype bool, as SDPA's attn_mask: True may attend, False masks; read by the kernels as
    # bytes. Broadcast over heads, a row with every key False (0 and lse -inf), causal on top.
    batch, heads, seq_q, seq_k = 2, 4, 7, 113
    q = random(rng, (batch, heads, seq_q, 32), dtype)
    k, v = (random(rng, (batch, 2, seq_k, 32), dtype) for _ in range(2))
    allowed = rng.uniform(size=(batch, 1, seq_q, seq_k)) < 0.8
    allowed[1, 0, 3] = False
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", bias=allowed, path=path, return_lse=True)
    additive = np.where(allowed, 0.0, -np.inf)
    check(out, lse, *reference(q, k, v, "bottom_right", bias=additive), dtype)
    assert np.all(out[1, :, 3] == 0) and np.all(lse[1, :, 3] == -np.inf)


def test_boolean_bias_from_torch():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 16, generator=g) for _ in range(3))
    allowed = torch.rand(1, 1, 5, 5, generator=g) < 0.7
    allowed[..., 0] = True  # every row sees key 0
    out = selfattn.attention(q, k, v, bias=allowed)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, -float("inf"))
    want, _ = reference(q.numpy(), k.numpy(), v.numpy(), bias=additive.numpy())
    assert relative_error(out.numpy(), want) <= TOLERANCE["float32"]
    assert torch.equal(selfattn.attention(q, k, v, bias=additive), out)  # the same mask either way
