"""key_start (left padding) and q_offset (query rows placed among the keys) on selfattn.attention,
attention_varlen, attention_backward and attention_with_kv_cache, NumPy arrays on the sim, against
the float64 reference in conftest.py (visible_range states the rule); then through the torch ops
with autograd. The padding before key_start holds NaN, so a call that reads it fails."""
import numpy as np
import pytest

import selfattn
from conftest import (TOLERANCE, check, check_varlen_backward, random, reference, reference_backward,
                      relative_error, slopes)


def left_padded(rng, shape, dtype, key_start):
    """K or V [batch, kv_heads, seq_k, dim] with NaN in batch b's rows before key_start[b]."""
    x = random(rng, shape, dtype)
    for b, start in enumerate(key_start):
        x[b, :, :max(start, 0)] = np.nan
    return x


def finite(x):
    return np.nan_to_num(np.asarray(x, dtype=np.float64))


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_left_padding_and_query_offsets(rng, path, dtype, causal):
    batch, heads, kv_heads, seq_q, seq_k, dim = 3, 4, 2, 7, 70, 32
    key_start, q_offset = [20, 0, 69], [5, 40, 0]
    q = random(rng, (batch, heads, seq_q, dim), dtype)
    k = left_padded(rng, (batch, kv_heads, seq_k, dim), dtype, key_start)
    v = left_padded(rng, (batch, kv_heads, seq_k, dim), dtype, key_start)
    mods = dict(window=(9, 2), alibi_slopes=slopes(rng, heads))
    for offsets in (dict(key_start=key_start), dict(q_offset=q_offset), dict(key_start=key_start, q_offset=q_offset)):
        # Without key_start every key is real: the padding's NaN becomes values.
        keys = (k, v) if "key_start" in offsets else (random(rng, k.shape, dtype), random(rng, v.shape, dtype))
        out, lse = selfattn.attention(q, *keys, causal=causal, path=path, return_lse=True, key_lengths=[70, 55, 70],
                                      **offsets, **mods)
        check(out, lse, *reference(q, *map(finite, keys), causal, None, [70, 55, 70], **offsets, **mods), dtype)


def test_static_cache_rows_placed_by_q_offset(rng):
    # Every slot handed over (no key lengths): row i of batch b sees keys <= q_offset[b] + i.
    q = random(rng, (2, 2, 3, 16), "float32")
    k, v = (random(rng, (2, 2, 40, 16), "float32") for _ in range(2))
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", q_offset=[10, 36], return_lse=True)
    check(out, lse, *reference(q, k, v, "bottom_right", q_offset=[10, 36]), "float32")
    want, _ = reference(q[:1], k[:1, :, :13], v[:1, :, :13], "bottom_right")  # the same as the cache cut at 13
    assert relative_error(out[:1], want) <= TOLERANCE["float32"]


