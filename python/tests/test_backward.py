"""selfattn.attention_backward() on NumPy arrays (the sim): against the float64 NumPy backward in
conftest.py, and a gradient check of it against central differences of selfattn.attention itself (what
torch.autograd.gradcheck does, without torch)."""
import numpy as np
import pytest

import selfattn
from conftest import (TOLERANCE, check_central_differences, check_varlen_backward, random, reference_backward,
                      relative_error)


def run_case(rng, dtype="float32", batch=1, heads=2, kv_heads=None, seq_q=7, seq_k=None, dim=16, causal=None,
             key_lengths=None, path="auto", grad_dtype=None, deterministic=False):
    kv_heads = kv_heads or heads
    seq_k = seq_q if seq_k is None else seq_k
    q = random(rng, (batch, heads, seq_q, dim), dtype)
    k = random(rng, (batch, kv_heads, seq_k, dim), dtype)
    v = random(rng, (batch, kv_heads, seq_k, dim), dtype)
    dout = random(rng, (batch, heads, seq_q, dim), dtype)
    out, lse = selfattn.attention(q, k, v, causal=causal, key_lengths=key_lengths, return_lse=True)
    dq, dk, dv = selfattn.attention_backward(q, k, v, out, dout, lse, causal=causal, key_lengths=key_lengths,
                                             path=path, grad_dtype=grad_dtype, deterministic=deterministic)
    want = reference_backward(q, k, v, dout, causal, None, key_lengths)
    for got, like, expected in zip((dq, dk, dv), (q, k, v), want):
        assert got.shape == like.shape
        assert got.dtype == (np.float32 if grad_dtype == "float32" else like.dtype)
        # Twice the forward's tolerance: dS = P (dP - D) cancels, and P and dS are rounded.
        assert relative_error(got, expected, per_row=False) <= 2 * TOLERANCE[dtype]
    return dq, dk, dv


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_paths_and_dtypes(rng, path, dtype):
    run_case(rng, dtype=dtype, heads=4, kv_heads=2, seq_q=37, seq_k=53, dim=32, causal="bottom_right", path=path)


@pytest.mark.parametrize("path", ["naive", "cublas", "auto"])
def test_v_head_dim_apart_from_q_and_k(rng, path):
    # Two head dims in small: dq and dk take q's head dim, dv v's; the fused backward refuses a pair
    # it has no kernel for.
    q, k = random(rng, (2, 4, 9, 48), "float16"), random(rng, (2, 2, 13, 48), "float16")
    v, dout = random(rng, (2, 2, 13, 24), "float16"), random(rng, (2, 4, 9, 24), "float16")
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", return_lse=True)
    grads = selfattn.attention_backward(q, k, v, out, dout, lse, causal="bottom_right", path=path)
    for got, like, expected in zip(grads, (q, k, v), reference_backward(q, k, v, dout, "bottom_right")):
        assert got.shape == like.shape and got.dtype == like.dtype
        assert relative_error(got, expected, per_row=False) <= 2 * TOLERANCE["float16"]
    with pytest.raises(selfattn.NotAvailable, match="head_dim_v != head_dim_qk"):
        selfattn.attention_backward(q, k, v, out, dout, lse, causal="bottom_right", path="fused")


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mla_prefill_pair_on_the_fused_backward(rng, dtype, deterministic):
    # q and k of 192 columns (128 + 64 rotary), v of 128: the fused backward's (192, 128) kernels.
    q, k = random(rng, (2, 4, 21, 192), dtype), random(rng, (2, 2, 70, 192), dtype)
    v, dout = random(rng, (2, 2, 70, 128), dtype), random(rng, (2, 4, 21, 128), dtype)
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", return_lse=True)
    grads = selfattn.attention_backward(q, k, v, out, dout, lse, causal="bottom_right", path="fused",
                                        deterministic=deterministic)
    for got, like, expected in zip(grads, (q, k, v), reference_backward(q, k, v, dout, "bottom_right")):
        assert got.shape == like.shape and got.dtype == like.dtype
        assert relative_error(got, expected, per_row=False) <= 2 * TOLERANCE[dtype]


@pytest.mark.parametrize("seq_q,seq_k,dim", [(1, 1, 1), (7, 113, 7), (113, 7, 16)])
def test_float32_odd_sizes(rng, seq_q, seq_k, dim):
    run_case(rng, seq_q=seq_q, seq_k=seq_k, dim=dim, causal="top_left")


def test_key_lengths_and_float32_gradients(rng):
    dq, dk, dv = run_case(rng, dtype="bfloat16", batch=2, seq_q=9, seq_k=12, dim=16, key_lengths=[0, 5],
                          grad_dtype="float32")
    assert np.all(dq[0] == 0) and np.all(dk[0] == 0) and np.all(dk[1, :, 5:] == 0) and np.all(dv[1, :, 5:] == 0)


def test_deterministic_is_bitwise_stable(rng):
    args = dict(dtype="float16", heads=2, seq_q=40, seq_k=70, dim=64, path="fused", deterministic=True)
    first = run_case(np.random.default_rng(7), **args)
    second = run_case(np.random.default_rng(7), **args)
    for a, b in zip(first, second):
        assert a.tobytes() == b.tobytes()


