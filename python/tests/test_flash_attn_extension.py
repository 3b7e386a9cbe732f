"""FlashAttention's lower layer over selfattn (_flash_attn_extension.py, re-exported by the
flash_attn module): the private forwards and backwards ring attention calls and the compiled
extension's four entry points, judged against flash_attn_support's float64 reference (the
gradients through its autograd), on CPU tensors (the sim). Skipped without PyTorch."""
import math

import pytest

torch = pytest.importorskip("torch")

from flash_attn_support import assert_close, assert_lse, qkv, reference  # noqa: E402
from selfattn.integrations import flash_attn as fa  # noqa: E402
from selfattn.integrations.flash_attn import FlashAttnArgumentError, FlashAttnNotSupported  # noqa: E402


def poisoned_like(x):
    return torch.full_like(x, float("nan"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("seq_q,seq_k,causal,window", [(7, 13, False, (-1, -1)), (13, 7, True, (-1, -1)),
                                                      (1, 113, False, (5, 2)), (16, 16, True, (3, -1))])
def test_forward_then_backward_by_hand(dtype, seq_q, seq_k, causal, window):
    q, k, v = qkv(11 + seq_q, 2, seq_q, seq_k, dtype=dtype)
    out, lse, dmask, rng_state = fa._flash_attn_forward(q, k, v, 0.0, None, causal, *window, 0.0, None, False)
    want_q, want_k, want_v = (x.double().requires_grad_() for x in (q, k, v))
    want, want_lse = reference(want_q, want_k, want_v, causal=causal, window_size=window)
    assert_close(out, want, dtype)
    assert_lse(lse, want_lse.detach())
    assert dmask is None and rng_state.dtype == torch.int64 and rng_state.shape == (2,)

    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out.dtype)
    dq, dk, dv = poisoned_like(q), poisoned_like(k), poisoned_like(v)
    softmax_d = fa._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, 1 / math.sqrt(q.shape[-1]),
                                        causal, *window, 0.0, None, False, rng_state)
    grads = torch.autograd.grad(want, (want_q, want_k, want_v), dout.double())
    for got, expected in zip((dq, dk, dv), grads):  # written into the tensors passed
        assert_close(got, expected, dtype, per_row=False)
    assert softmax_d.shape == (2, q.shape[2], seq_q) and softmax_d.dtype == torch.float32
    d = (dout.double() * out.double()).sum(-1).transpose(1, 2)
    torch.testing.assert_close(softmax_d.double(), d, rtol=1e-5, atol=1e-5)


def test_rng_state_replays_the_forwards_dropout():
    """The backward given the forward's rng_state draws the forward's mask: its gradients are, bit
    for bit, those autograd takes through flash_attn_func drawing the same seed; another
    rng_state gives others."""
    q, k, v = qkv(3, 2, 9, 21)
    torch.manual_seed(1234)
    out, lse, dmask, rng_state = fa._flash_attn_forward(q, k, v, 0.3, None, True, -1, -1, 0.0, None, True)
    assert dmask.shape == (2, 4, 9, 21) and (dmask < 0).any()  # dropped entries negated
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(8))
    grads = [torch.empty_like(x) for x in (q, k, v)]
    fa._flash_attn_backward(dout, q, k, v, out, lse, *grads, 0.3, None, True, -1, -1, 0.0, None, True, rng_state)

    torch.manual_seed(1234)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want_out, want_lse, _ = fa.flash_attn_func(*leaves, dropout_p=0.3, causal=True, deterministic=True,
                                               return_attn_probs=True)
    assert torch.equal(out, want_out.detach()) and torch.equal(lse, want_lse)
    for got, want in zip(grads, torch.autograd.grad(want_out, leaves, dout)):
        assert torch.equal(got, want)

    other = rng_state.clone()
    other[0] += 1
    moved = [torch.empty_like(x) for x in (q, k, v)]
    fa._flash_attn_backward(dout, q, k, v, out, lse, *moved, 0.3, None, True, -1, -1, 0.0, None, True, other)
    assert not torch.equal(moved[2], grads[2])


def packed(seed, lengths_q, lengths_k, heads=4, kv_heads=2, dim=32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), heads, dim, generator=g)
    k, v = (torch.randn(sum(lengths_k), kv_heads, dim, generator=g) for _ in range(2))
    cu = [torch.tensor([0] + list(torch.tensor(n).cumsum(0)), dtype=torch.int32) for n in (lengths_q, lengths_k)]
    return q, k, v, cu[0], cu[1]


