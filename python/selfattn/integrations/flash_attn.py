"""FlashAttention's Python calls over selfattn: ``flash_attn_func``, ``flash_attn_varlen_func``,
``flash_attn_with_kvcache`` and the packed forms (``flash_attn_qkvpacked_func``,
``flash_attn_kvpacked_func``, ``flash_attn_varlen_qkvpacked_func``,
``flash_attn_varlen_kvpacked_func``, which slice the packed tensor as FlashAttention's wrappers do),
with FlashAttention's argument names, order, defaults, shapes and conventions, on torch tensors. A
project switches by changing an import::

    # from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    from selfattn.integrations.flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

CUDA tensors run on the GPU, CPU tensors on the sim (selfattn's CPU simulator). float32 is accepted
besides float16 and bfloat16. v's headdim may differ from q's and k's in flash_attn_func and
flash_attn_varlen_func, as FlashAttention-3 takes MLA's (192, 128): out takes v's.

What each argument becomes (the calls are selfattn.attention, attention_varlen, append_kv and
attention_with_kv_cache with layout="bshd", FlashAttention's [batch, seqlen, nheads, headdim]):

- causal=True: causal="bottom_right" (query i sees keys j <= i + seqlen_k - seqlen_q, as in
  FlashAttention; a query that sees no key gives a row of 0); causal=False: no causal mask.
- window_size=(left, right), -1 unbounded: window=(left, right), both aligned bottom-right as
  FlashAttention aligns them; (-1, -1): no window. Any two integers: a tuple or list, or a tensor
  or array of two (FlashAttention's tests pass torch.randint(0, seqlen, (2,))).
- softcap=0.0: none; softcap > 0: softcap.
- alibi_slopes: float32 [nheads] or [batch, nheads], -slope * |i + seqlen_k - seqlen_q - j|.
- softmax_scale=None: 1 / sqrt(headdim).
- deterministic (flash_attn_func, flash_attn_varlen_func): deterministic=, the mode of the library's
  backward that loss.backward() runs (bitwise-identical gradients run to run; the fused path then
  computes dQ in a second kernel instead of with atomics). The forward is deterministic either way.
- num_splits: the library's num_splits (0: it chooses).
- q_descale, k_descale, v_descale (flash_attn_func and flash_attn_varlen_func without block_table;
  keyword arguments, as FlashAttention-3's FP8 forward names them): FP8 inputs, q, k and v all
  torch.float8_e4m3fn or all float8_e5m2, float32 [batch, nheads_k] each (None: 1), the real value
  being stored x descale; out is bfloat16 (FlashAttention-3's choice). No backward for FP8 inputs.

Conventions FlashAttention's users rely on, kept here:

- softmax_lse (flash_attn_with_kvcache(..., return_softmax_lse=True), and the second of the
  three results of return_attn_probs=True): float32 [batch, nheads, seqlen_q] ([nheads, total_q]
  for the varlen calls), +inf for a row that sees no key (FlashAttention's value; selfattn's own
  calls give -inf there, and this module maps it).
- return_attn_probs=True: (out, softmax_lse, S_dmask), as FlashAttention returns them. S_dmask is
  None without dropout (FlashAttention returns it only with dropout_p > 0); with dropout it is
  float32 [batch, nheads, seqlen_q, seqlen_k] ([batch, nheads, max_seqlen_q, max_seqlen_k] for the
  varlen calls, sequence b's rows and keys from 0, 0 elsewhere) in FlashAttention's encoding: row
  i's unnormalised weights exp(s_ij - m_i), m_i the largest score of the row (FlashAttention's
  running maximum over one key block: _get_block_size_n() here returns a size past any row), with
  the entries dropout drops negated, so FlashAttention's tests recover the probabilities and the
  mask from it. It comes from selfattn.attention_probabilities() with the call's own dropout seed:
  a second pass on the naive path's kernels, batch x nheads x seqlen_q x seqlen_k floats, for
  tests (as FlashAttention's is), not for training. No gradient flows through it.
- Errors: everything this module raises is a :class:`FlashAttnError`, a ``RuntimeError`` (what
  FlashAttention raises), so ``except RuntimeError`` still works. Errors from selfattn's calls are
  re-raised as the subclass that is also the library's own class: :class:`FlashAttnArgumentError`
  is a ``selfattn.InvalidArgument`` (a ``ValueError``), :class:`FlashAttnNotSupported` a
  ``selfattn.NotAvailable``, and so on; the library's exception is the ``__cause__``. An error in
  ``loss.backward()`` comes from autograd and is the library's own (rare: the forward checked the
  arguments).
- The KV cache's capacity is checked on the host: cache_seqlens[b] + seqlen_new must not exceed
  it (a FlashAttnArgumentError naming cache_seqlens, and block_table for a paged cache, whose
  capacity is block_table's columns x page_block_size). That reads cache_seqlens back from the GPU;
  set ``check_cache_capacity = False`` on this module to skip the check (under torch.compile or
  CUDA graphs), and then tokens past the capacity are dropped, never written outside the cache.

Gradients: flash_attn_func and flash_attn_varlen_func (and the packed forms) are differentiable in
q, k and v through selfattn's torch custom ops (loss.backward() runs the library's backward).
flash_attn_with_kvcache and flash_attn_varlen_func with block_table have no backward, as in
FlashAttention: inputs that require grad are accepted and the forward runs; only asking for a
gradient through the output raises (FlashAttnNotSupported).

Refused, with a FlashAttnNotSupported naming the argument (none is silently ignored):

- cache_batch_idx with block_table (FlashAttention refuses it too).
- dropout_p > 0 in flash_attn_varlen_func with block_table (the paged KV-cache call has no dropout).

flash_attn_varlen_func with block_table (a serving engine's step: each sequence's new rows packed in
q over a paged cache, FlashAttention's paged varlen call): k and v are the page pools [num_blocks,
page_block_size, nheads_k, headdim], sequence b's keys are its first cu_seqlens_k[b + 1] -
cu_seqlens_k[b] cache tokens, and the call is selfattn.attention_with_kv_cache(cu_seqlens_q=...)
(no backward, as with flash_attn_with_kvcache; graph-safe on the fused path). With
return_attn_probs=True it returns (out, softmax_lse [nheads, total_q], None).

The lower layer some projects call to run the forward and the backward themselves (ring
attention, for one), with FlashAttention's names, positional order and results, no autograd:
``_flash_attn_forward``, ``_flash_attn_varlen_forward``, ``_flash_attn_backward``,
``_flash_attn_varlen_backward`` and ``flash_attn_gpu`` (``fwd``, ``varlen_fwd``, ``bwd``,
``varlen_bwd``, the compiled extension's entry points). The forwards return rng_state (the dropout
seed and offset), which the backwards take to draw the same mask (see _flash_attn_extension.py for
the few differences).

Rotary embedding follows FlashAttention's positions through selfattn's rotary_positions: new k and
v token t at the slot it is written to, cache_seqlens + t (with cache_leftpad too: FlashAttention
adds the left padding back into the rotary offset, so positions are the cache's slots, not counted
from the first real token), q's row i at cache_seqlens + i when the call is causal or local and
every row at cache_seqlens otherwise.
"""
from __future__ import annotations

