"""The KV cache on torch tensors (CPU tensors run on the sim through DLPack): append_kv and
attention_with_kv_cache against the float64 reference, with sinks too; a decode step compiled
whole (fullgraph) as eager, also with a preallocated out= (attention_with_kv_cache_out), and the
decode op's fake implementation; the refusal of inputs that require grad (the decode calls have no
backward); packed calls' host metadata checked whatever q's device, and the rows no sequence owns. The NumPy side is test_kv_cache.py. Skipped without PyTorch (scripts/setup-deps
installs it where it can). The tests marked device_check take a `torch_device` (conftest.py) and
run on CUDA tensors too where there is a GPU: bench/device-check.sh runs those on a lent one."""
import re

import numpy as np
import pytest

import selfattn
from conftest import TOLERANCE, host, reference, relative_error

torch = pytest.importorskip("torch")


@pytest.mark.device_check
def test_kv_cache_on_torch_tensors(torch_device):
    # The decode calls on torch tensors (lists for lengths converted), with no autograd graph.
    g = torch.Generator().manual_seed(13)
    k_cache, v_cache = (torch.randn(2, 6, 1, 8, generator=g).to(torch_device) for _ in range(2))  # bshd
    k_new, v_new, q = (torch.randn(2, 1, 1, 8, generator=g).to(torch_device) for _ in range(3))
    lengths = selfattn.append_kv(k_cache, v_cache, [2, 5], k_new, v_new, layout="bshd", return_lengths=True)
    assert lengths.dtype == torch.int32 and lengths.device == k_cache.device and lengths.tolist() == [3, 6]
    assert torch.equal(k_cache[0, 2], k_new[0, 0]) and torch.equal(k_cache[1, 5], k_new[1, 0])
    out, lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, layout="bshd", return_lse=True)
    want, want_lse = reference(*(host(a.transpose(1, 2)) for a in (q, k_cache, v_cache)), "bottom_right",
                               key_lengths=host(lengths))
    assert relative_error(host(out.transpose(1, 2)), want) <= TOLERANCE["float32"]
    np.testing.assert_allclose(host(lse), want_lse, rtol=1e-5, atol=1e-5)
    with pytest.raises(selfattn.NotAvailable, match="attention_with_kv_cache: q requires grad"):
        selfattn.attention_with_kv_cache(q.requires_grad_(), k_cache, v_cache, lengths, layout="bshd")


@pytest.mark.device_check
def test_a_decode_step_compiles_whole(torch_device):
    # append_kv (which writes the cache in place) and attention_with_kv_cache are custom ops, so a
    # decode step traces with fullgraph=True; compiled and eager agree, caches included.
    g = torch.Generator().manual_seed(14)
    pool_k, pool_v = (torch.randn(5, 4, 2, 8, generator=g).to(torch_device) for _ in range(2))  # bshd pages of 4
    table = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32, device=torch_device)
    lengths = torch.tensor([2, 6], dtype=torch.int32, device=torch_device)
    k_new, v_new = (torch.randn(2, 1, 2, 8, generator=g).to(torch_device) for _ in range(2))
    q = torch.randn(2, 1, 4, 8, generator=g).to(torch_device)

    def step(q, k_new, v_new, pool_k, pool_v, lengths):
        updated = selfattn.append_kv(pool_k, pool_v, lengths, k_new, v_new, block_table=table, layout="bshd",
                                     return_lengths=True)
        out = selfattn.attention_with_kv_cache(q, pool_k, pool_v, updated, block_table=table, layout="bshd",
                                               softcap=20.0)
        return out, updated

    eager_k, eager_v = pool_k.clone(), pool_v.clone()
    want, want_lengths = step(q, k_new, v_new, eager_k, eager_v, lengths)
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    got, got_lengths = compiled(q, k_new, v_new, pool_k, pool_v, lengths)
    assert torch.equal(got, want) and torch.equal(got_lengths, want_lengths)
    assert torch.equal(pool_k, eager_k) and torch.equal(pool_v, eager_v)
    assert torch.equal(pool_k[3, 2], k_new[0, 0]) and torch.equal(pool_k[4, 2], k_new[1, 0])  # tokens 2 and 6

    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake_q = torch.empty(3, 2, 7, 16)
        pool = torch.empty(9, 2, 4, 16)
        cu = torch.empty(3, dtype=torch.int32)
        out, lse = torch.ops.selfattn.attention_with_kv_cache(fake_q, pool, pool, cu, None, None, "bhsd",
                                                              "bottom_right", None, "auto", None, None, False, None, 1,
                                                              0, -1, -1, None, None, None, None, None, None, False,
                                                              None, 0)
        assert out.shape == fake_q.shape and lse.shape == (3, 2, 7)
        packed_q = torch.empty(11, 2, 16)  # a packed call: lse [heads, total_q]
        offsets = torch.empty(4, dtype=torch.int32)
        out, lse = torch.ops.selfattn.attention_with_kv_cache(packed_q, pool, pool, cu, None, None, "bhsd",
                                                              "bottom_right", None, "auto", None, None, False, None, 1,
                                                              0, -1, -1, None, None, None, None, None, None, False,
                                                              offsets, 7)
        assert out.shape == packed_q.shape and lse.shape == (2, 11)


