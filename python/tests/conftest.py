"""Shared pieces of the Python tests: a float64 NumPy reference of attention written here (not the
library's), fresh random inputs, and the tolerances per dtype; and for the torch tests
(test_torch_*.py) the device fixture and their tensor helpers."""
import math
import os
import zlib

import numpy as np
import pytest

import selfattn

try:
    import ml_dtypes
except ImportError:  # bf16 tests skip without it
    ml_dtypes = None

# Largest relative error of a row (relative_error below), per input dtype.
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def numpy_dtype(name):
    if name == "bfloat16":
        if ml_dtypes is None:
            pytest.skip("ml_dtypes is not installed (bfloat16 from NumPy comes through it)")
        return ml_dtypes.bfloat16
    return np.dtype(name)


def visible(row, seq_q, len_k, causal):
    """How many keys (a prefix) query `row` sees; the rule of selfattn/types.h, restated."""
    if causal is None:
        n = len_k
    elif causal == "top_left":
        n = row + 1
    else:
        n = row + 1 + len_k - seq_q
    return max(0, min(n, len_k))


def visible_range(row, seq_q, len_k, causal, window=None, key_start=None, q_offset=None):
    """Keys [begin, end) query `row` sees (causal mask, then the sliding window), and its aligned
    position i' (selfattn/attention.h: i under top_left, i + len_k - seq_q otherwise). With a
    key_start (left padding: keys before it are not seen, positions count from it) and a q_offset
    (row 0's position counted from the start), i' = start + q_offset + i, or start + i under
    top_left; a causal mask of either alignment then ends the keys at i' + 1."""
    if key_start is None and q_offset is None:
        aligned = row if causal == "top_left" else row + len_k - seq_q
        begin, end = 0, visible(row, seq_q, len_k, causal)
    else:
        start = min(max(int(key_start or 0), 0), len_k)
        if q_offset is not None:
            aligned = start + max(int(q_offset), 0) + row
        else:
            aligned = start + row if causal == "top_left" else len_k - seq_q + row
        begin, end = start, len_k if causal is None else min(len_k, aligned + 1)
    if window is not None:
        left, right = window
        if right >= 0:
            end = min(end, aligned + right + 1)
        if left >= 0:
            begin = max(begin, aligned - left)
    return begin, max(begin, end), aligned


class Mods:
    """The masks and score modifiers of one call (the keyword arguments of selfattn.attention), as
    float64 per (batch, head, row): which keys a row sees, their modified scores, and the head's
    sink logit."""

    def __init__(self, shape, causal=None, window=None, softcap=None, alibi_slopes=None, bias=None, sinks=None,
                 key_start=None, q_offset=None, dropout=None):
        self.batch, self.heads, self.seq_q, self.seq_k = shape
        self.dropout = dropout  # None, or (p, keep [batch, heads, seq_q, seq_k]): dropout_keep_mask()'s
        self.causal, self.window, self.softcap = causal, window, softcap
        self.key_start, self.q_offset = key_start, q_offset  # [batch] each, or None
        self.slopes = None if alibi_slopes is None else \
            np.broadcast_to(np.asarray(alibi_slopes, dtype=np.float64), (self.batch, self.heads))
        self.bias = None if bias is None else np.broadcast_to(np.asarray(bias, dtype=np.float64), shape)
        self.sinks = None if sinks is None else np.broadcast_to(np.asarray(sinks, dtype=np.float64), (self.heads,))

    def dropout_factor(self, b, h, i, keys):
        """What dropout multiplies row i's weights of `keys` by: keep / (1 - p) (1 without dropout)."""
        if self.dropout is None:
            return np.ones(len(keys))
        p, keep = self.dropout
        return keep[b, h, i, keys] / (1.0 - p)

    def sink(self, h):
        """Head h's sink logit, -inf without one."""
        return -np.inf if self.sinks is None else float(self.sinks[h])

    def scores(self, raw_scores, b, h, i, len_k):
        """(keys, s, ds/draw) for row i: the visible keys (a range), their scores after softcap,
        ALiBi and bias (in that order), and the softcap's derivative (the backward's factor)."""
        begin, end, aligned = visible_range(i, self.seq_q, len_k, self.causal, self.window,
                                            None if self.key_start is None else self.key_start[b],
                                            None if self.q_offset is None else self.q_offset[b])
        keys = np.arange(begin, end)
        raw = raw_scores(keys)
        s, factor = raw, np.ones_like(raw)
        if self.softcap is not None:
            s = self.softcap * np.tanh(raw / self.softcap)
            factor = 1 - np.tanh(raw / self.softcap) ** 2
        if self.slopes is not None:
            s = s - self.slopes[b, h] * np.abs(aligned - keys)
        if self.bias is not None:
            s = s + self.bias[b, h, i, keys]
        return keys, s, factor


