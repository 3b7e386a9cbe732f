"""selfattn.attention() on NumPy arrays (the sim) against the float64 reference in conftest.py."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, poisoned, random, reference, relative_error


def run_case(rng, dtype="float32", batch=1, heads=2, kv_heads=None, seq_q=7, seq_k=None, dim=16, causal=None,
             key_lengths=None, path="auto", scale=None):
    kv_heads = kv_heads or heads
    seq_k = seq_q if seq_k is None else seq_k
    q = random(rng, (batch, heads, seq_q, dim), dtype)
    k = random(rng, (batch, kv_heads, seq_k, dim), dtype)
    v = random(rng, (batch, kv_heads, seq_k, dim), dtype)
    out, lse = selfattn.attention(q, k, v, causal=causal, key_lengths=key_lengths, path=path, scale=scale,
                                  return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (batch, heads, seq_q) and lse.dtype == np.float32
    want, want_lse = reference(q, k, v, causal, scale, key_lengths)
    assert relative_error(out, want) <= TOLERANCE[dtype]
    seen = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(lse), seen), "LSE is -inf exactly where a row sees no key"
    assert np.all(lse[~seen] == -np.inf)
    np.testing.assert_allclose(lse[seen], want_lse[seen], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("seq_q,seq_k,dim", [(1, 1, 1), (7, 7, 16), (37, 113, 64), (113, 37, 8), (3, 1000, 64)])
def test_sizes_and_dtypes(rng, dtype, seq_q, seq_k, dim):
    run_case(rng, dtype=dtype, seq_q=seq_q, seq_k=seq_k, dim=dim)


@pytest.mark.parametrize("causal", ["top_left", "bottom_right"])
@pytest.mark.parametrize("seq_q,seq_k", [(13, 13), (9, 30), (30, 9)])
def test_causal(rng, causal, seq_q, seq_k):
    run_case(rng, dtype="float16", seq_q=seq_q, seq_k=seq_k, causal=causal, dim=32)


def test_alignments_differ_when_lengths_do(rng):
    q, k, v = random(rng, (1, 1, 5, 8), "float32"), random(rng, (1, 1, 9, 8), "float32"), random(rng, (1, 1, 9, 8),
                                                                                                 "float32")
    assert not np.allclose(selfattn.attention(q, k, v, causal="top_left"),
                           selfattn.attention(q, k, v, causal="bottom_right"))


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 1), (3, 3)])
def test_grouped_query_heads(rng, heads, kv_heads):
    run_case(rng, dtype="bfloat16", batch=2, heads=heads, kv_heads=kv_heads, seq_q=11, dim=16)


@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_key_lengths(rng, causal):
    # A length of 0 (rows of 0, LSE -inf), one past seq_k (clamped), and ordinary ones.
    run_case(rng, batch=4, seq_q=6, seq_k=17, dim=8, causal=causal, key_lengths=[17, 0, 5, 40])


def test_key_lengths_any_integer_sequence(rng):
    run_case(rng, batch=2, seq_q=3, seq_k=9, key_lengths=np.array([4, 9], dtype=np.int64))


@pytest.mark.parametrize("path", selfattn.paths("sim"))
def test_each_path(rng, path):
    run_case(rng, dtype="float16", batch=2, heads=2, seq_q=19, seq_k=23, dim=32, causal="bottom_right", path=path)


@pytest.mark.parametrize("path", ["naive", "cublas", "auto"])
def test_v_head_dim_apart_from_q_and_k(rng, path):
    # MLA's prefill shape in small: q and k of one head dim, v (and so out) of another.
    q, k = random(rng, (2, 4, 7, 48), "float32"), random(rng, (2, 2, 9, 48), "float32")
    v = random(rng, (2, 2, 9, 24), "float32")
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", path=path, return_lse=True)
    assert out.shape == (2, 4, 7, 24)
    want, want_lse = reference(q, k, v, "bottom_right")
    assert relative_error(out, want) <= TOLERANCE["float32"]
    assert relative_error(lse, want_lse) <= TOLERANCE["float32"]
    with pytest.raises(selfattn.NotAvailable, match="head_dim_v != head_dim_qk"):
        selfattn.attention(q, k, v, path="fused")


def test_scale(rng):
    run_case(rng, seq_q=5, dim=8, scale=0.37)


def test_bshd_views_of_packed_qkv(rng):
    """q, k, v as strided views of one packed [batch, seq, 3, heads, dim] array: no copies needed,
    and the output comes back in BSHD."""
    batch, seq, heads, dim = 2, 13, 3, 16
    qkv = random(rng, (batch, seq, 3, heads, dim), "float16")
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    out = selfattn.attention(q, k, v, layout="bshd", causal="top_left")
    assert out.shape == (batch, seq, heads, dim)
    want, _ = reference(*(a.transpose(0, 2, 1, 3) for a in (q, k, v)), causal="top_left")
    assert relative_error(out.transpose(0, 2, 1, 3), want) <= TOLERANCE["float16"]


def test_out_argument_is_written_in_place(rng):
    q, k, v = (random(rng, (1, 2, 9, 8), "float32") for _ in range(3))
    out = poisoned(q.shape, "float32")
    result = selfattn.attention(q, k, v, out=out)
    assert result is out
    assert relative_error(out, reference(q, k, v)[0]) <= TOLERANCE["float32"]


def test_out_view_leaves_the_rest_of_its_array_alone(rng):
    # out is every other row of a bigger array: the rows in between must keep their values.
    q, k, v = (random(rng, (1, 1, 5, 4), "float32") for _ in range(3))
    backing = np.full((1, 1, 10, 4), 7.0, dtype=np.float32)
    selfattn.attention(q, k, v, out=backing[:, :, ::2])
    assert np.all(backing[:, :, 1::2] == 7.0)
    assert relative_error(backing[:, :, ::2], reference(q, k, v)[0]) <= TOLERANCE["float32"]


def test_read_only_inputs(rng):
    q, k, v = (random(rng, (1, 1, 4, 8), "float32") for _ in range(3))
    for a in (q, k, v):
        a.flags.writeable = False
    assert relative_error(selfattn.attention(q, k, v), reference(q, k, v)[0]) <= TOLERANCE["float32"]


def test_no_keys_gives_zero_rows(rng):
    q = random(rng, (1, 2, 3, 8), "float32")
    k = v = np.empty((1, 2, 0, 8), dtype=np.float32)
    out, lse = selfattn.attention(q, k, v, return_lse=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)


def test_explicit_context(rng):
    ctx = selfattn.Context("sim", workspace_limit=1 << 20)
    assert ctx.backend == "sim" and ctx.workspace_limit == 1 << 20
    q, k, v = (random(rng, (1, 1, 6, 8), "float32") for _ in range(3))
    out = selfattn.attention(q, k, v, context=ctx, path="naive")
    assert relative_error(out, reference(q, k, v)[0]) <= TOLERANCE["float32"]
    assert ctx.workspace_bytes > 0, "the naive path keeps its scores in this context's workspace"


@pytest.mark.parametrize("hopper", [True, False])
def test_fused_kernel_choice(rng, hopper):
    # The sim reports compute capability 9.0: the fused forward runs the Hopper kernel unless the
    # context pins the mma.sync kernel. Both must give the right answer.
    ctx = selfattn.Context("sim", hopper_kernels=hopper)
    assert ctx.uses_hopper_kernels is hopper
    q, k, v = (random(rng, (1, 2, 37, 64), "bfloat16") for _ in range(3))
    out = selfattn.attention(q, k, v, context=ctx, path="fused", causal="bottom_right")
    assert relative_error(out, reference(q, k, v, "bottom_right")[0]) <= TOLERANCE["bfloat16"]


def test_version_backends_paths():
    assert selfattn.version() == selfattn.__version__
    assert [int(x) for x in selfattn.__version__.split(".")] >= [0, 1, 0]
    assert "sim" in selfattn.backends()
    assert set(selfattn.paths("sim")) <= {"naive", "cublas", "fused"}
    assert "naive" in selfattn.paths("sim")


def test_threads_share_the_default_context(rng):
    # Calls from several Python threads at once (the GIL is released while the sim runs) take turns
    # on the shared context; each gets its own correct result.
    from concurrent.futures import ThreadPoolExecutor
    cases = [[random(rng, (1, 2, 21, 16), "float32") for _ in range(3)] for _ in range(6)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        outs = list(pool.map(lambda qkv: selfattn.attention(*qkv, path="naive"), cases))
    for (q, k, v), out in zip(cases, outs):
        assert relative_error(out, reference(q, k, v)[0]) <= TOLERANCE["float32"]