def test_rotary_tables_that_require_grad_are_refused():
    cache, q = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 1, 8)
    cos = torch.ones(4, 2, requires_grad=True)
    with pytest.raises(selfattn.NotAvailable, match="append_kv: rotary_cos requires grad"):
        selfattn.append_kv(cache, cache.clone(), [0], q, q, rotary_cos=cos, rotary_sin=cos.detach())
    with pytest.raises(selfattn.NotAvailable, match="attention_with_kv_cache: rotary_sin requires grad"):
        selfattn.attention_with_kv_cache(q, cache, cache.clone(), [1], rotary_cos=cos.detach(), rotary_sin=cos)


def test_kv_cache_passes_sinks_and_refuses_their_gradient():
    # The decode op takes sinks (eager and compiled alike, against the reference), but has no
    # backward: sinks that require grad are refused.
    g = torch.Generator().manual_seed(22)
    k_cache, v_cache = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(2))
    q = torch.randn(2, 4, 1, 8, generator=g)
    lengths, sinks = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0.5, -float("inf"), 1.0, 2.0])

    def step(q, sinks):
        return selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, sinks=sinks, return_lse=True)

    out, lse = step(q, sinks)
    want, want_lse = reference(q.numpy(), k_cache.numpy(), v_cache.numpy(), "bottom_right", key_lengths=lengths.numpy(),
                               sinks=sinks.numpy())
    assert relative_error(out.numpy(), want) <= TOLERANCE["float32"] and torch.all(out[0] == 0)
    assert torch.equal(lse[0], sinks[:, None])
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(step, backend="eager", fullgraph=True)(q, sinks)
    assert torch.equal(compiled[0], out) and torch.equal(compiled[1], lse)
    with pytest.raises(selfattn.NotAvailable, match="attention_with_kv_cache: sinks requires grad"):
        step(q, sinks.clone().requires_grad_())


@pytest.mark.device_check
def test_a_latent_cache_decode_step_compiles_whole(torch_device):
    # DeepSeek's absorbed MLA, scaled down: one pool of rows [c_kv (32) | k_rope (8)], V its first 32
    # columns as a view; the append (rotary on the rope part) and the attention trace whole, and
    # the output has V's head dim.
    g = torch.Generator().manual_seed(15)
    latent, rope = 32, 8
    pool = torch.randn(5, 4, 1, latent + rope, generator=g).to(torch_device)  # bshd pages of 4, one kv head
    table = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32, device=torch_device)
    lengths = torch.tensor([2, 6], dtype=torch.int32, device=torch_device)
    k_new = torch.randn(2, 1, 1, latent + rope, generator=g).to(torch_device)
    q = torch.randn(2, 1, 8, latent + rope, generator=g).to(torch_device)
    angles = torch.rand(16, rope // 2, generator=g) * 6.28
    cos, sin = angles.cos().to(torch_device), angles.sin().to(torch_device)

    def step(q, k_new, pool, lengths):
        rotary = dict(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=False, rotary_first_dim=latent)
        updated = selfattn.append_kv(pool, pool[..., :latent], lengths, k_new, k_new[..., :latent],
                                     block_table=table, layout="bshd", return_lengths=True, **rotary)
        out = selfattn.attention_with_kv_cache(q, pool, pool[..., :latent], updated, block_table=table,
                                               layout="bshd", **rotary)
        return out, updated

    eager_pool = pool.clone()
    want, want_lengths = step(q, k_new, eager_pool, lengths)
    assert want.shape == (2, 1, 8, latent)
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    got, got_lengths = compiled(q, k_new, pool, lengths)
    assert torch.equal(got, want) and torch.equal(got_lengths, want_lengths) and torch.equal(pool, eager_pool)
    # The latent columns went in as they were, the rope ones rotated at positions 2 and 6.
    assert torch.equal(pool[3, 2, 0, :latent], k_new[0, 0, 0, :latent])
    c, s = cos[6], sin[6]
    x, y = k_new[1, 0, 0, latent:latent + rope // 2], k_new[1, 0, 0, latent + rope // 2:]
    torch.testing.assert_close(pool[4, 2, 0, latent:], torch.cat([x * c - y * s, x * s + y * c]))


@pytest.mark.device_check
def test_a_decode_step_with_a_preallocated_out_compiles_whole(torch_device):
    # out= goes through attention_with_kv_cache_out: the caller's tensor is written (and returned)
    # with the values of a call without out=, eagerly and in a step compiled with fullgraph=True.
    g = torch.Generator().manual_seed(29)
    k_cache, v_cache = (torch.randn(2, 2, 6, 8, generator=g).to(torch_device) for _ in range(2))
    q = torch.randn(2, 4, 1, 8, generator=g).to(torch_device)
    lengths = torch.tensor([3, 6], dtype=torch.int32, device=torch_device)
    want, want_lse = selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, softcap=20.0, return_lse=True)
    expected, _ = reference(host(q), host(k_cache), host(v_cache), "bottom_right", key_lengths=host(lengths),
                            softcap=20.0)
    assert relative_error(host(want), expected) <= TOLERANCE["float32"]

    def step(q, out):
        return selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, softcap=20.0, out=out, return_lse=True)

    for run in (step, torch.compile(step, backend="eager", fullgraph=True)):
        out = torch.full_like(q, float("nan"))
        address = out.data_ptr()
        result, lse = run(q, out)
        assert result is out and out.data_ptr() == address and torch.equal(out, want) and torch.equal(lse, want_lse)
    assert selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, softcap=20.0, out=out) is out
    with pytest.raises(selfattn.InvalidArgument, match=r"attention_with_kv_cache: out.shape\[1\] expected 4"):
        selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, out=torch.empty(2, 2, 1, 8, device=torch_device))
    with pytest.raises(selfattn.NotAvailable, match="attention_with_kv_cache: out requires grad"):
        selfattn.attention_with_kv_cache(q, k_cache, v_cache, lengths, out=torch.empty_like(q).requires_grad_())


