"""FP8 KV caches from Python (selfattn/kv_cache.h, issue 37): caches of ml_dtypes' float8_e4m3fn /
float8_e5m2 (NumPy) and torch.float8_e4m3fn / float8_e5m2 (CPU tensors, on the sim), with k_scale=
and v_scale= per tensor or per kv head. append_kv's codes against a quantizer written here from the
formats' definition (OCP FP8: the value of every code decoded from its bits; x / scale in fp32,
rounded to the nearest code, ties to the even code, saturating at the largest finite value), which
is also checked against ml_dtypes' and torch's own casts where those agree with it (in range: both
libraries cast out-of-range values to NaN/inf instead of saturating). Attention, dense, paged and
packed, against the float64 reference over the dequantized cache (code value x scale: the scales
have few significant bits, so that product is exact in every dtype the paths compute in). The
refusals, each naming its argument. A decode step with an FP8 cache compiles whole."""
import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, poisoned, random, reference, relative_error
from test_kv_cache import PagedCache, paths

ml_dtypes = pytest.importorskip("ml_dtypes")

FORMATS = ("e4m3", "e5m2")
NUMPY_DTYPES = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2)}
LARGEST = {"e4m3": 448.0, "e5m2": 57344.0}
# Scales of few significant bits (a code times one is exact in fp32, f16 and bf16), per kv head.
K_SCALES = np.array([0.375, 1.25, 0.75, 0.625], np.float32) / 16
V_SCALES = np.array([0.625, 0.5, 1.25, 0.375], np.float32) / 16


def code_values(fmt):
    """float64 [256]: the value of each code, from the format's definition (sign bit 7; e4m3: 4
    exponent bits of bias 7, 3 mantissa bits, no infinities, NaN at S.1111.111; e5m2: 5 exponent bits
    of bias 15, 2 mantissa bits, infinities and NaN at exponent 31)."""
    exponent_bits, mantissa_bits = (4, 3) if fmt == "e4m3" else (5, 2)
    bias = (1 << (exponent_bits - 1)) - 1
    values = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent = (code >> mantissa_bits) & ((1 << exponent_bits) - 1)
        mantissa = code & ((1 << mantissa_bits) - 1)
        if fmt == "e4m3" and exponent == 15 and mantissa == 7:
            value = np.nan
        elif fmt == "e5m2" and exponent == 31:
            value = np.inf if mantissa == 0 else np.nan
        elif exponent == 0:
            value = mantissa / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            value = (1 + mantissa / (1 << mantissa_bits)) * 2.0 ** (exponent - bias)
        values[code] = sign * value
    return values


def quantize(x, scale, fmt):
    """uint8 codes of x / scale (scale broadcast against x), as kv_cache.h defines append_kv's: the
    division in fp32, then round to nearest, ties to the even code, saturating to +-LARGEST."""
    with np.errstate(over="ignore"):  # a quotient past float32's range is inf, which saturates too
        quotient = (np.asarray(x, np.float32) / np.asarray(scale, np.float32)).astype(np.float32)
    values = code_values(fmt)
    top = int(np.flatnonzero(values[:128] == LARGEST[fmt])[0])
    ladder = values[:top + 1]  # codes 0..top: increasing magnitudes
    magnitude = np.minimum(np.abs(quotient.astype(np.float64)), LARGEST[fmt])
    above = np.clip(np.searchsorted(ladder, magnitude), 0, top)
    below = np.clip(above - 1, 0, top)
    to_below, to_above = magnitude - ladder[below], ladder[above] - magnitude
    tie_to_below = (to_below == to_above) & (below % 2 == 0)
    codes = np.where((to_below < to_above) | tie_to_below, below, above).astype(np.uint8)
    codes |= np.signbit(quotient).astype(np.uint8) << 7
    return np.where(np.isnan(quotient), 0x7F, codes).astype(np.uint8)


def dequantized(codes, scale, fmt):
    """float64 code value x scale."""
    return code_values(fmt)[np.asarray(codes)] * np.asarray(scale, np.float64)


def per_head(scales, kv_heads, per_kv_head):
    """The scales a call takes (a float, or kv_heads of them) and their [1, kv_heads, 1, 1] broadcast."""
    given = scales[:kv_heads].copy() if per_kv_head else float(scales[0])
    return given, np.broadcast_to(np.asarray(given, np.float32).reshape(1, -1, 1, 1), (1, kv_heads, 1, 1))