def test_varlen_forward_and_backward(rng):
    # key_lengths: the keys each sequence uses of its own (FlashAttention's seqused_k).
    check_varlen_backward(rng, "float32", [5, 1, 4], [12, 7, 10], causal="bottom_right", path="naive",
                          key_lengths=[9, 7, 0])
    check_varlen_backward(rng, "float16", [5, 1, 4], [12, 7, 10], dim=32, causal="top_left", path="fused",
                          key_lengths=[12, 3, 6], key_start=[2, 0, 0])
    mods = dict(key_start=[3, 0, 9], q_offset=[4, 1, 0], window=(6, -1))
    check_varlen_backward(rng, "float16", [5, 1, 4], [12, 7, 10], dim=32, causal="top_left", path="fused", **mods)
    check_varlen_backward(rng, "float32", [5, 1, 4], [12, 7, 10], causal="bottom_right", path="naive", **mods)
    check_varlen_backward(rng, "bfloat16", [5, 1, 4], [12, 7, 10], causal="bottom_right", path="cublas",
                          grad_dtype="float32", **mods)


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
def test_backward_against_the_reference(rng, path):
    batch, heads, seq_q, seq_k, dim = 2, 2, 6, 33, 32
    key_start, q_offset = [10, 1], [3, 25]
    q = random(rng, (batch, heads, seq_q, dim), "float16")
    k = left_padded(rng, (batch, heads, seq_k, dim), "float16", key_start)
    v = left_padded(rng, (batch, heads, seq_k, dim), "float16", key_start)
    dout = random(rng, (batch, heads, seq_q, dim), "float16")
    mods = dict(key_start=key_start, q_offset=q_offset, alibi_slopes=slopes(rng, heads))
    out, lse = selfattn.attention(q, k, v, causal="bottom_right", path=path, return_lse=True, **mods)
    dq, dk, dv = selfattn.attention_backward(q, k, v, out, dout, lse, causal="bottom_right", path=path,
                                             grad_dtype="float32", **mods)
    want = reference_backward(q, finite(k), finite(v), dout, "bottom_right", **mods)
    for got, expected in zip((dq, dk, dv), want):
        assert np.isfinite(got).all()
        assert relative_error(got, expected, per_row=False) <= 2 * TOLERANCE["float16"]
    for b, start in enumerate(key_start):
        assert not dk[b, :, :start].any() and not dv[b, :, :start].any()  # padding gets exactly 0


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
def test_kv_cache_left_padding(rng, path):
    batch, heads, kv_heads, capacity, dim, seq_q = 2, 4, 2, 50, 16, 3
    lengths, key_start, q_offset = np.array([40, 17], np.int32), [12, 16], [20, 0]
    k_cache = left_padded(rng, (batch, kv_heads, capacity, dim), "float32", key_start)
    v_cache = left_padded(rng, (batch, kv_heads, capacity, dim), "float32", key_start)
    q = random(rng, (batch, heads, seq_q, dim), "float32")
    for offsets in (dict(key_start=key_start), dict(key_start=key_start, q_offset=q_offset)):
        out, lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, path=path, return_lse=True,
                                                    num_splits=3 if path == "fused" else 0, **offsets)
        want = reference(q, finite(k_cache), finite(v_cache), "bottom_right", key_lengths=lengths, **offsets)
        check(out, lse, *want, "float32")


def test_wrong_shapes_name_the_argument(rng):
    q = random(rng, (2, 1, 3, 8), "float32")
    for name in ("key_start", "q_offset"):
        with pytest.raises(selfattn.InvalidArgument, match=name):
            selfattn.attention(q, q, q, **{name: [1, 2, 3]})
        with pytest.raises(selfattn.InvalidArgument, match=name):
            selfattn.attention(q, q, q, **{name: np.zeros(2, np.float32)})


def test_torch_ops_carry_them_with_autograd():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 4, 16, generator=g, dtype=torch.float32) for _ in range(3))
    for x in (q, k, v):
        x.requires_grad_(True)
    key_start = torch.tensor([2, 0], dtype=torch.int32)
    q_offset = torch.tensor([1, 0], dtype=torch.int32)
    out = selfattn.attention(q, k, v, causal="bottom_right", key_start=key_start, q_offset=q_offset)
    dout = torch.randn(out.shape, generator=g)
    out.backward(dout)
    arrays = [x.detach().numpy() for x in (q, k, v)]
    want_out, _ = reference(*arrays, "bottom_right", key_start=[2, 0], q_offset=[1, 0])
    assert relative_error(out.detach().numpy(), want_out) <= TOLERANCE["float32"]
    want = reference_backward(*arrays, dout.numpy(), "bottom_right", key_start=[2, 0], q_offset=[1, 0])
    for x, expected in zip((q, k, v), want):
        assert relative_error(x.grad.numpy(), expected, per_row=False) <= 2 * TOLERANCE["float32"]
    compiled = torch.compile(lambda a, b, c: selfattn.attention(a, b, c, key_start=key_start, q_offset=q_offset),
                             backend="eager", fullgraph=True)
    assert torch.equal(compiled(q, k, v), selfattn.attention(q, k, v, key_start=key_start, q_offset=q_offset))
