"""What FlashAttention's own tests (tests/test_flash_attn.py, run against the module by
scripts/flash_attn_upstream_tests.py) need of selfattn.integrations.flash_attn beyond its
argument mapping (test_flash_attn_module.py): window_size as a tensor or array, return_attn_probs
with the LSE and S_dmask in FlashAttention's encoding (the probabilities and the dropout mask
recovered as its tests recover them), the packed forms, forward-only calls whose inputs require
grad, and the paged capacity error naming block_table. On CPU tensors (the sim), judged against
float64 formulas written here. Skipped without PyTorch."""
import math

import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, relative_error

torch = pytest.importorskip("torch")

from selfattn.integrations import flash_attn as fa  # noqa: E402  (needs torch)
from selfattn.integrations.flash_attn import FlashAttnArgumentError, FlashAttnNotSupported  # noqa: E402


def inputs(seed, batch=2, seq_q=9, seq_k=21, heads=4, kv_heads=2, dim=16, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq_q, heads, dim, generator=g)
    k, v = (torch.randn(batch, seq_k, kv_heads, dim, generator=g) for _ in range(2))
    return [x.requires_grad_() for x in (q, k, v)] if grad else [q, k, v]


def scores_and_visible(q, k, causal, window):
    """float64 scores [b, h, sq, sk] (1/sqrt(d) scaled) and which keys each row sees, FlashAttention's
    masks aligned bottom-right."""
    q, k = q.double(), k.double()
    heads = q.shape[2]
    k = k.repeat_interleave(heads // k.shape[2], dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    seq_q, seq_k = q.shape[1], k.shape[1]
    aligned = torch.arange(seq_q)[:, None] + seq_k - seq_q
    cols = torch.arange(seq_k)[None, :]
    left, right = window
    right = 0 if causal else right
    see = torch.ones(seq_q, seq_k, dtype=torch.bool)
    if left >= 0:
        see &= cols >= aligned - left
    if right >= 0:
        see &= cols <= aligned + right
    return s, see


def probabilities(q, k, causal=False, window=(-1, -1)):
    """float64 (probs [b, h, sq, sk], lse [b, h, sq] with +inf for a row without keys, row max)."""
    s, see = scores_and_visible(q, k, causal, window)
    s = s.masked_fill(~see, -math.inf)
    lse = torch.logsumexp(s, -1)
    empty = ~see.any(-1)
    p = torch.exp(s - lse[..., None]).masked_fill(empty[:, None], 0.0)
    return p, lse.masked_fill(empty.expand_as(lse), math.inf), s.amax(-1)


def assert_close(got, want, dtype="float32"):
    assert relative_error(got.detach().double().numpy(), want.detach().numpy()) <= TOLERANCE[dtype]


# --- window_size: any two integers ---

@pytest.mark.parametrize("window_size", [torch.tensor([3, 1]), np.array([3, 1]), [3, 1], (np.int32(3), 1),
                                         (torch.tensor(3), torch.tensor(1)), torch.tensor([3, 1], dtype=torch.int32)],
                         ids=["tensor", "numpy", "list", "numpy-int", "0-d tensors", "int32 tensor"])
def test_window_size_as_tensor_or_array(window_size):
    q, k, v = inputs(1)
    assert torch.equal(fa.flash_attn_func(q, k, v, window_size=window_size), fa.flash_attn_func(q, k, v,
                                                                                                window_size=(3, 1)))


@pytest.mark.parametrize("window_size", [torch.tensor([3.0, 1.0]), np.array([3, 1, 2]), (True, 1), (3.5, 1), "31",
                                         torch.tensor([[3, 1]]), (-2, 0), (3, None)])
def test_window_size_refused_by_name(window_size):
    q, k, v = inputs(2)
    with pytest.raises(FlashAttnArgumentError, match="window_size expected two integers"):
        fa.flash_attn_func(q, k, v, window_size=window_size)


# --- return_attn_probs: (out, softmax_lse, S_dmask) ---

def recovered(s_dmask, q, k, causal, window):
    """The probabilities and keep mask as FlashAttention's tests recover them from S_dmask: its
    entries times exp(m - lse) over the key block (the module's _get_block_size_n(): one block a
    row, m the row's largest score), the mask from the signs."""
    _, lse, row_max = probabilities(q, k, causal, window)
    block = fa._get_block_size_n(q.device, q.shape[-1], True, causal)
    assert block >= k.shape[1]
    scale = torch.exp(row_max - lse).masked_fill(torch.isinf(lse), 0.0)
    return s_dmask.abs().double() * scale[..., None], s_dmask >= 0


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (6, 2))])
def test_return_attn_probs_with_dropout(causal, window):
    q, k, v = inputs(3)
    p_drop = 0.25
    torch.manual_seed(7)
    out, lse, s_dmask = fa.flash_attn_func(q, k, v, p_drop, causal=causal, window_size=window, return_attn_probs=True)
    want_p, want_lse, _ = probabilities(q, k, causal, window)
    assert s_dmask.shape == (2, 4, 9, 21) and s_dmask.dtype == torch.float32
    attn, keep = recovered(s_dmask, q, k, causal, window)
    np.testing.assert_allclose(attn.numpy(), want_p.numpy(), rtol=1e-4, atol=1e-7)
    assert torch.equal(torch.isposinf(lse), torch.isposinf(want_lse))
    finite = torch.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite].numpy(), want_lse[finite].numpy(), rtol=1e-5, atol=1e-5)
    # The mask is the call's own: out = (P x keep / (1 - p)) V, as FlashAttention's reference builds it.
    v_heads = v.double().repeat_interleave(2, dim=2)
    want_out = torch.einsum("bhqk,bkhd->bqhd", want_p * keep / (1 - p_drop), v_heads)
    assert_close(out, want_out)
    dropped = (~keep & (want_p > 0)).sum().item() / (want_p > 0).sum().item()
    assert 0.1 < dropped < 0.4
    # The same draw as the call without return_attn_probs (torch's default generator, one seed).
    torch.manual_seed(7)
    assert torch.equal(fa.flash_attn_func(q, k, v, p_drop, causal=causal, window_size=window), out)


