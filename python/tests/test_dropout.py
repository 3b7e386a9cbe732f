"""Attention dropout (dropout_p=, dropout_seed=, dropout_offset=, generator=): on NumPy arrays (the sim)
attention, attention_varlen and their backward on every path against the float64 reference in
conftest.py fed the mask of conftest's own Philox4x32-10 (written apart from the library's and
checked against Random123's known answers here); the seed and offset's determinism; the arguments
refused. On torch tensors: the seed drawn from a torch.Generator (or torch's default one, so
torch.manual_seed reproduces a call), two calls two masks, loss.backward() regenerating the
forward's mask (against attention_backward with the same seed and the float64 reference), through
attention_varlen too, and torch.compile."""
import numpy as np
import pytest

import selfattn
from conftest import (TOLERANCE, check, dropout_keep_mask, philox4x32_10, poisoned, random, reference,
                      reference_backward, relative_error)

# Random123 1.14 examples/kat_vectors, philox4x32 10: (counter, key, result).
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


def test_reference_philox_known_answers():
    for counter, key, result in KNOWN_ANSWERS:
        got = philox4x32_10(tuple(np.uint64(c) for c in counter), tuple(np.uint64(x) for x in key))
        assert tuple(int(w) for w in got) == result


def qkv(rng, dtype, batch, heads, kv_heads, seq_q, seq_k, dim):
    return (random(rng, (batch, heads, seq_q, dim), dtype), random(rng, (batch, kv_heads, seq_k, dim), dtype),
            random(rng, (batch, kv_heads, seq_k, dim), dtype))


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_forward_every_path_and_dtype(rng, path, dtype):
    # GQA, bottom-right causal, key lengths (batch 1 sees 20 keys, its first rows none), p = 0.3.
    batch, heads, seq_q, seq_k, p, seed, offset = 2, 4, 37, 53, 0.3, 1234, 5
    q, k, v = qkv(rng, dtype, batch, heads, 2, seq_q, seq_k, 32 if dtype != "float32" else 7)
    keep = dropout_keep_mask(p, seed, offset, batch, heads, seq_q, seq_k)
    out = poisoned(q.shape, dtype)
    _, lse = selfattn.attention(q, k, v, causal="bottom_right", key_lengths=[seq_k, 20], path=path, out=out,
                                return_lse=True, dropout_p=p, dropout_seed=seed, dropout_offset=offset)
    check(out, lse, *reference(q, k, v, "bottom_right", key_lengths=[seq_k, 20], dropout=(p, keep)), dtype)
    # The mask matters: without it the reference is far off.
    assert relative_error(out, reference(q, k, v, "bottom_right", key_lengths=[seq_k, 20])[0]) > 0.1


@pytest.mark.parametrize("path", ["naive", "cublas", "fused"])
def test_backward_every_path(rng, path):
    # The backward with the forward's seed and offset regenerates its mask: dq, dk, dv against the
    # float64 gradients of the dropped weights; with sinks, dsinks keeps its formula.
    dtype = "float16" if path == "fused" else "float32"
    batch, heads, seq_q, seq_k, p, seed = 2, 2, 29, 41, 0.25, 77
    q, k, v = qkv(rng, dtype, batch, heads, 1, seq_q, seq_k, 32)
    sinks = np.array([0.5, 1.5], dtype=np.float32)
    options = dict(causal="top_left", path=path, window=(20, 3), sinks=sinks, dropout_p=p, dropout_seed=seed)
    out, lse = selfattn.attention(q, k, v, return_lse=True, **options)
    dout = random(rng, q.shape, dtype)
    grads = selfattn.attention_backward(q, k, v, out, dout, lse, grad_dtype="float32", return_dsinks=True, **options)
    keep = dropout_keep_mask(p, seed, 0, batch, heads, seq_q, seq_k)
    want = reference_backward(q, k, v, dout, "top_left", window=(20, 3), sinks=sinks, dropout=(p, keep))
    for got, expected in zip(grads, want):
        assert relative_error(got, expected, per_row=False) <= 4 * TOLERANCE[dtype]
    without = reference_backward(q, k, v, dout, "top_left", window=(20, 3), sinks=sinks)
    assert relative_error(grads[2], without[2], per_row=False) > 0.1  # dv sees the mask