def philox4x32_10(counter, key):
    """Philox4x32-10 (Random123's philox4x32_R, R = 10), vectorised: counter a tuple of 4 and key
    of 2 uint64 arrays of 32-bit values; returns the 4 output words. Written here from the
    definition, apart from the library's kernels/common/philox.cuh, and checked against Random123's
    known answers in test_dropout.py."""
    mask = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) for k in key)
    for _ in range(10):
        p0, p1 = c0 * np.uint64(0xD2511F53), c2 * np.uint64(0xCD9E8D57)  # < 2^64: no wrap
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    return c0, c1, c2, c3


def dropout_keep_mask(p, seed, offset, batch, heads, seq_q, seq_k, first_batch=0):
    """The keep flags (1.0 kept, 0.0 dropped) [batch, heads, seq_q, seq_k] of selfattn's dropout
    (selfattn/attention.h, kernels/common/dropout.cuh): key (seed low, high 32 bits), counter
    (j // 4, i, low and high 32 bits of offset + (first_batch + b) * heads + h), word j % 4, kept
    when at or above floor(p * 2^32) for the library's float32 p."""
    threshold = min(int(float(np.float32(p)) * 2.0 ** 32), 2 ** 32 - 1)
    b, h, i, j = np.meshgrid(np.arange(batch), np.arange(heads), np.arange(seq_q), np.arange(seq_k), indexing="ij")
    stream = (np.uint64(offset) + ((b + first_batch) * heads + h).astype(np.uint64)) & np.uint64(2 ** 64 - 1)
    words = philox4x32_10((j.astype(np.uint64) >> np.uint64(2), i.astype(np.uint64), stream & np.uint64(0xFFFFFFFF),
                           stream >> np.uint64(32)),
                          (np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)))
    word = np.choose((j & 3), words)
    return (word >= np.uint64(threshold)).astype(np.float64)


def softmax_with_sink(s, sink):
    """A row's softmax over its scores s with the sink's logit (-inf: none) joining the sum as one
    more key: (p over s, lse), or None for a row with neither a finite score nor a sink."""
    m = max(np.max(s, initial=-np.inf), sink)
    if m == -np.inf:
        return None
    e = np.exp(s - m)
    total = e.sum() + math.exp(sink - m)
    return e / total, m + math.log(total)


