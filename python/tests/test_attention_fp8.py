"""The FP8 forward from Python (selfattn/attention.h "FP8 inputs", issue 37): q, k, v of ml_dtypes'
float8_e4m3fn / float8_e5m2 (NumPy) or torch's (CPU tensors, on the sim) with q_descale=,
k_descale=, v_descale= per (batch, kv head) and out_dtype=, against the float64 reference over the
dequantized inputs (code value x descale: the descales have few significant bits, so the
dequantized values are exact in every dtype the library computes in), dense, GQA, causal, key
lengths, and packed (attention_varlen, a row of descales per sequence); the torch ops (default out
bfloat16, out=, torch.compile fullgraph, the fake's dtype); the refusals, each naming its argument
(inputs that require grad: FP8 has no backward). The tests that need the library's FP8 forward
skip, with the library's reason, where a build refuses FP8 q."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, reference, relative_error
from test_kv_cache_fp8 import NUMPY_DTYPES, code_values, quantize

ml_dtypes = pytest.importorskip("ml_dtypes")

FORMATS = ("e4m3", "e5m2")


def library_refusal():
    """Why this build cannot run an FP8 forward ('' when it can): the library's message."""
    x = np.zeros((1, 1, 1, 8), NUMPY_DTYPES["e4m3"])
    try:
        selfattn.attention(x, x, x)
    except selfattn.InvalidArgument as error:
        if "e4m3" in str(error):
            return str(error)
        raise
    return ""


needs_fp8_forward = pytest.mark.skipif(bool(library_refusal()), reason="the library refuses FP8 q here (the FP8 "
                                       "forward is not in this build): " + library_refusal())


def fp8_inputs(rng, fmt, batch, heads, kv_heads, seq_q, seq_k, dim):
    """q, k, v as FP8 arrays (codes of normal values over their descales), their codes, and the
    descales, float32 [batch, kv_heads] of few significant bits."""
    steps = np.array([0.375, 1.25, 0.75, 0.625, 0.5, 1.5], np.float32) / 8
    descales = [np.roll(steps, i)[np.arange(batch * kv_heads) % 6].reshape(batch, kv_heads).copy() for i in range(3)]
    group = heads // kv_heads
    arrays, codes = [], []
    for which, (rows, h) in enumerate(((seq_q, heads), (seq_k, kv_heads), (seq_k, kv_heads))):
        per_head = np.repeat(descales[which], group, axis=1) if h == heads else descales[which]
        values = rng.standard_normal((batch, h, rows, dim)).astype(np.float32)
        code = quantize(values, per_head[:, :, None, None], fmt)
        arrays.append(code.view(NUMPY_DTYPES[fmt]))
        codes.append(code)
    return arrays, codes, descales