def test_return_attn_probs_without_dropout_and_empty_rows():
    # No dropout: S_dmask is None (as FlashAttention returns it); the LSE +inf for a row that sees no key.
    q, k, v = inputs(4, seq_q=21, seq_k=9)
    out, lse, s_dmask = fa.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert s_dmask is None
    _, want_lse, _ = probabilities(q, k, True, (-1, -1))
    assert torch.isposinf(lse[:, :, :12]).all() and torch.equal(torch.isposinf(lse), torch.isposinf(want_lse))
    assert torch.equal(out, fa.flash_attn_func(q, k, v, causal=True))


def test_return_attn_probs_varlen_and_gradients():
    lengths_q, lengths_k = [5, 0, 9], [12, 3, 7]
    cu_q = torch.tensor(np.cumsum([0] + lengths_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lengths_k), dtype=torch.int32)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(int(cu_q[-1]), 4, 16, generator=g).requires_grad_()
    k, v = (torch.randn(int(cu_k[-1]), 2, 16, generator=g).requires_grad_() for _ in range(2))
    torch.manual_seed(11)
    out, lse, s_dmask = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 12, 0.3, causal=True,
                                                  return_attn_probs=True)
    assert lse.shape == (4, int(cu_q[-1])) and s_dmask.shape == (3, 4, 9, 12)
    for b in range(3):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lengths_q[b] == 0:
            assert (s_dmask[b] == 0).all()
            continue
        attn, _ = recovered(s_dmask[b:b + 1, :, :lengths_q[b], :lengths_k[b]], q.detach()[None, rows],
                            k.detach()[None, keys], True, (-1, -1))
        want_p, _, _ = probabilities(q.detach()[None, rows], k.detach()[None, keys], True)
        np.testing.assert_allclose(attn.numpy(), want_p.numpy(), rtol=1e-4, atol=1e-7)
        assert (s_dmask[b, :, lengths_q[b]:] == 0).all() and (s_dmask[b, :, :, lengths_k[b]:] == 0).all()
    out.sum().backward()  # the out of return_attn_probs is differentiable as ever
    assert q.grad is not None and torch.isfinite(k.grad).all()