def reference(q, k, v, causal=None, scale=None, key_lengths=None, **mods):
    """float64 attention of BHSD arrays: (out [b, h, sq, d], lse [b, h, sq]). mods: window, softcap,
    alibi_slopes, bias, sinks as selfattn.attention takes them (bias [b|1, h|1, sq, sk], sinks [h]:
    a key of value 0 in every row's softmax; a row without keys gives 0 and lse the sink)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    batch, heads, seq_q, dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    rule = Mods((batch, heads, seq_q, seq_k), causal, **mods)
    out = np.zeros((batch, heads, seq_q, v.shape[3]))  # v's head dim may differ from q's and k's
    lse = np.full((batch, heads, seq_q), -np.inf)
    for b in range(batch):
        len_k = seq_k if key_lengths is None else min(max(int(key_lengths[b]), 0), seq_k)
        for h in range(heads):
            kh = h // (heads // kv_heads)
            for i in range(seq_q):
                keys, s, _ = rule.scores(lambda j: scale * (k[b, kh, j] @ q[b, h, i]), b, h, i, len_k)
                row = softmax_with_sink(s, rule.sink(h))
                if row is None:
                    continue  # no key (or the bias masks every one) and no sink
                p, lse[b, h, i] = row
                out[b, h, i] = (p * rule.dropout_factor(b, h, i, keys)) @ v[b, kh, keys]
    return out, lse


def reference_backward(q, k, v, dout, causal=None, scale=None, key_lengths=None, dlse=None, **mods):
    """float64 (dq, dk, dv) of BHSD arrays for the upstream gradients dout and dlse (lse's, None: 0),
    mods as reference(); with sinks also dsinks [h], the gradient of each head's sink logit:
    -sum over its rows of p_sink (D_i - dlse_i), D_i = dout_i . out_i."""
    q, k, v, dout = (np.asarray(a, dtype=np.float64) for a in (q, k, v, dout))
    batch, heads, seq_q, dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    rule = Mods((batch, heads, seq_q, seq_k), causal, **mods)
    dlse = np.zeros((batch, heads, seq_q)) if dlse is None else np.asarray(dlse, dtype=np.float64)
    dq, dk, dv, dsinks = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v), np.zeros(heads)
    for b in range(batch):
        len_k = seq_k if key_lengths is None else min(max(int(key_lengths[b]), 0), seq_k)
        for h in range(heads):
            kh = h // (heads // kv_heads)
            for i in range(seq_q):
                keys, s, factor = rule.scores(lambda j: scale * (k[b, kh, j] @ q[b, h, i]), b, h, i, len_k)
                row = softmax_with_sink(s, rule.sink(h))
                if row is None:
                    continue
                p, lse = row
                dropped = rule.dropout_factor(b, h, i, keys)  # dropout's mask and scale (1 without)
                dp = (v[b, kh, keys] @ dout[b, h, i]) * dropped
                d = p @ dp  # D_i = dout_i . out_i
                dsinks[h] -= math.exp(rule.sink(h) - lse) * (d - dlse[b, h, i])
                ds = p * (dp - d + dlse[b, h, i]) * factor  # through softcap; ALiBi and bias add constants
                dq[b, h, i] = scale * ds @ k[b, kh, keys]
                dk[b, kh, keys] += scale * np.outer(ds, q[b, h, i])
                dv[b, kh, keys] += np.outer(p * dropped, dout[b, h, i])
    return (dq, dk, dv) if rule.sinks is None else (dq, dk, dv, dsinks)


def check_varlen_backward(rng, dtype, lengths_q, lengths_k, heads=4, kv_heads=2, dim=16, causal=None, path="auto",
                grad_dtype=None, spare_rows=0, **mods):
    """attention_varlen_backward on packed sequences (spare_rows rows after the last sequence, in q
    and k alike), each sequence's gradients against the float64 backward of it alone; rows outside
    every sequence must come back 0. With sinks, dsinks (return_dsinks=True) against the sum of the
    sequences' own. Returns (dq, dk, dv), and dsinks with sinks."""
    cu_q, cu_k = np.cumsum([0] + lengths_q), np.cumsum([0] + lengths_k)
    total_q, total_k = cu_q[-1] + spare_rows, cu_k[-1] + spare_rows
    q = random(rng, (total_q, heads, dim), dtype)
    k = random(rng, (total_k, kv_heads, dim), dtype)
    v = random(rng, (total_k, kv_heads, dim), dtype)
    dout = random(rng, (total_q, heads, dim), dtype)
    out, lse = selfattn.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, return_lse=True, **mods)
    with_sinks = "sinks" in mods
    grads = selfattn.attention_varlen_backward(q, k, v, out, dout, lse, cu_q, cu_k, causal=causal, path=path,
                                               grad_dtype=grad_dtype, return_dsinks=with_sinks, **mods)
    dq, dk, dv = grads[:3]
    for got, like in zip((dq, dk, dv), (q, k, v)):
        assert got.shape == like.shape
        assert got.dtype == (np.float32 if grad_dtype == "float32" else like.dtype)
    assert np.all(dq[cu_q[-1]:] == 0) and np.all(dk[cu_k[-1]:] == 0) and np.all(dv[cu_k[-1]:] == 0)

    def bhsd(a):
        return a.transpose(1, 0, 2)[None]

    want_dsinks = np.zeros(heads)
    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        per_sequence = {name: (value[b] if name == "alibi_slopes" and value.ndim == 2 else value)
                        for name, value in mods.items() if name != "bias"}
        if "bias" in mods:
            per_sequence["bias"] = mods["bias"][b:b + 1, :, :lengths_q[b], :lengths_k[b]]
        for name in ("key_start", "q_offset", "key_lengths"):  # one entry per sequence
            if name in mods:
                per_sequence[name] = [mods[name][b]]
        want = reference_backward(bhsd(q[rows]), bhsd(k[keys]), bhsd(v[keys]), bhsd(dout[rows]), causal,
                                  **per_sequence)
        for got, expected in zip((dq[rows], dk[keys], dv[keys]), want):
            assert relative_error(bhsd(got), expected, per_row=False) <= 2 * TOLERANCE[dtype], b
        want_dsinks += want[3] if with_sinks else 0
    if with_sinks:
        assert grads[3].shape == (heads,) and grads[3].dtype == np.float32
        assert relative_error(grads[3], want_dsinks, per_row=False) <= 2 * TOLERANCE[dtype]
    return grads


def slopes(rng, *shape):
    # ALiBi slopes of the usual size (2^-1 .. 2^-8 for 8 heads), float32 as the library takes them.
    return rng.uniform(2 ** -8, 0.5, shape).astype(np.float32)


def bias_with_holes(rng, shape, dtype="float32", masked=0.2):
    """A random bias in which about `masked` of the entries are -inf (keys masked out)."""
    bias = rng.standard_normal(shape)
    bias[rng.random(shape) < masked] = -np.inf
    return bias.astype(numpy_dtype(dtype))