def test_gradcheck_against_the_library_forward(rng):
    # L = sum(dout * attention(q, k, v)): its central differences through selfattn.attention (float32
    # on the sim) must match attention_backward's gradients.
    q, k, v = (random(rng, (1, 2, n, 4), "float32") for n in (3, 5, 5))
    dout = random(rng, (1, 2, 3, 4), "float32")
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", return_lse=True, path="naive")
    grads = selfattn.attention_backward(q, k, v, out, dout, lse, causal="bottom_right", path="naive")

    def loss(*inputs):
        return float(np.sum(dout.astype(np.float64) * selfattn.attention(*inputs, causal="bottom_right", path="naive")))

    check_central_differences(loss, [q, k, v], grads)


@pytest.mark.parametrize("path", [p for p in selfattn.paths("sim") if p != "fused"])
def test_gradient_through_the_lse(rng, path):
    # L = sum(dout * out) + sum(dlse * lse), with key lengths (batch 0 sees no key: its lse is -inf
    # and takes no gradient), a window and softcap: attention_backward(dlse=...) against central
    # differences of the float64 reference's L. float32 here, so not the fused path (f16/bf16),
    # whose dlse cases are in the C++ sweep (tests/support/backward_check.h).
    from conftest import reference
    options = dict(causal="bottom_right", key_lengths=[0, 5], window=(2, 0), softcap=3.0)
    q, k, v = (random(rng, (2, 2, n, 4), "float32") for n in (3, 5, 5))
    dout = random(rng, (2, 2, 3, 4), "float32")
    dlse = random(rng, (2, 2, 3), "float32")
    out, lse = selfattn.attention(q, k, v, return_lse=True, **options)
    grads = selfattn.attention_backward(q, k, v, out, dout, lse, dlse=dlse, path=path, **options)

    def loss(*inputs):
        ref_out, ref_lse = reference(*inputs, **options)
        return float(np.sum(dout * ref_out) + np.sum(np.where(np.isfinite(ref_lse), dlse * ref_lse, 0.0)))

    check_central_differences(loss, [a.astype(np.float64) for a in (q, k, v)], grads, h=1e-4)
    with pytest.raises(selfattn.InvalidArgument, match=r"dlse expected shape \[2, 2, 3\]"):
        selfattn.attention_backward(q, k, v, out, dout, lse, dlse=dlse[0], **options)


def test_bshd_layout(rng):
    q = random(rng, (2, 11, 4, 16), "float32")  # [batch, seq, heads, dim]
    k = random(rng, (2, 9, 2, 16), "float32")
    v = random(rng, (2, 9, 2, 16), "float32")
    dout = random(rng, (2, 11, 4, 16), "float32")
    out, lse = selfattn.attention(q, k, v, layout="bshd", return_lse=True)
    dq, dk, dv = selfattn.attention_backward(q, k, v, out, dout, lse, layout="bshd")
    t = lambda a: np.swapaxes(a, 1, 2)
    for got, expected in zip((dq, dk, dv), reference_backward(t(q), t(k), t(v), t(dout))):
        assert relative_error(t(got), expected, per_row=False) <= 1e-5


def test_errors_name_the_argument(rng):
    q = random(rng, (1, 1, 4, 8), "float32")
    out, lse = selfattn.attention(q, q, q, return_lse=True)
    with pytest.raises(selfattn.InvalidArgument, match="dout"):
        selfattn.attention_backward(q, q, q, out, q[:, :, :3], lse)
    with pytest.raises(selfattn.InvalidArgument, match="grad_dtype"):
        selfattn.attention_backward(q, q, q, out, q, lse, grad_dtype="float16")


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_varlen_each_sequence_alone(rng, path, causal):
    check_varlen_backward(rng, "float16", [5, 1, 0, 12, 7], [7, 3, 4, 9, 0], dim=32, causal=causal, path=path)


def test_varlen_odd_sizes_float32_gradients_and_spare_rows(rng):
    check_varlen_backward(rng, "bfloat16", [1, 113, 7], [113, 7, 1], heads=2, kv_heads=1, dim=7, causal="bottom_right",
                grad_dtype="float32", spare_rows=3)


def test_varlen_errors_name_the_argument(rng):
    q = random(rng, (6, 2, 8), "float32")
    cu = np.array([0, 2, 6], dtype=np.int32)
    out, lse = selfattn.attention_varlen(q, q, q, cu, cu, return_lse=True)
    with pytest.raises(selfattn.InvalidArgument, match="lse"):
        selfattn.attention_varlen_backward(q, q, q, out, q, lse[:, :5], cu, cu)
    with pytest.raises(selfattn.InvalidArgument, match="cu_seqlens_k"):
        selfattn.attention_varlen_backward(q, q, q, out, q, lse, cu, cu[:2])
    with pytest.raises(selfattn.InvalidArgument, match="dout"):
        selfattn.attention_varlen_backward(q, q, q, out, q[:5], lse, cu, cu)