# --- the packed forms: slices of the packed tensor, gradients into it ---

def test_packed_forms_equal_the_unpacked_calls():
    q, k, v = inputs(6, seq_q=21, seq_k=21, kv_heads=4)
    qkv = torch.stack([q, k, v], dim=2).requires_grad_()
    out = fa.flash_attn_qkvpacked_func(qkv, causal=True, window_size=torch.tensor([5, 0]))
    assert torch.equal(out, fa.flash_attn_func(q, k, v, causal=True, window_size=(5, 0)))
    out.sum().backward()
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    fa.flash_attn_func(qs, ks, vs, causal=True, window_size=(5, 0)).sum().backward()
    assert torch.equal(qkv.grad, torch.stack([qs.grad, ks.grad, vs.grad], dim=2))
    kv = torch.stack([k, v], dim=2)
    assert torch.equal(fa.flash_attn_kvpacked_func(q, kv), fa.flash_attn_func(q, k, v))
    cu = torch.tensor([0, 21, 42], dtype=torch.int32)
    flat_qkv = qkv.detach().flatten(0, 1)
    want = fa.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 21, 21, causal=True)
    assert torch.equal(fa.flash_attn_varlen_qkvpacked_func(flat_qkv, cu, 21, causal=True), want)
    assert torch.equal(fa.flash_attn_varlen_kvpacked_func(q.flatten(0, 1), kv.flatten(0, 1), cu, cu, 21, 21,
                                                          causal=True), want)


# --- forward-only calls with inputs that require grad ---

def test_paged_and_kvcache_calls_run_forward_and_refuse_only_a_gradient():
    q, k, v = inputs(8, batch=2, seq_q=3, seq_k=8, grad=True)
    g = torch.Generator().manual_seed(9)
    pool_k, pool_v = (torch.randn(4, 4, 2, 16, generator=g) for _ in range(2))
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    cu_q = torch.tensor([0, 3, 6], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 13], dtype=torch.int32)
    paged = fa.flash_attn_varlen_func(q.flatten(0, 1), pool_k, pool_v, cu_q, cu_k, 3, 8, block_table=table)
    with torch.no_grad():
        same = fa.flash_attn_varlen_func(q.flatten(0, 1), pool_k, pool_v, cu_q, cu_k, 3, 8, block_table=table)
    assert torch.equal(paged.detach(), same)
    with pytest.raises(FlashAttnNotSupported, match="flash_attn_varlen_func: no backward"):
        paged.sum().backward()
    out = fa.flash_attn_with_kvcache(q, k.detach().clone(), v.detach().clone(), cache_seqlens=6, causal=True)
    with torch.no_grad():
        assert torch.equal(out.detach(), fa.flash_attn_with_kvcache(q, k.detach().clone(), v.detach().clone(),
                                                                    cache_seqlens=6, causal=True))
    with pytest.raises(FlashAttnNotSupported, match="flash_attn_with_kvcache: no backward"):
        out.sum().backward()
    # Asking for no gradient through it is fine: another loss still backpropagates.
    (q * 2).sum().backward()
    assert torch.equal(q.grad, torch.full_like(q, 2.0))


# --- the paged capacity error names block_table (FlashAttention's test matches it) ---

def test_paged_capacity_error_names_block_table_and_cache_seqlens():
    q = torch.randn(1, 1, 1, 16)
    pool_k, pool_v = torch.randn(4, 8, 1, 16), torch.randn(4, 8, 1, 16)
    table = torch.zeros(1, 1, dtype=torch.int32)
    for seqlens, new in ((torch.tensor([9], dtype=torch.int32), None), (torch.tensor([8], dtype=torch.int32), 1)):
        kv = {} if new is None else dict(k=torch.randn(1, 1, 1, 16), v=torch.randn(1, 1, 1, 16))
        with pytest.raises(RuntimeError, match=r"cache_seqlens\[0\].*block_table") as caught:
            fa.flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=seqlens, block_table=table, **kv)
        assert isinstance(caught.value, selfattn.InvalidArgument)
    # Exactly at capacity is fine.
    out = fa.flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=torch.tensor([8], dtype=torch.int32),
                                     block_table=table)
    assert torch.isfinite(out).all()