def test_varlen_forward_then_backward_by_hand():
    lengths_q, lengths_k = [1, 7, 0, 13], [5, 7, 3, 20]
    q, k, v, cu_q, cu_k = packed(21, lengths_q, lengths_k)
    out, lse, _, rng_state = fa._flash_attn_varlen_forward(q, k, v, cu_q, cu_k, 13, 20, 0.0, None, True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    dq, dk, dv = poisoned_like(q), poisoned_like(k), poisoned_like(v)
    softmax_d = fa._flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, 13, 20, 0.0,
                                               None, True, -1, -1, 0.0, None, False, rng_state)
    assert softmax_d.shape == (4, q.shape[0])
    for b in range(len(lengths_q)):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        leaves = [x[None, s].double().requires_grad_() for x, s in ((q, rows), (k, keys), (v, keys))]
        want, want_lse = reference(*leaves, causal=True)
        assert_close(out[rows][None], want, "float32")
        assert_lse(lse[:, rows][None], want_lse.detach())
        if lengths_q[b]:
            grads = torch.autograd.grad(want, leaves, dout[None, rows].double())
            for got, s, expected in zip((dq, dk, dv), (rows, keys, keys), grads):
                assert_close(got[None, s], expected, "float32", per_row=False)


def test_paged_varlen_forward_with_seqused_k():
    """FlashAttention's paged varlen call through _flash_attn_varlen_forward: the keys of sequence b
    are its first seqused_k[b] cache tokens, in the pages block_table lists (any order)."""
    page, pages_per_sequence, batch = 16, 3, 2
    g = torch.Generator().manual_seed(4)
    k_pool, v_pool = (torch.randn(batch * pages_per_sequence, page, 2, 32, generator=g) for _ in range(2))
    block_table = torch.randperm(batch * pages_per_sequence, generator=g).to(torch.int32).reshape(batch, -1)
    seqused_k = torch.tensor([37, 1], dtype=torch.int32)
    q = torch.randn(3, 4, 32, generator=g)
    cu_q = torch.tensor([0, 2, 3], dtype=torch.int32)
    cu_k = torch.tensor([0, 37, 38], dtype=torch.int32)
    results = [fa._flash_attn_varlen_forward(q, k_pool, v_pool, cu_q, cu_k, 2, 48, 0.0, None, True,
                                             block_table=block_table, seqused_k=seqused_k, num_splits=splits)
               for splits in (0, 1, 3)]
    for b in range(batch):
        keys = [x[block_table[b].long()].reshape(-1, 2, 32)[:int(seqused_k[b])][None] for x in (k_pool, v_pool)]
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        want, want_lse = reference(q[None, rows], *keys, causal=True)
        for out, lse, _, _ in results:
            assert_close(out[rows][None], want, "float32")
            assert_lse(lse[:, rows][None], want_lse.detach())


def test_keys_split_in_two_and_merged_by_lse_as_ring_attention_does():
    q, k, v = qkv(31, 1, 8, 40)
    first = fa._flash_attn_forward(q, k[:, :17], v[:, :17], 0.0, None, False)
    second = fa._flash_attn_forward(q, k[:, 17:], v[:, 17:], 0.0, None, False)
    lse = torch.logaddexp(first[1], second[1])
    out = sum(part[0] * torch.exp(part[1] - lse).transpose(1, 2)[..., None] for part in (first, second))
    want, want_lse = reference(q, k, v)
    assert_close(out, want, "float32")
    assert_lse(lse, want_lse.detach())


def test_refusals_name_the_argument():
    q, k, v = qkv(1, 1, 1, 1, heads=2, kv_heads=1, dim=8, dtype="bfloat16")
    lse = torch.zeros(1, 2, 1)
    flat = [x.view(1, x.shape[2], 8) for x in (q, k, v)]
    cu = torch.tensor([0, 1], dtype=torch.int32)
    generator = torch.empty(1)
    calls = [lambda: fa.flash_attn_gpu.fwd(q, k, v, None, None, 0.0, 1.0, True, -1, -1, 0.0, False, generator),
             lambda: fa.flash_attn_gpu.bwd(q, q, k, v, q, lse, None, None, None, None, 0.0, 1.0, True, -1, -1, 0.0,
                                           False, generator, None),
             lambda: fa.flash_attn_gpu.varlen_fwd(*flat, None, cu, cu, None, None, None, None, 1, 1, 0.0, 1.0, False,
                                                  True, -1, -1, 0.0, False, generator, 0),
             lambda: fa.flash_attn_gpu.varlen_bwd(flat[0], *flat, flat[0], lse[0], None, None, None, cu, cu, None, 1,
                                                  1, 0.0, 1.0, False, True, -1, -1, 0.0, False, generator, None)]
    for call in calls:
        with pytest.raises(FlashAttnArgumentError, match="generator` argument is no longer supported"):
            call()
    with pytest.raises(FlashAttnNotSupported, match="leftpad_k"):
        fa._flash_attn_varlen_forward(*flat, cu, cu, 1, 1, 0.0, None, False, leftpad_k=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(FlashAttnArgumentError, match="return_softmax"):
        fa._flash_attn_forward(q, k, v, 0.0, None, False, return_softmax=True)
    with pytest.raises(FlashAttnArgumentError, match="rng_state"):
        fa._flash_attn_backward(q, q, k, v, q, lse, None, None, None, 0.5, None, False, -1, -1, 0.0, None, False)