import numbers
from typing import Optional, Union

import torch

import selfattn

from . import _flash_attn_arguments as arguments
from ._flash_attn_extension import (_flash_attn_backward, _flash_attn_forward, _flash_attn_varlen_backward,
                                    _flash_attn_varlen_forward, flash_attn_gpu)
from ._flash_attn_arguments import (FlashAttnArgumentError, FlashAttnBackendError, FlashAttnError,
                                    FlashAttnNotSupported, FlashAttnOutOfMemory)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
           "FlashAttnError", "FlashAttnArgumentError", "FlashAttnNotSupported", "FlashAttnOutOfMemory",
           "FlashAttnBackendError", "check_cache_capacity"]

for _error in (FlashAttnError, FlashAttnArgumentError, FlashAttnNotSupported, FlashAttnOutOfMemory,
               FlashAttnBackendError):
    _error.__module__ = __name__  # shown (and caught) as this module's
del _error

# The KV cache's capacity is checked on the host (reading cache_seqlens back) unless this is False.
check_cache_capacity = True


def _get_block_size_n(device=None, head_dim=None, is_dropout=None, is_causal=None):
    """The key block of S_dmask's encoding (FlashAttention's helper of the same name, which its
    tests call): this module encodes each row as one block, so the size is past any row."""
    return arguments.S_DMASK_BLOCK