def dequantized(codes, descales, fmt, heads):
    """float64 code value x descale, the descale of each head's kv head."""
    per_head = np.repeat(descales, heads // descales.shape[1], axis=1)
    return code_values(fmt)[codes] * per_head[:, :, None, None]


@needs_fp8_forward
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [None, "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_numpy_fp8_forward(rng, fmt, out_dtype, causal):
    batch, heads, kv_heads, seq_q, seq_k, dim = 2, 4, 2, 5, 9, 64
    (q, k, v), (cq, ck, cv), (dq, dk, dv) = fp8_inputs(rng, fmt, batch, heads, kv_heads, seq_q, seq_k, dim)
    lengths = np.array([9, 4], np.int32)
    want, want_lse = reference(dequantized(cq, dq, fmt, heads), dequantized(ck, dk, fmt, kv_heads),
                               dequantized(cv, dv, fmt, kv_heads), causal, key_lengths=lengths)
    expected_dtype = out_dtype or "float32"  # NumPy's default
    for path in selfattn.paths("sim"):
        out, lse = selfattn.attention(q, k, v, causal=causal, key_lengths=lengths, q_descale=dq, k_descale=dk,
                                      v_descale=dv, out_dtype=out_dtype, return_lse=True, path=path)
        assert out.dtype.name == expected_dtype and out.shape == q.shape
        assert relative_error(out, want) <= TOLERANCE[expected_dtype], path
        np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


@needs_fp8_forward
def test_numpy_fp8_forward_bshd_out_and_unit_descales(rng):
    # layout="bshd", a preallocated float16 out (its dtype is the result's), descales left at 1.
    (q, k, v), (cq, ck, cv), _ = fp8_inputs(rng, "e4m3", 1, 2, 1, 3, 6, 16)
    ones = np.ones((1, 1), np.float32)
    out = np.full((1, 3, 2, 16), np.nan, np.float16)
    got = selfattn.attention(*(a.transpose(0, 2, 1, 3) for a in (q, k, v)), layout="bshd", out=out)
    assert got is out
    want, _ = reference(dequantized(cq, ones, "e4m3", 2), dequantized(ck, ones, "e4m3", 1),
                        dequantized(cv, ones, "e4m3", 1))
    assert relative_error(out.transpose(0, 2, 1, 3), want) <= TOLERANCE["float16"]


@needs_fp8_forward
def test_torch_fp8_forward(rng):
    torch = pytest.importorskip("torch")
    (q, k, v), (cq, ck, cv), (dq, dk, dv) = fp8_inputs(rng, "e4m3", 2, 4, 1, 3, 7, 64)
    tq, tk, tv = (torch.from_numpy(c).view(torch.float8_e4m3fn) for c in (cq, ck, cv))
    descales = dict(q_descale=torch.from_numpy(dq), k_descale=torch.from_numpy(dk), v_descale=torch.from_numpy(dv))
    out, lse = selfattn.attention(tq, tk, tv, causal="bottom_right", return_lse=True, **descales)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32  # FlashAttention-3's output dtype
    want, want_lse = reference(dequantized(cq, dq, "e4m3", 4), dequantized(ck, dk, "e4m3", 1),
                               dequantized(cv, dv, "e4m3", 1), "bottom_right")
    assert relative_error(out.float().numpy(), want) <= TOLERANCE["bfloat16"]
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-5, atol=1e-5)
    # out= (the out op) in float32; the result's dtype is out's.
    into = torch.full(tq.shape, float("nan"))
    selfattn.attention(tq, tk, tv, causal="bottom_right", out=into, **descales)
    assert relative_error(into.numpy(), want) <= TOLERANCE["float32"]
    # The op traces whole, the descales and out_dtype among its arguments; compiled and eager agree.
    compiled = torch.compile(lambda a, b, c: selfattn.attention(a, b, c, causal="bottom_right", out_dtype=torch.float16,
                                                                **descales), backend="eager", fullgraph=True)
    assert torch.equal(compiled(tq, tk, tv), selfattn.attention(tq, tk, tv, causal="bottom_right",
                                                                out_dtype=torch.float16, **descales))


@needs_fp8_forward
@pytest.mark.parametrize("fmt", FORMATS)
def test_numpy_fp8_varlen(rng, fmt):
    # Packed sequences of FP8 q, k, v, each sequence with its own row of descales: each against the
    # reference of it alone (dense fp8_inputs of batch = the sequences, packed here).
    lengths_q, lengths_k, heads, kv_heads, dim = [3, 1, 5], [4, 6, 2], 4, 2, 64
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    (q, k, v), (cq, ck, cv), (dq, dk, dv) = fp8_inputs(rng, fmt, 3, heads, kv_heads, max(lengths_q), max(lengths_k),
                                                       dim)

    def packed(a, lengths):  # [batch, h, rows, d] -> [total, h, d], the first lengths[b] rows of each
        return np.concatenate([a[b, :, :n].transpose(1, 0, 2) for b, n in enumerate(lengths)])

    out, lse = selfattn.attention_varlen(packed(q, lengths_q), packed(k, lengths_k), packed(v, lengths_k), cu_q, cu_k,
                                         causal="bottom_right", q_descale=dq, k_descale=dk, v_descale=dv,
                                         out_dtype="bfloat16", return_lse=True)
    assert out.dtype.name == "bfloat16" and lse.shape == (heads, cu_q[-1])
    for b in range(3):
        rows_q, rows_k = slice(0, lengths_q[b]), slice(0, lengths_k[b])
        want, want_lse = reference(dequantized(cq[b:b + 1, :, rows_q], dq[b:b + 1], fmt, heads),
                                   dequantized(ck[b:b + 1, :, rows_k], dk[b:b + 1], fmt, kv_heads),
                                   dequantized(cv[b:b + 1, :, rows_k], dv[b:b + 1], fmt, kv_heads), "bottom_right")
        got = out[cu_q[b]:cu_q[b + 1]].transpose(1, 0, 2)[None]
        assert relative_error(got, want) <= TOLERANCE["bfloat16"], b
        np.testing.assert_allclose(lse[:, cu_q[b]:cu_q[b + 1]], want_lse[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(selfattn.InvalidArgument, match="q_descale expected .*= \\[3, 2\\], got shape \\(2, 2\\)"):
        selfattn.attention_varlen(packed(q, lengths_q), packed(k, lengths_k), packed(v, lengths_k), cu_q, cu_k,
                                  q_descale=dq[:2])


@needs_fp8_forward
def test_torch_fp8_varlen_compiles(rng):
    torch = pytest.importorskip("torch")
    (q, k, v), (cq, ck, cv), (dq, dk, dv) = fp8_inputs(rng, "e5m2", 2, 2, 1, 4, 4, 64)
    # Two sequences of 4 rows: [batch, h, 4, d] packed as [total, h, d].
    tq, tk, tv = (torch.from_numpy(c.transpose(0, 2, 1, 3).reshape(-1, c.shape[1], c.shape[3]).copy())
                  .view(torch.float8_e5m2) for c in (cq, ck, cv))
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    descales = dict(q_descale=torch.from_numpy(dq), k_descale=torch.from_numpy(dk), v_descale=torch.from_numpy(dv))

    def call(a, b, c):
        return selfattn.attention_varlen(a, b, c, cu, cu, max_seqlen_q=4, max_seqlen_k=4, **descales)

    eager = call(tq, tk, tv)
    assert eager.dtype == torch.bfloat16
    compiled = torch.compile(call, backend="eager", fullgraph=True)
    assert torch.equal(compiled(tq, tk, tv), eager)
    want, _ = reference(dequantized(cq, dq, "e5m2", 2), dequantized(ck, dk, "e5m2", 1), dequantized(cv, dv, "e5m2", 1))
    got = eager.float().numpy().reshape(2, 4, 2, 64).transpose(0, 2, 1, 3)
    assert relative_error(got, want) <= TOLERANCE["bfloat16"]


def test_the_fake_gives_out_dtype():
    torch = pytest.importorskip("torch")
    from selfattn import _torch
    if _torch.ops() is None:  # registers the ops
        pytest.skip("this PyTorch has no torch.library.custom_op")
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 4, 3, 64, dtype=torch.float8_e4m3fn)
        k = torch.empty(2, 1, 7, 64, dtype=torch.float8_e4m3fn)
        out, lse = torch.ops.selfattn.attention(q, k, k, None, None, "auto", None, "bhsd", False, -1, -1, None, None,
                                                None, None, None, None, out_dtype=torch.bfloat16)
        assert out.dtype == torch.bfloat16 and out.shape == q.shape and lse.shape == (2, 4, 3)


def test_refusals_name_the_argument():
    q = np.zeros((2, 4, 3, 8), NUMPY_DTYPES["e4m3"])
    k = np.zeros((2, 2, 5, 8), NUMPY_DTYPES["e4m3"])
    cases = [
        (dict(q_descale=np.ones((2, 4), np.float32)), "q_descale expected .*\\[batch, kv_heads\\] = \\[2, 2\\], got "
                                                      "shape \\(2, 4\\)"),
        (dict(k_descale=[[1.0, 1.0], [1.0, 0.0]]), "k_descale expected finite values > 0.*k_descale\\[1, 1\\] = 0.0"),
        (dict(v_descale=float("nan")), "v_descale expected finite values > 0"),
        (dict(out_dtype="float64"), "out_dtype expected None, float32, float16 or bfloat16, got 'float64'"),
        (dict(out_dtype="float16", out=np.zeros(q.shape, np.float32)),
         "attention: out_dtype expected None or out.dtype \\(float32\\), got float16"),
    ]
    for options, message in cases:
        with pytest.raises(selfattn.InvalidArgument, match=message):
            selfattn.attention(q, k, k, **options)
    with pytest.raises(selfattn.InvalidArgument, match="k.dtype expected float8_e4m3fn \\(q.dtype: one FP8 format per "
                                                       "call\\), got float8_e5m2"):
        selfattn.attention(q, k.view(np.uint8).view(NUMPY_DTYPES["e5m2"]), k)
    half = np.zeros((2, 4, 3, 8), np.float16)
    for name in ("q_descale", "k_descale", "v_descale", "out_dtype"):
        value = "float16" if name == "out_dtype" else 1.0
        with pytest.raises(selfattn.InvalidArgument, match=f"attention: {name} expected None: q.dtype is float16, "
                                                           f"not FP8"):
            selfattn.attention(half, half[:, :2], half[:, :2], **{name: value})


def test_torch_inputs_that_require_grad_are_refused():
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 2, 3, 8).to(torch.float8_e4m3fn)
    k = torch.zeros(1, 1, 3, 8).to(torch.float8_e4m3fn)
    sinks = torch.zeros(2, requires_grad=True)
    with pytest.raises(selfattn.NotAvailable, match="attention: sinks requires grad, but FP8 inputs have no backward"):
        selfattn.attention(q, k, k, sinks=sinks)
    with pytest.raises(selfattn.NotAvailable, match="attention: k requires grad, but FP8 inputs have no backward"):
        selfattn.attention(q, k.clone().requires_grad_(), k)
    with pytest.raises(selfattn.NotAvailable, match="attention: q requires grad"):
        selfattn.attention(q.clone().requires_grad_(), k, k, out=torch.empty(q.shape))
    with torch.no_grad():  # no graph to record: accepted (then refused or run by the library)
        try:
            selfattn.attention(q.clone().requires_grad_(), k, k)
        except selfattn.InvalidArgument as error:
            assert "e4m3" in str(error)  # a build without the FP8 forward
    with pytest.raises(selfattn.InvalidArgument, match="q.dtype float8_e4m3fnuz is not an FP8 format"):
        selfattn.attention(q.to(torch.float8_e4m3fnuz), k, k)