@pytest.mark.parametrize("path", ["naive", "fused"])
def test_varlen_forward_and_backward(rng, path):
    # The mask's batch is the sequence, rows and keys counted within it.
    dtype = "float16" if path == "fused" else "float32"
    lengths_q, lengths_k, heads, dim, p, seed = [7, 0, 12], [9, 4, 12], 2, 32, 0.4, 5
    cu_q, cu_k = np.cumsum([0] + lengths_q).astype(np.int32), np.cumsum([0] + lengths_k).astype(np.int32)
    q = random(rng, (cu_q[-1], heads, dim), dtype)
    k, v = random(rng, (cu_k[-1], heads, dim), dtype), random(rng, (cu_k[-1], heads, dim), dtype)
    options = dict(causal="bottom_right", path=path, dropout_p=p, dropout_seed=seed)
    out, lse = selfattn.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **options)
    dout = random(rng, q.shape, dtype)
    dq, dk, dv = selfattn.attention_varlen_backward(q, k, v, out, dout, lse, cu_q, cu_k, grad_dtype="float32",
                                                    **options)
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        if lq == 0:
            continue
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        one = [np.swapaxes(a[r], 0, 1)[None] for a, r in ((q, rows), (k, keys), (v, keys), (dout, rows))]
        keep = dropout_keep_mask(p, seed, 0, 1, heads, lq, lk, first_batch=b)
        want_out, _ = reference(*one[:3], "bottom_right", dropout=(p, keep))
        assert relative_error(np.swapaxes(out[rows], 0, 1)[None], want_out) <= TOLERANCE[dtype]
        want = reference_backward(*one, "bottom_right", dropout=(p, keep))
        for got, r, expected in ((dq, rows, want[0]), (dk, keys, want[1]), (dv, keys, want[2])):
            assert relative_error(np.swapaxes(got[r], 0, 1)[None], expected, per_row=False) <= 4 * TOLERANCE[dtype]


def test_seed_and_offset_decide_the_mask(rng):
    q, k, v = qkv(rng, "float32", 1, 2, 2, 16, 24, 8)
    run = lambda **o: selfattn.attention(q, k, v, path="fused", **o)  # noqa: E731
    first = run(dropout_p=0.5, dropout_seed=3)
    assert np.array_equal(first, run(dropout_p=0.5, dropout_seed=3))
    assert not np.array_equal(first, run(dropout_p=0.5, dropout_seed=4))
    assert not np.array_equal(first, run(dropout_p=0.5, dropout_seed=3, dropout_offset=1))
    assert np.array_equal(run(), run(dropout_p=0.0, dropout_seed=9))  # p = 0: no dropout, the seed unused
    assert np.array_equal(run(dropout_p=0.5, dropout_seed=2 ** 64 - 1), run(dropout_p=0.5, dropout_seed=2 ** 64 - 1))


def test_arguments_refused(rng):
    q, k, v = qkv(rng, "float32", 1, 1, 1, 4, 4, 8)
    for bad in (1.0, -0.1, float("nan"), "0.1", True):
        with pytest.raises(selfattn.InvalidArgument, match="dropout_p"):
            selfattn.attention(q, k, v, dropout_p=bad, dropout_seed=1)
    with pytest.raises(selfattn.InvalidArgument, match="dropout_seed"):
        selfattn.attention(q, k, v, dropout_p=0.1)  # NumPy arrays: no generator to draw it from
    for bad in (-1, 2 ** 64, 1.5):
        with pytest.raises(selfattn.InvalidArgument, match="dropout_seed"):
            selfattn.attention(q, k, v, dropout_p=0.1, dropout_seed=bad)
    out, lse = selfattn.attention(q, k, v, return_lse=True, dropout_p=0.1, dropout_seed=1)
    with pytest.raises(selfattn.InvalidArgument, match="the forward's seed"):
        selfattn.attention_backward(q, k, v, out, out, lse, dropout_p=0.1)


# ---- torch tensors ----

def _torch():
    return pytest.importorskip("torch")