def _with_attn_probs(name, run, probabilities, dropout_p, return_attn_probs):
    """Runs a differentiable call, `run`(dropout_seed) -> (out, lse); returns out, or with
    return_attn_probs (out, softmax_lse, S_dmask), S_dmask from `probabilities`(seed) with the
    seed the call used (None without dropout, as FlashAttention)."""
    if not return_attn_probs:
        return run(None, False)
    seed = None
    if dropout_p > 0:  # one draw, shared by the call and S_dmask
        seed = arguments.draw_dropout_seed()
    out, lse = run(seed, True)
    if dropout_p == 0:
        return out, arguments.flash_lse(lse), None
    with torch.no_grad(), arguments.runtime_errors(name):
        dmask = arguments.s_dmask(probabilities(seed))
    return out, arguments.flash_lse(lse), dmask


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, q_descale=None,
                    k_descale=None, v_descale=None):
    """Attention of q [batch, seqlen_q, nheads, headdim] to k, v [batch, seqlen_k, nheads_k,
    headdim] (nheads_k divides nheads: grouped-query attention; v's headdim may differ); returns
    out shaped like q with v's headdim (with return_attn_probs=True: out, softmax_lse, S_dmask).
    Differentiable in q, k and v. See the module's doc for each argument and what is refused."""
    name = "flash_attn_func"
    dropout_p = arguments.dropout_p(name, dropout_p)
    q, k, v = (arguments.tensor(name, label, x, 4) for label, x in (("q", q), ("k", k), ("v", v)))
    masks = dict(causal="bottom_right" if causal else None, scale=arguments.scale(name, softmax_scale),
                 window=arguments.window(name, window_size), softcap=arguments.softcap(name, softcap),
                 alibi_slopes=alibi_slopes)
    fp8 = arguments.descales(q_descale, k_descale, v_descale)

    def run(seed, with_lse):
        with arguments.runtime_errors(name):
            return selfattn.attention(q, k, v, layout="bshd", deterministic=bool(deterministic), dropout_p=dropout_p,
                                      dropout_seed=seed, return_lse=with_lse, **fp8, **masks)

    def probabilities(seed):
        return selfattn.attention_probabilities(q, k, v, layout="bshd", dropout_p=dropout_p, dropout_seed=seed,
                                                **masks)

    return _with_attn_probs(name, run, probabilities, dropout_p, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, q_descale=None,
                           k_descale=None, v_descale=None):
    """Attention over sequences packed without padding: q [total_q, nheads, headdim], k, v
    [total_k, nheads_k, headdim], cu_seqlens_q/k int32 [batch + 1] (sequence b owns rows
    [cu_seqlens[b], cu_seqlens[b + 1])); the masks align within each sequence. Returns out shaped
    like q with v's headdim (with return_attn_probs=True: out, softmax_lse [nheads, total_q],
    S_dmask); differentiable in q, k and v. See the module's doc."""
    name = "flash_attn_varlen_func"
    dropout_p = arguments.dropout_p(name, dropout_p)
    paged = block_table is not None
    if paged and dropout_p > 0:
        arguments.refuse(name, f"dropout_p={dropout_p} with block_table: the paged KV-cache call has no dropout "
                               "(inference)")
    fp8 = arguments.descales(q_descale, k_descale, v_descale)
    if paged and fp8:
        arguments.refuse(name, f"{', '.join(fp8)} with block_table: an FP8 cache takes its scales through "
                               "selfattn.attention_with_kv_cache(k_scale=, v_scale=)")
    q = arguments.tensor(name, "q", q, 3)
    k, v = arguments.tensor(name, "k", k, 4 if paged else 3), arguments.tensor(name, "v", v, 4 if paged else 3)
    for label, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if arguments._integer(value) is None or arguments._integer(value) < 0:
            arguments.invalid(name, f"{label} expected an int >= 0, got {value!r}")
    max_q, max_k = arguments._integer(max_seqlen_q), arguments._integer(max_seqlen_k)
    masks = dict(causal="bottom_right" if causal else None, scale=arguments.scale(name, softmax_scale),
                 window=arguments.window(name, window_size), softcap=arguments.softcap(name, softcap),
                 alibi_slopes=alibi_slopes)
    if paged:  # k, v: page pools; each sequence's key count from cu_seqlens_k, on the device
        cu_k = arguments.tensor(name, "cu_seqlens_k", cu_seqlens_k, 1)
        lengths = (cu_k[1:] - cu_k[:-1]).to(torch.int32)

        def paged_call():
            with arguments.runtime_errors(name):
                return selfattn.attention_with_kv_cache(q, k, v, lengths, block_table=block_table, layout="bshd",
                                                        cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_q,
                                                        return_lse=bool(return_attn_probs), **masks)

        result = arguments.forward_only(name, paged_call, (q, k, v))
        return (result[0], arguments.flash_lse(result[1]), None) if return_attn_probs else result
    varlen = dict(max_seqlen_q=max_q, max_seqlen_k=max_k)

    def run(seed, with_lse):
        with arguments.runtime_errors(name):
            return selfattn.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, deterministic=bool(deterministic),
                                             dropout_p=dropout_p, dropout_seed=seed, return_lse=with_lse, **varlen,
                                             **fp8, **masks)

    def probabilities(seed):
        return selfattn.attention_probabilities(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                                dropout_p=dropout_p, dropout_seed=seed, **varlen, **masks)

    return _with_attn_probs(name, run, probabilities, dropout_p, return_attn_probs)


