"""Shared pieces of the Python tests: a float64 NumPy reference of attention written here (not the
library's), fresh random inputs, and the tolerances per dtype."""
import math
import zlib

import numpy as np
import pytest

import selfattn

try:
    import ml_dtypes
except ImportError:  # bf16 tests skip without it
    ml_dtypes = None

# Relative error (Frobenius norm of the difference over that of the reference), per input dtype.
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


def reference(q, k, v, causal=None, scale=None, key_lengths=None):
    """float64 attention of BHSD arrays: (out [b, h, sq, d], lse [b, h, sq])."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    batch, heads, seq_q, dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    out = np.zeros((batch, heads, seq_q, dim))
    lse = np.full((batch, heads, seq_q), -np.inf)
    for b in range(batch):
        len_k = seq_k if key_lengths is None else min(max(int(key_lengths[b]), 0), seq_k)
        for h in range(heads):
            kh = h // (heads // kv_heads)
            for i in range(seq_q):
                n = visible(i, seq_q, len_k, causal)
                if n == 0:
                    continue
                s = scale * (k[b, kh, :n] @ q[b, h, i])
                m = s.max()
                p = np.exp(s - m)
                out[b, h, i] = (p @ v[b, kh, :n]) / p.sum()
                lse[b, h, i] = m + math.log(p.sum())
    return out, lse


def relative_error(got, want):
    got = np.asarray(got, dtype=np.float64)
    assert np.all(np.isfinite(got)), "NaN or inf in the output"
    norm = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (norm if norm > 0 else 1.0)


@pytest.fixture
def rng(request):
    # A fresh seed per test (its name), so the cases differ from each other but rerun identically.
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def random(rng, shape, dtype):
    return rng.standard_normal(shape).astype(numpy_dtype(dtype))


def poisoned(shape, dtype):
    """An output array full of NaN: an element the call forgets to write fails the check."""
    return np.full(shape, np.nan, dtype=numpy_dtype(dtype))


@pytest.fixture(autouse=True, scope="session")
def _sim_only():
    # NumPy arrays always run on the sim; make sure nothing here needed a GPU.
    assert "sim" in selfattn.backends()