def test_torch_generator_and_default_generator():
    torch = _torch()
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 12, 16, generator=g) for _ in range(3))
    with_generator = lambda seed: selfattn.attention(  # noqa: E731
        q, k, v, dropout_p=0.3, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(with_generator(1), with_generator(1))
    assert not torch.equal(with_generator(1), with_generator(2))
    shared = torch.Generator().manual_seed(1)
    first, second = (selfattn.attention(q, k, v, dropout_p=0.3, generator=shared) for _ in range(2))
    assert not torch.equal(first, second)  # the generator advanced
    assert torch.equal(first, with_generator(1))
    torch.manual_seed(11)
    a = selfattn.attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(11)
    assert torch.equal(a, selfattn.attention(q, k, v, dropout_p=0.3))  # the default generator, reproducible
    assert torch.equal(selfattn.attention(q, k, v), selfattn.attention(q, k, v, dropout_p=0.0))


def test_torch_autograd_regenerates_the_mask():
    # loss.backward() through the op: the backward op gets the forward's seed and offset, so the
    # gradients are attention_backward's with that seed, and close to the float64 reference with
    # the mask; sinks still train. The seed here is given, so the reference can rebuild the mask.
    torch = _torch()
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, 10, 8, generator=g).requires_grad_()
    k, v = (torch.randn(2, 2, 13, 8, generator=g).requires_grad_() for _ in range(2))
    sinks = torch.tensor([0.5, -float("inf"), 1.0, 2.0], requires_grad=True)
    options = dict(causal="bottom_right", dropout_p=0.35, dropout_seed=2 ** 63 + 5, dropout_offset=3)
    out = selfattn.attention(q, k, v, sinks=sinks, **options)
    dout = torch.randn(out.shape, generator=g)
    (out * dout).sum().backward()
    detached = [t.detach() for t in (q, k, v)]
    out2, lse = selfattn.attention(*detached, sinks=sinks.detach(), return_lse=True, **options)
    assert torch.equal(out.detach(), out2)
    library = selfattn.attention_backward(*detached, out2, dout, lse, sinks=sinks.detach(), return_dsinks=True,
                                          **options)
    for tensor, same in zip((q, k, v, sinks), library):
        assert torch.equal(tensor.grad, same)
    keep = dropout_keep_mask(0.35, 2 ** 63 + 5, 3, 2, 4, 10, 13)
    want = reference_backward(*(t.numpy() for t in detached), dout.numpy(), "bottom_right",
                              sinks=sinks.detach().numpy(), dropout=(0.35, keep))
    for tensor, expected in zip((q, k, v, sinks), want):
        assert relative_error(tensor.grad.numpy(), expected, per_row=False) <= 2 * TOLERANCE["float32"]


def test_torch_autograd_with_a_drawn_seed_and_varlen():
    # A drawn seed: the backward's mask is the forward's whatever the seed (gradients of a loss
    # whose dropped weights are known: with v = 1 every out element is the row's kept share, so dv
    # sums dout over the rows that kept each key). Through attention_varlen, sequence by sequence.
    torch = _torch()
    g = torch.Generator().manual_seed(3)
    q = torch.zeros(9, 2, 8, requires_grad=True)  # uniform rows: every kept key weighs 1 / (n (1 - p))
    k = torch.randn(11, 2, 8, generator=g)
    v = torch.ones(11, 2, 8, requires_grad=True)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 5, 11], dtype=torch.int32)
    out = selfattn.attention_varlen(q, k, v, cu_q, cu_k, dropout_p=0.5, generator=torch.Generator().manual_seed(8))
    out.sum().backward()
    for b in range(2):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        n = keys.stop - keys.start
        kept = out.detach()[rows, :, 0] * n * 0.5  # [rows, heads]: the kept keys of each row
        # dv[j] = sum over the rows that kept j of 1 / (n (1 - p)) * dout (= 1), per head and column:
        # summed over keys that is the sum over rows of kept / (n (1 - p)).
        total = v.grad[keys, :, 0].sum(0)
        assert torch.allclose(total, kept.sum(0) / (n * 0.5), rtol=1e-5)


def test_torch_compile():
    torch = _torch()
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    compiled = torch.compile(lambda a, b, c: selfattn.attention(a, b, c, dropout_p=0.2, dropout_seed=4),
                             fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k, v), selfattn.attention(q, k, v, dropout_p=0.2, dropout_seed=4))