@pytest.mark.device_check
def test_packed_calls_check_host_metadata_and_zero_rows_no_sequence_owns(torch_device):
    # Metadata given as CPU tensors is checked on the host whatever q's device (before the custom op,
    # which gets it where q lives; on the sim in the op's implementation), naming the entry, with
    # nothing written. On a CUDA device, device metadata is the kernels' (clamped), named by
    # validate_metadata. The op allocates out and lse: rows no sequence owns are 0 and -inf there,
    # eagerly and compiled; the out variant leaves the caller's rows as they were.
    g = torch.Generator().manual_seed(31)
    pool_k, pool_v = (torch.randn(6, 2, 4, 8, generator=g).to(torch_device) for _ in range(2))  # bhsd, pages of 4
    table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    lengths, cu = torch.tensor([5, 0, 7], dtype=torch.int32), torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    q = torch.randn(7, 4, 8, generator=g).to(torch_device)  # rows 5 and 6: no sequence's
    k_new = torch.randn(7, 2, 8, generator=g).to(torch_device)
    pool_before, out = pool_k.clone(), torch.full_like(q, float("nan"))
    bad = torch.tensor([0, 2, 2, 9], dtype=torch.int32)
    with pytest.raises(selfattn.InvalidArgument, match=re.escape(
            "attention_with_kv_cache: cu_seqlens_q[3] = 9 runs past q's 7 rows (sequence 2: rows [2, 9))")):
        selfattn.attention_with_kv_cache(q, pool_k, pool_v, lengths, block_table=table, cu_seqlens_q=bad,
                                         max_seqlen_q=7, out=out)
    with pytest.raises(selfattn.InvalidArgument, match=re.escape(
            "attention_with_kv_cache: lengths[2] = 9 expected 0 to the cache's capacity, 8 tokens")):
        selfattn.attention_with_kv_cache(q, pool_k, pool_v, torch.tensor([5, 0, 9], dtype=torch.int32),
                                         block_table=table, cu_seqlens_q=cu, max_seqlen_q=3)
    with pytest.raises(selfattn.InvalidArgument, match=re.escape(
            "append_kv: cu_seqlens_new[3] = 9 runs past k_new's 7 rows (sequence 2: rows [2, 9))")):
        selfattn.append_kv(pool_k, pool_v, lengths, k_new, k_new, block_table=table, cu_seqlens_new=bad,
                           max_seqlen_new=7)
    assert torch.isnan(out).all() and torch.equal(pool_k, pool_before)
    if torch_device == "cuda":  # offsets on the device: not read by the package
        with pytest.raises(selfattn.InvalidArgument, match=re.escape(
                "cu_seqlens_q[3] = 9 runs past q's 7 rows (sequence 2: rows [2, 9)) (validate_metadata; without "
                "it the kernels clamp cu_seqlens_q")):
            selfattn.attention_with_kv_cache(q, pool_k, pool_v, lengths, block_table=table,
                                             cu_seqlens_q=bad.to(torch_device), max_seqlen_q=7, out=out,
                                             validate_metadata=True)
        assert torch.isnan(out).all()
        selfattn.attention_with_kv_cache(q, pool_k, pool_v, lengths, block_table=table, path="fused",
                                         cu_seqlens_q=bad.to(torch_device), max_seqlen_q=7)

    def step(q):
        return selfattn.attention_with_kv_cache(q, pool_k, pool_v, lengths, block_table=table, cu_seqlens_q=cu,
                                                max_seqlen_q=3, return_lse=True)

    want = None
    for run in (step, torch.compile(step, backend="eager", fullgraph=True)):
        got, lse = run(q)
        assert torch.all(got[5:] == 0) and torch.all(lse[:, 5:] == -float("inf"))
        assert torch.isfinite(got[:5]).all() and (want is None or torch.equal(got, want))
        want = got
    _, lse = selfattn.attention_with_kv_cache(q, pool_k, pool_v, lengths, block_table=table, cu_seqlens_q=cu,
                                              max_seqlen_q=3, out=out, return_lse=True)
    assert torch.isnan(out[5:]).all() and torch.equal(out[:5], want[:5]) and torch.all(lse[:, 5:] == -float("inf"))