def check(out, lse, want, want_lse, dtype):
    """out against the reference's by relative_error, the LSE to 1e-5, and -inf exactly where the
    reference's is (a row that sees no key and has no sink), with out 0 there."""
    assert relative_error(out, want) <= TOLERANCE[dtype]
    seen = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(lse), seen), "LSE is -inf exactly where a row sees no key"
    assert np.all(lse[~seen] == -np.inf) and np.all(np.asarray(out, dtype=np.float64)[~seen] == 0)
    np.testing.assert_allclose(lse[seen], want_lse[seen], rtol=1e-5, atol=1e-5)


def check_central_differences(loss, inputs, grads, h=1e-2):
    """Each gradient against central differences of loss(*inputs), one input element at a time
    (what torch.autograd.gradcheck does). h = 1e-2 keeps float32 noise (~1e-7 / h) far below the
    O(h^2) truncation error."""
    for which, grad in enumerate(grads):
        x = inputs[which]
        for index in np.ndindex(x.shape):
            saved = x[index]
            x[index] = saved + h
            up = loss(*inputs)
            x[index] = saved - h
            down = loss(*inputs)
            x[index] = saved
            assert abs((up - down) / (2 * h) - grad[index]) <= 2e-3 * (1 + abs(grad[index])), (which, index)

def relative_error(got, want, per_row=True):
    """The worst row's error (rows along the last axis): the norm of its difference over the norm
    of its reference row, or over the typical (root-mean-square) row norm where that is larger, so
    that one wrong row or element cannot hide in a whole-tensor norm, nor a row whose reference
    nearly cancels fail on rounding alone. per_row=False: the whole tensor's norms, for gradients,
    whose rows cancel in ways the C++ judge (tests/support/backward_expected.h) bounds and this
    one does not."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.all(np.isfinite(got)), "NaN or inf in the output"
    if want.size == 0:
        return 0.0
    row_length = want.shape[-1] if want.ndim and per_row else max(want.size, 1)
    got_rows, want_rows = got.reshape(-1, row_length), want.reshape(-1, row_length)
    row_norms = np.linalg.norm(want_rows, axis=1)
    typical = np.linalg.norm(want_rows) / math.sqrt(len(want_rows))
    denominators = np.maximum(row_norms, typical)
    denominators[denominators == 0] = 1.0
    return float(np.max(np.linalg.norm(got_rows - want_rows, axis=1) / denominators))


@pytest.fixture
def rng(request):
    # A seed per test (its name) mixed with SELFATTN_SIM_SEED, as the C++ tests' input_seed: the
    # cases differ from each other, the two seeded registrations of a test see different inputs,
    # and a run reruns identically.
    seed = int(os.environ.get("SELFATTN_SIM_SEED", "0"))
    return np.random.default_rng([zlib.crc32(request.node.name.encode()), seed])


def random(rng, shape, dtype):
    return rng.standard_normal(shape).astype(numpy_dtype(dtype))


def poisoned(shape, dtype):
    """An output array full of NaN: an element the call forgets to write fails the check."""
    return np.full(shape, np.nan, dtype=numpy_dtype(dtype))


@pytest.fixture(autouse=True, scope="session")
def _sim_only():
    # NumPy arrays always run on the sim; make sure nothing here needed a GPU.
    assert "sim" in selfattn.backends()


def pytest_configure(config):
    config.addinivalue_line("markers", "device_check: run by bench/device-check.sh, on CUDA tensors on a lent GPU and "
                                       "on CPU tensors (the sim) in its dry run")
    config.addinivalue_line("markers", "gpu: needs a CUDA device and a build with the cuda backend (skips without)")


def cuda_unusable():
    """Why CUDA tensors cannot run here, or '' when they can."""
    if "cuda" not in selfattn.backends():
        return "no usable GPU (or this build has no cuda backend)"
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    return "" if torch.cuda.is_available() else "PyTorch sees no CUDA device"


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def torch_device(request):
    """The device of a test's torch tensors: the CPU (the sim) everywhere, CUDA where there is a GPU."""
    if request.param == "cuda" and cuda_unusable():
        pytest.skip(cuda_unusable())
    return request.param


# The torch test files' helpers; torch is imported inside them, so the NumPy tests run without it.
def tensors(shape, dtype=None, seed=0, device="cpu"):
    """Three random torch tensors of one shape (q, k, v), float32 unless dtype says otherwise."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(torch.float32 if dtype is None else dtype).to(device) for _ in range(3)]


def host(t):
    """A tensor's values as a NumPy array, from any device."""
    return t.detach().cpu().numpy()


def same_values(got, want):
    """Two runs of the library on the same values: bit for bit on the sim; on a GPU the backward adds
    dQ's partial sums with atomics in an order that varies from run to run, so to rounding there."""
    import torch
    if got.device.type == "cpu":
        return torch.equal(got, want)
    return relative_error(host(got), host(want), per_row=False) <= 1e-6