# The packed forms slice the packed tensor (views: the gradients reach it through them), as
# FlashAttention's wrappers do, and pass everything else on.

def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func on qkv [batch, seqlen, 3, nheads, headdim]."""
    qkv = arguments.tensor("flash_attn_qkvpacked_func", "qkv", qkv, 5)
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func on q and kv [batch, seqlen_k, 2, nheads_k, headdim]."""
    kv = arguments.tensor("flash_attn_kvpacked_func", "kv", kv, 5)
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func on qkv [total, 3, nheads, headdim], one cu_seqlens for q and k."""
    qkv = arguments.tensor("flash_attn_varlen_qkvpacked_func", "qkv", qkv, 4)
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func on q and kv [total_k, 2, nheads_k, headdim]."""
    kv = arguments.tensor("flash_attn_varlen_kvpacked_func", "kv", kv, 4)
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def _adjacent_columns(first, second):
    """The view of rows [first | second] when second's columns follow first's in one allocation
    (same strides, same extents but the last, second starting where first's columns end), else None."""
    if first.stride() != second.stride() or first.shape[:3] != second.shape[:3] or first.dtype != second.dtype:
        return None
    if first.stride(-1) != 1 or second.data_ptr() != first.data_ptr() + first.shape[3] * first.element_size():
        return None
    columns = first.shape[3] + second.shape[3]
    if first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr():
        return None
    return first.as_strided((*first.shape[:3], columns), first.stride())


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
                            cache_batch_idx: Optional[torch.Tensor] = None,
                            cache_leftpad: Optional[torch.Tensor] = None, block_table: Optional[torch.Tensor] = None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            qv=None):
    """A decoding step: with k and v [batch, seqlen_new, nheads_k, headdim], writes them into
    k_cache and v_cache in place at positions cache_seqlens[b] + t (rotating k by rotary_cos and
    rotary_sin there), then attends q [batch, seqlen_q, nheads, headdim] to the cache's first
    cache_seqlens[b] + seqlen_new tokens (all of them without cache_seqlens).

    k_cache, v_cache: [batch_cache >= batch, capacity, nheads_k, headdim], or with block_table
    (int32 [batch, max_blocks_per_seq]) a pool of pages [num_blocks, page_block_size, nheads_k,
    headdim] (FlashAttention's paged layout, selfattn's bshd pool; any page size).
    cache_seqlens: an int, or int32 [batch]; left as it is (the caller advances it).
    cache_leftpad: int32 [batch]: sequence b's tokens start at cache_leftpad[b] (slots before it are
    padding, never read; selfattn's key_start).
    cache_batch_idx: int32 [batch]: sequence b's row of a contiguous k_cache and v_cache, which may
    have more rows than q's batch (selfattn's batch_index).
    v_cache's headdim may differ from k_cache's and q's (MLA's caches; a latent cache passes
    v_cache=k_cache[..., :512], a view, and v=k[..., :512]).
    qv [batch, seqlen_q, nheads, headdim_v] (FlashAttention-3's form of absorbed MLA; keyword only
    here, FlashAttention-2's positions kept): the scores are q . k + qv . v, q, k_cache and k the
    rotary part (64), qv, v_cache and v the latent part (512), the default scale 1 / sqrt(headdim +
    headdim_v). It runs as attention over a latent cache of rows [v | k] with query rows [qv | q]:
    in place when v_cache and k_cache are adjacent columns of one pool (v_cache = pool[..., :512],
    k_cache = pool[..., 512:], as engines keep it), else over a copy of both (correct, not fast).
    Rotary rotates q and k, as without qv.
    Returns out shaped like q with v_cache's headdim, and with return_softmax_lse=True (out,
    softmax_lse float32 [batch, nheads, seqlen_q], +inf for a row without keys). No backward:
    inputs may require grad, but a gradient asked through the output raises. See the module's doc."""
    name = "flash_attn_with_kvcache"
    if cache_batch_idx is not None and block_table is not None:
        arguments.refuse(name, "cache_batch_idx with block_table is not supported: the block table maps sequences "
                               "to pages")
    q = arguments.tensor(name, "q", q, 4)
    k_cache, v_cache = arguments.tensor(name, "k_cache", k_cache, 4), arguments.tensor(name, "v_cache", v_cache, 4)
    if qv is not None:
        qv = arguments.tensor(name, "qv", qv, 4)
        if qv.shape[:3] != q.shape[:3] or qv.shape[3] != v_cache.shape[3] or qv.dtype != q.dtype:
            arguments.invalid(name, f"qv expected q's batch, seqlen and nheads with v_cache's headdim "
                                    f"({tuple(q.shape[:3]) + (v_cache.shape[3],)}) and q's dtype, got "
                                    f"{tuple(qv.shape)} {qv.dtype}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        arguments.invalid(name, "k_cache and v_cache expected a contiguous last dimension (they are written in place)")
    if (k is None) != (v is None):
        arguments.invalid(name, "k and v expected both or neither")
    if k is not None:
        k, v = arguments.tensor(name, "k", k, 4), arguments.tensor(name, "v", v, 4)
    if (rotary_cos is None) != (rotary_sin is None):
        arguments.invalid(name, "rotary_cos and rotary_sin expected both or neither")
    if rotary_cos is not None and k is None:
        arguments.invalid(name, "rotary_cos and rotary_sin apply to the new k and q: they need k and v")
    batch, seqlen_q = q.shape[0], q.shape[1]
    seqlen_new = 0 if k is None else k.shape[1]
    if block_table is not None:
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
            arguments.invalid(name, "block_table expected an int32 tensor [batch, max_blocks_per_seq]")
        capacity = block_table.shape[1] * k_cache.shape[1]
    elif cache_batch_idx is not None:
        capacity = k_cache.shape[1]  # sequence b is the cache's row cache_batch_idx[b] (selfattn's batch_index)
    else:
        if k_cache.shape[0] < batch or v_cache.shape[0] < batch:
            arguments.invalid(name, f"k_cache and v_cache expected at least q's batch ({batch}) rows, got "
                                    f"{k_cache.shape[0]} and {v_cache.shape[0]}")
        k_cache, v_cache = k_cache[:batch], v_cache[:batch]  # views: the append still writes the caller's cache
        capacity = k_cache.shape[1]
    window = arguments.window(name, window_size)
    if cache_seqlens is None:
        if k is not None:
            arguments.invalid(name, "k and v need cache_seqlens (where to write them)")
        lengths = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        lengths = torch.full((batch,), int(cache_seqlens), dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dim() == 1 and cache_seqlens.shape[0] == batch \
            and not cache_seqlens.is_floating_point() and not cache_seqlens.is_complex():
        lengths = cache_seqlens
    else:
        arguments.invalid(name, f"cache_seqlens expected an int or an int32 tensor [batch={batch}], got "
                                f"{getattr(cache_seqlens, 'shape', cache_seqlens)!r}")
    if check_cache_capacity:
        arguments.check_capacity(name, lengths, seqlen_new, capacity, paged=block_table is not None)
    rotary = dict(rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=bool(rotary_interleaved))
    # With qv, q's rows are [qv | q]: q's rotary columns start past qv's.
    q_rotary = dict(rotary, rotary_first_dim=0 if qv is None else qv.shape[3])
    if rotary_cos is not None:
        # FlashAttention's positions are the cache's slots, cache_leftpad or not (its kernel adds the
        # left padding back into the rotary offset): the new tokens at cache_seqlens + t; q's rows
        # there + i, or all there (q_rows_step).
        first = lengths.to(torch.int32)
        rotary.update(rotary_positions=first)
        q_rotary.update(rotary_positions=first,
                        rotary_position_step=arguments.q_rows_step(seqlen_q, causal, window, alibi_slopes, capacity))
    masks = dict(causal="bottom_right" if causal else None, scale=arguments.scale(name, softmax_scale), window=window,
                 softcap=arguments.softcap(name, softcap), alibi_slopes=alibi_slopes)

    # FlashAttention-3's absorbed MLA (qv) runs as a latent cache of rows [v | k], in place where the
    # two caches are adjacent columns of one pool; the new tokens then go in as rows [v | k] too.
    latent = None if qv is None else _adjacent_columns(v_cache, k_cache)

    def step():
        with arguments.runtime_errors(name):
            seen = lengths
            if k is not None and latent is not None:
                rows = torch.cat([v, k], dim=-1)
                seen = selfattn.append_kv(latent, latent[..., :qv.shape[3]], lengths, rows, rows[..., :qv.shape[3]],
                                          block_table=block_table, batch_index=cache_batch_idx, layout="bshd",
                                          return_lengths=True, **rotary, rotary_first_dim=qv.shape[3])
            elif k is not None:
                seen = selfattn.append_kv(k_cache, v_cache, lengths, k, v, block_table=block_table,
                                          batch_index=cache_batch_idx, layout="bshd", return_lengths=True, **rotary)
            query, keys, values = q, k_cache, v_cache
            if qv is not None:  # query rows [qv | q]
                query = torch.cat([qv, q], dim=-1)
                keys = latent if latent is not None else torch.cat([v_cache, k_cache], dim=-1)
                values = keys[..., :v_cache.shape[3]]
            return selfattn.attention_with_kv_cache(
                query, keys, values, seen, block_table=block_table, batch_index=cache_batch_idx, layout="bshd",
                return_lse=bool(return_softmax_lse), num_splits=num_splits, key_start=cache_leftpad, **masks,
                **q_rotary)

    result = arguments.forward_only(name, step, (q, k, v, k_cache, v_cache, qv))
    if not return_softmax_lse:
        return result
    out, lse = result
    return out, arguments.flash_lse(lse)