def fp8_cache(rng, shape, fmt, scale4d, layout="bhsd"):
    """A cache of random codes (from normal values / scale), as the format's NumPy dtype, and its codes."""
    values = rng.standard_normal(shape).astype(np.float32)
    bhsd_scale = scale4d if layout == "bhsd" else scale4d.transpose(0, 2, 1, 3)
    codes = quantize(values, bhsd_scale, fmt)
    return codes.view(NUMPY_DTYPES[fmt]), codes


def test_the_quantizer_agrees_with_ml_dtypes_in_range():
    # The test's quantizer against ml_dtypes' cast (round to nearest even from float32) on every
    # value the library's append can produce short of saturation: each code's value, the midpoints
    # between neighbours (the ties) and points just beside them.
    for fmt in FORMATS:
        values = code_values(fmt)[:128]
        finite = np.sort(values[np.isfinite(values)])
        middles = (finite[1:] + finite[:-1]) / 2
        x = np.concatenate([finite, middles, np.nextafter(middles.astype(np.float32), 0),
                            np.nextafter(middles.astype(np.float32), np.inf)]).astype(np.float32)
        x = np.concatenate([x, -x])
        np.testing.assert_array_equal(quantize(x, 1.0, fmt), x.astype(NUMPY_DTYPES[fmt]).view(np.uint8), err_msg=fmt)
    assert quantize(np.float32(1e6), 1.0, "e4m3") == 0x7E and quantize(np.float32(-np.inf), 1.0, "e4m3") == 0xFE
    assert quantize(np.float32(1e6), 1.0, "e5m2") == 0x7B


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("new_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_append_writes_the_quantized_codes(rng, fmt, new_dtype, layout):
    batch, kv_heads, capacity, dim, seq_new = 3, 2, 9, 16, 2
    per_kv_head = layout == "bshd"
    k_scale, k4 = per_head(K_SCALES, kv_heads, per_kv_head)
    v_scale, v4 = per_head(V_SCALES, kv_heads, per_kv_head)
    shape = (batch, capacity, kv_heads, dim) if layout == "bshd" else (batch, kv_heads, capacity, dim)
    k_cache, _ = fp8_cache(rng, shape, fmt, k4, layout)
    v_cache, _ = fp8_cache(rng, shape, fmt, v4, layout)
    before_k, before_v = k_cache.view(np.uint8).copy(), v_cache.view(np.uint8).copy()
    lengths = np.array([3, 0, 8], np.int32)  # the last fills the cache and drops its second token
    new_shape = (batch, seq_new, kv_heads, dim) if layout == "bshd" else (batch, kv_heads, seq_new, dim)
    k_new, v_new = random(rng, new_shape, new_dtype), random(rng, new_shape, new_dtype)
    # Values past the finite range saturate, signs kept (bf16 and f32 reach e5m2's too).
    k_new.reshape(-1)[:3] = np.array([1e4, -1e4, 0.0], np.float32).astype(k_new.dtype)
    if new_dtype != "float16":
        v_new.reshape(-1)[:2] = np.array([3e38, -1e5], np.float32).astype(v_new.dtype)
    updated = selfattn.append_kv(k_cache, v_cache, lengths, k_new, v_new, layout=layout, return_lengths=True,
                                 k_scale=k_scale, v_scale=v_scale)
    np.testing.assert_array_equal(updated, np.minimum(lengths + seq_new, capacity))
    bhsd = (lambda a: a.transpose(0, 2, 1, 3)) if layout == "bshd" else (lambda a: a)
    for cache, before, new, scale in ((k_cache, before_k, k_new, k4), (v_cache, before_v, v_new, v4)):
        want = bhsd(before).copy()
        codes = quantize(bhsd(new).astype(np.float32), scale, fmt)
        for b in range(batch):
            n = min(seq_new, capacity - lengths[b])
            want[b, :, lengths[b]:lengths[b] + n] = codes[b, :, :n]
        np.testing.assert_array_equal(bhsd(cache.view(np.uint8)), want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_paged_and_packed_append(rng, fmt):
    # One packed step into a paged pool: sequence b's n_b tokens at its positions, in its pages.
    counts, lengths = [1, 0, 3], np.array([4, 2, 6], np.int32)
    kv_heads, dim, page_size = 2, 8, 4
    k_scale, k4 = per_head(K_SCALES, kv_heads, True)
    cache = PagedCache(rng, len(counts), kv_heads, 12, dim, page_size, "float32", "bshd")
    pool_k, _ = fp8_cache(rng, cache.k.shape, fmt, k4, "bshd")
    pool_v, _ = fp8_cache(rng, cache.v.shape, fmt, k4, "bshd")
    before_k = pool_k.view(np.uint8).copy()
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    k_new, v_new = random(rng, (cu[-1], kv_heads, dim), "float16"), random(rng, (cu[-1], kv_heads, dim), "float16")
    selfattn.append_kv(pool_k, pool_v, lengths, k_new, v_new, block_table=cache.table, layout="bshd",
                       cu_seqlens_new=cu, k_scale=k_scale, v_scale=float(V_SCALES[0]))
    want = before_k.copy()
    codes = quantize(k_new.astype(np.float32), k4[0, :, 0, 0][:, None], fmt)  # [total, kv_heads, dim]
    for b, n in enumerate(counts):
        for t in range(n):
            position = lengths[b] + t
            want[cache.table[b, position // page_size], position % page_size] = codes[cu[b] + t]
    np.testing.assert_array_equal(pool_k.view(np.uint8), want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("q_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("per_kv_head", [False, True])
def test_attention_over_the_dequantized_cache(rng, fmt, q_dtype, per_kv_head):
    batch, heads, kv_heads, capacity, dim, seq_q = 3, 4, 2, 11, 64, 2
    k_scale, k4 = per_head(K_SCALES, kv_heads, per_kv_head)
    v_scale, v4 = per_head(V_SCALES, kv_heads, per_kv_head)
    k_cache, k_codes = fp8_cache(rng, (batch, kv_heads, capacity, dim), fmt, k4)
    v_cache, v_codes = fp8_cache(rng, (batch, kv_heads, capacity, dim), fmt, v4)
    lengths = np.array([5, 0, 11], np.int32)
    q = random(rng, (batch, heads, seq_q, dim), q_dtype)
    want, want_lse = reference(q, dequantized(k_codes, k4, fmt), dequantized(v_codes, v4, fmt), "bottom_right",
                               key_lengths=lengths)
    for path in paths():
        out = poisoned(q.shape, q_dtype)
        _, lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, path=path, out=out, return_lse=True,
                                                  k_scale=k_scale, v_scale=v_scale)
        assert out.dtype == q.dtype
        assert relative_error(out, want) <= TOLERANCE[q_dtype], path
        np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    # A per-tensor k_scale beside a per-head v_scale (repeated to kv_heads for the library).
    out = selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, k_scale=np.float32(K_SCALES[0]),
                                           v_scale=np.broadcast_to(v4, (1, kv_heads, 1, 1)).reshape(-1))
    want, _ = reference(q, dequantized(k_codes, K_SCALES[0], fmt), dequantized(v_codes, v4, fmt), "bottom_right",
                        key_lengths=lengths)
    assert relative_error(out, want) <= TOLERANCE[q_dtype]


@pytest.mark.parametrize("fmt", FORMATS)
def test_append_then_attend_paged_and_packed(rng, fmt):
    # A packed step over a paged FP8 pool: append the new tokens, then attend each sequence's rows;
    # the reference reads the pool's codes dequantized, gathered in each sequence's order.
    counts, lengths = [1, 0, 4], np.array([6, 3, 2], np.int32)
    heads, kv_heads, dim, page_size = 4, 2, 16, 4
    k_scale, k4 = per_head(K_SCALES, kv_heads, True)
    cache = PagedCache(rng, len(counts), kv_heads, 12, dim, page_size, "float32", "bhsd")
    cache.k, _ = fp8_cache(rng, cache.k.shape, fmt, k4)
    cache.v, _ = fp8_cache(rng, cache.v.shape, fmt, k4)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    k_new, v_new = random(rng, (cu[-1], kv_heads, dim), "float16"), random(rng, (cu[-1], kv_heads, dim), "float16")
    updated = selfattn.append_kv(cache.k, cache.v, lengths, k_new, v_new, block_table=cache.table,
                                 cu_seqlens_new=cu, return_lengths=True, k_scale=k_scale, v_scale=k_scale)
    q = random(rng, (cu[-1], heads, dim), "float16")
    keys = dequantized(cache.gather(cache.k.view(np.uint8)), k4, fmt)
    values = dequantized(cache.gather(cache.v.view(np.uint8)), k4, fmt)
    for path in paths():
        out = selfattn.attention_with_kv_cache(q, cache.k, cache.v, updated, block_table=cache.table,
                                               cu_seqlens_q=cu, path=path, k_scale=k_scale, v_scale=k_scale)
        for b, n in enumerate(counts):
            if n == 0:
                continue
            want, _ = reference(q[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None], keys[b:b + 1], values[b:b + 1],
                                "bottom_right", key_lengths=updated[b:b + 1])
            assert relative_error(out[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None], want) <= TOLERANCE["float16"], \
                (path, b)


def small_cache(fmt="e4m3", kv_heads=2):
    k = np.zeros((1, kv_heads, 4, 8), NUMPY_DTYPES[fmt])
    return k, np.zeros_like(k), np.array([1], np.int32)


@pytest.mark.parametrize("call", ["append_kv", "attention_with_kv_cache"])
def test_bad_scales_are_refused_by_name(call):
    k, v, lengths = small_cache()
    new = np.ones((1, 2, 1, 8), np.float32)
    q = np.ones((1, 4, 1, 8), np.float32)

    def run(k_cache=k, v_cache=v, **scales):
        if call == "append_kv":
            return selfattn.append_kv(k_cache, v_cache, lengths, new, new, **scales)
        return selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, **scales)

    cases = [
        (dict(k_scale=[0.5, 0.5, 0.5], v_scale=1.0),
         "k_scale expected .*1 \\(per tensor\\) or kv_heads = 2 \\(per kv head\\).*got shape \\(3,\\)"),
        (dict(k_scale=1.0, v_scale=np.ones((2, 1), np.float32)), "v_scale expected .*got shape \\(2, 1\\)"),
        (dict(k_scale=0.0, v_scale=1.0), "k_scale expected finite values > 0.*k_scale\\[0\\] = 0.0"),
        (dict(k_scale=1.0, v_scale=[1.0, -2.0]), "v_scale expected finite values > 0.*v_scale\\[1\\] = -2.0"),
        (dict(k_scale=np.nan, v_scale=1.0), "k_scale expected finite values > 0.*nan"),
        (dict(k_scale=1.0, v_scale=np.inf), "v_scale expected finite values > 0.*inf"),
        (dict(k_scale="big", v_scale=1.0), "k_scale expected a float or a 1-D array"),
        (dict(v_scale=1.0), "k_scale expected .*float8_e4m3fn: real value = stored x scale\\), got None"),
        (dict(k_scale=1.0), "v_scale expected .*got None"),
    ]
    for scales, message in cases:
        with pytest.raises(selfattn.InvalidArgument, match=message):
            run(**scales)
    assert np.all(k.view(np.uint8) == 0) and np.all(v.view(np.uint8) == 0)  # nothing written
    # A 16-bit cache takes no scales; two FP8 formats in one cache, or another 8-bit float, are refused.
    half = np.zeros((1, 2, 4, 8), np.float16)
    with pytest.raises(selfattn.InvalidArgument, match="k_scale expected None: k_cache.dtype is float16, not FP8"):
        run(half, half, k_scale=1.0, v_scale=1.0)
    with pytest.raises(selfattn.InvalidArgument, match="v_scale expected None"):
        run(half, half, v_scale=1.0)
    with pytest.raises(selfattn.InvalidArgument, match="v_cache.dtype expected float8_e4m3fn .*got float8_e5m2"):
        run(k, small_cache("e5m2")[1], k_scale=1.0, v_scale=1.0)
    with pytest.raises(selfattn.InvalidArgument, match="k_cache.dtype float8_e4m3 is not an FP8 format selfattn takes"):
        run(np.zeros((1, 2, 4, 8), ml_dtypes.float8_e4m3), v, k_scale=1.0, v_scale=1.0)


def test_fp8_new_tokens_and_queries_are_refused():
    # append_kv quantizes f32/f16/bf16 tokens; attention takes f32/f16/bf16 queries (the library's
    # refusal, naming the FP8 dtype, not a uint8).
    k, v, lengths = small_cache()
    new = np.zeros((1, 2, 1, 8), NUMPY_DTYPES["e4m3"])
    with pytest.raises(selfattn.InvalidArgument, match="k_new.dtype expected .*got e4m3"):
        selfattn.append_kv(k, v, lengths, new, new, k_scale=1.0, v_scale=1.0)
    with pytest.raises(selfattn.InvalidArgument, match="q.dtype.*e4m3"):
        selfattn.attention_with_kv_cache(np.zeros((1, 2, 1, 8), NUMPY_DTYPES["e4m3"]), k, v, lengths, k_scale=1.0,
                                         v_scale=1.0)


# ---- torch tensors (CPU, on the sim) -----------------------------------------------------------

def torch_format(fmt):
    torch = pytest.importorskip("torch")
    return {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_append_and_attend(rng, fmt):
    torch = pytest.importorskip("torch")
    dtype = torch_format(fmt)
    batch, heads, kv_heads, capacity, dim, seq_new = 2, 4, 2, 8, 64, 1
    k_scale = torch.tensor(K_SCALES[:kv_heads])  # per kv head, a CPU tensor
    v_scale = float(V_SCALES[0])  # per tensor, a float
    k_cache = torch.zeros(batch, capacity, kv_heads, dim, dtype=dtype)  # bshd
    v_cache = torch.zeros_like(k_cache)
    lengths = torch.tensor([2, 7], dtype=torch.int32)
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    k_new, v_new = (torch.randn(batch, seq_new, kv_heads, dim, generator=g, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(batch, seq_new, heads, dim, generator=g, dtype=torch.bfloat16)
    updated = selfattn.append_kv(k_cache, v_cache, lengths, k_new, v_new, layout="bshd", return_lengths=True,
                                 k_scale=k_scale, v_scale=v_scale)
    assert updated.tolist() == [3, 8]
    k_codes = k_cache.view(torch.uint8).numpy()
    scale_bshd = K_SCALES[:kv_heads].reshape(1, 1, kv_heads, 1)
    for b in range(batch):
        at = int(lengths[b])
        want = quantize(k_new[b].float().numpy(), scale_bshd[0], fmt)
        np.testing.assert_array_equal(k_codes[b, at:at + seq_new], want)
        # torch's own cast of the fp32 quotient, where nothing saturates, agrees.
        quotient = k_new[b].float() / torch.from_numpy(scale_bshd[0])
        np.testing.assert_array_equal(k_codes[b, at:at + seq_new], quotient.to(dtype).view(torch.uint8).numpy())
    out, lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, updated, layout="bshd", return_lse=True,
                                                k_scale=k_scale, v_scale=v_scale)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    keys = dequantized(k_codes, scale_bshd, fmt).transpose(0, 2, 1, 3)
    values = dequantized(v_cache.view(torch.uint8).numpy(), v_scale, fmt).transpose(0, 2, 1, 3)
    want, want_lse = reference(q.float().numpy().transpose(0, 2, 1, 3), keys, values, "bottom_right",
                               key_lengths=updated.numpy())
    assert relative_error(out.float().numpy().transpose(0, 2, 1, 3), want) <= TOLERANCE["bfloat16"]
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-5, atol=1e-5)
    # out= (the out op), with the scales as tensors of one entry each.
    into = torch.full_like(q, float("nan"))
    selfattn.attention_with_kv_cache(q, k_cache, v_cache, updated, layout="bshd", out=into, k_scale=k_scale,
                                     v_scale=torch.tensor([v_scale]))
    assert torch.equal(into, out)


def test_torch_decode_step_compiles_whole(rng):
    # append_kv into an FP8 pool and attention over it trace with fullgraph=True (the scales are the
    # ops' last arguments); compiled and eager agree, the caches' codes included.
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    pool_k = (torch.randn(5, 4, 2, 16, generator=g) * 4).to(torch.float8_e4m3fn)  # bshd pages of 4
    pool_v = (torch.randn(5, 4, 2, 16, generator=g) * 4).to(torch.float8_e4m3fn)
    table = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32)
    lengths = torch.tensor([2, 6], dtype=torch.int32)
    k_new, v_new = (torch.randn(2, 1, 2, 16, generator=g, dtype=torch.float16) for _ in range(2))
    q = torch.randn(2, 1, 4, 16, generator=g, dtype=torch.float16)
    k_scale = torch.tensor([0.25, 0.375])

    def step(q, k_new, v_new, pool_k, pool_v, lengths):
        updated = selfattn.append_kv(pool_k, pool_v, lengths, k_new, v_new, block_table=table, layout="bshd",
                                     return_lengths=True, k_scale=k_scale, v_scale=0.5)
        out = selfattn.attention_with_kv_cache(q, pool_k, pool_v, updated, block_table=table, layout="bshd",
                                               k_scale=k_scale, v_scale=0.5)
        return out, updated

    eager_k, eager_v = pool_k.clone(), pool_v.clone()
    want, want_lengths = step(q, k_new, v_new, eager_k, eager_v, lengths)
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    got, got_lengths = compiled(q, k_new, v_new, pool_k, pool_v, lengths)
    assert torch.equal(got, want) and torch.equal(got_lengths, want_lengths)
    assert torch.equal(pool_k.view(torch.uint8), eager_k.view(torch.uint8))
    assert torch.equal(pool_v.view(torch.uint8), eager_v.view(torch.uint8))

    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():  # the fake implementations with the scales given (by keyword: they are last)
        fake_q = torch.empty(3, 2, 7, 16)
        pool = torch.empty(9, 2, 4, 16, dtype=torch.float8_e4m3fn)
        cu = torch.empty(3, dtype=torch.int32)
        scales = torch.empty(2)
        out, lse = torch.ops.selfattn.attention_with_kv_cache(fake_q, pool, pool, cu, None, None, "bhsd",
                                                              "bottom_right", None, "auto", None, None, False, None, 1,
                                                              0, -1, -1, None, None, None, None, None, None, False,
                                                              None, 0, k_scale=scales, v_scale=scales)
        assert out.shape == fake_q.shape and out.dtype == fake_q.dtype and lse.shape == (3, 2, 7)


def test_torch_refusals():
    torch = pytest.importorskip("torch")
    k_cache = torch.zeros(1, 2, 4, 8, dtype=torch.float8_e5m2)
    lengths = torch.tensor([1], dtype=torch.int32)
    q = torch.zeros(1, 2, 1, 8)
    with pytest.raises(selfattn.InvalidArgument, match="k_scale expected finite values > 0.*k_scale\\[1\\] = -1.0"):
        selfattn.attention_with_kv_cache(q, k_cache, k_cache, lengths, k_scale=torch.tensor([1.0, -1.0]),
                                         v_scale=1.0)
    with pytest.raises(selfattn.InvalidArgument, match="v_scale expected .*got shape \\(3,\\)"):
        selfattn.attention_with_kv_cache(q, k_cache, k_cache, lengths, k_scale=1.0, v_scale=torch.ones(3))
    with pytest.raises(selfattn.InvalidArgument, match="k_scale expected .*float8_e5m2.*got None"):
        selfattn.attention_with_kv_cache(q, k_cache, k_cache, lengths, v_scale=1.0)
    with pytest.raises(selfattn.InvalidArgument, match="k_scale expected None: k_cache.dtype is float32"):
        selfattn.attention_with_kv_cache(q, q, q, lengths, k_scale=1.0, v_scale=1.0)
    with pytest.raises(selfattn.InvalidArgument, match="k_cache.dtype float8_e4m3fnuz is not an FP8 format"):
        selfattn.attention_with_kv_cache(q, k_cache.to(torch.float8_e4m3fnuz), k_cache, lengths, k_scale=1.0,
                                         v_scale=1.0)
    with pytest.raises(selfattn.NotAvailable, match="append_kv: v_scale requires grad"):
        selfattn.append_kv(k_cache, k_cache.clone(), lengths, q[:, :1], q[:, :1], k_scale=1.0,
                           v_scale=torch.ones(1, requires_grad=True))
    with pytest.raises(selfattn.NotAvailable, match="attention_with_kv_cache: q requires grad"):
        selfattn.attention_with_kv_cache(q.requires_grad_(), k_cache, k_cache, lengths, k_scale=1.0, v_scale=1.0)
