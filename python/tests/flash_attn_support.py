"""What the flash_attn module's test files share (test_flash_attn_module.py,
test_flash_attn_kvcache.py): a float64 torch reference written in FlashAttention's terms
([batch, seqlen, nheads, headdim]; masks aligned bottom-right; a row without keys gives 0 and LSE
+inf), fresh inputs and caches, and the tolerance checks. Imports torch: for torch test files only."""
import math

import numpy as np
import torch

from conftest import TOLERANCE, relative_error

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def reference(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, softmax_scale=None,
              key_lengths=None, key_starts=None):
    """float64 (out [b, sq, h, d], lse [b, h, sq]) in FlashAttention's terms, differentiable."""
    q, k, v = (x.double() for x in (q, k, v))
    batch, seq_q, heads, dim = q.shape
    seq_k, kv_heads = k.shape[1], k.shape[2]
    k, v = (x.repeat_interleave(heads // kv_heads, dim=2) for x in (k, v))
    scale = 1 / math.sqrt(dim) if softmax_scale is None else softmax_scale
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    lengths = [seq_k] * batch if key_lengths is None else [int(n) for n in key_lengths]
    rows, cols = torch.arange(seq_q)[:, None], torch.arange(seq_k)[None, :]
    visible, distance = [], []
    for b in range(batch):
        aligned = rows + lengths[b] - seq_q
        see = cols < lengths[b]
        if key_starts is not None:
            see = see & (cols >= int(key_starts[b]))  # left padding (cache_leftpad)
        if causal:
            see = see & (cols <= aligned)
        if window_size[0] >= 0:
            see = see & (cols >= aligned - window_size[0])
        if window_size[1] >= 0:
            see = see & (cols <= aligned + window_size[1])
        visible.append(see)
        distance.append((aligned - cols).abs().double())
    visible = torch.stack(visible)[:, None]  # [b, 1, sq, sk]
    if alibi_slopes is not None:
        slopes = torch.as_tensor(alibi_slopes, dtype=torch.float64).expand(batch, heads)
        s = s - slopes[:, :, None, None] * torch.stack(distance)[:, None]
    empty = ~visible.any(-1, keepdim=True)
    s = s.masked_fill(~visible, -math.inf).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse).masked_fill(empty, 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    lse = lse.squeeze(-1).masked_fill(empty.squeeze(-1).expand_as(lse.squeeze(-1)), math.inf)
    return out, lse


def qkv(seed, batch, seq_q, seq_k, heads=4, kv_heads=2, dim=32, dtype="float32"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq_q, heads, dim, generator=g).to(DTYPES[dtype])
    k, v = (torch.randn(batch, seq_k, kv_heads, dim, generator=g).to(DTYPES[dtype]) for _ in range(2))
    return q, k, v


def assert_close(got, want, dtype, per_row=True, factor=1):
    assert got.shape == want.shape
    assert relative_error(got.detach().double().numpy(), want.detach().numpy(), per_row) <= factor * TOLERANCE[dtype]


def assert_lse(got, want):
    """float32 LSE against the reference's: +inf exactly where a row sees no key (FlashAttention)."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(torch.isposinf(got), torch.isposinf(want)) and not torch.isneginf(got).any()
    finite = torch.isfinite(want)
    np.testing.assert_allclose(got[finite].double().numpy(), want[finite].numpy(), rtol=2e-5, atol=2e-5)


def cache(seed, batch, capacity, kv_heads=2, dim=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, capacity, kv_heads, dim, generator=g).to(dtype) for _ in range(2)]
