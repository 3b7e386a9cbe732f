"""FlashAttention's Python calls over selfattn: ``flash_attn_func``, ``flash_attn_varlen_func`` and
``flash_attn_with_kvcache``, with FlashAttention's argument names, order, defaults, shapes and
conventions, on torch tensors. A project switches by changing an import::

    # from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    from selfattn.integrations.flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

CUDA tensors run on the GPU, CPU tensors on the sim (selfattn's CPU simulator). float32 is accepted
besides float16 and bfloat16.

What each argument becomes (the calls are selfattn.attention, attention_varlen, append_kv and
attention_with_kv_cache with layout="bshd", FlashAttention's [batch, seqlen, nheads, headdim]):

- causal=True: causal="bottom_right" (query i sees keys j <= i + seqlen_k - seqlen_q, as in
  FlashAttention; a query that sees no key gives a row of 0); causal=False: no causal mask.
- window_size=(left, right), -1 unbounded: window=(left, right), both aligned bottom-right as
  FlashAttention aligns them; (-1, -1): no window.
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

- softmax_lse (flash_attn_with_kvcache(..., return_softmax_lse=True)): float32 [batch, nheads,
  seqlen_q], +inf for a row that sees no key (FlashAttention's value; selfattn's own calls give
  -inf there, and this module maps it).
- Errors: everything this module raises is a :class:`FlashAttnError`, a ``RuntimeError`` (what
  FlashAttention raises), so ``except RuntimeError`` still works. Errors from selfattn's calls are
  re-raised as the subclass that is also the library's own class: :class:`FlashAttnArgumentError`
  is a ``selfattn.InvalidArgument`` (a ``ValueError``), :class:`FlashAttnNotSupported` a
  ``selfattn.NotAvailable``, and so on; the library's exception is the ``__cause__``. An error in
  ``loss.backward()`` comes from autograd and is the library's own (rare: the forward checked the
  arguments).
- The KV cache's capacity is checked on the host: cache_seqlens[b] + seqlen_new must not exceed
  it (a FlashAttnArgumentError naming cache_seqlens). That reads cache_seqlens back from the GPU;
  set ``check_cache_capacity = False`` on this module to skip the check (under torch.compile or
  CUDA graphs), and then tokens past the capacity are dropped, never written outside the cache.

Gradients: flash_attn_func and flash_attn_varlen_func are differentiable in q, k and v through
selfattn's torch custom ops (loss.backward() runs the library's backward). flash_attn_with_kvcache
has no backward, as in FlashAttention (tensors that require grad are refused).

Refused, with a FlashAttnNotSupported naming the argument (none is silently ignored):

- return_attn_probs=True: selfattn never forms the attention probabilities (S_dmask).
- cache_batch_idx with block_table (FlashAttention refuses it too).
- dropout_p > 0 in flash_attn_varlen_func with block_table (the paged KV-cache call has no dropout).

flash_attn_varlen_func with block_table (a serving engine's step: each sequence's new rows packed in
q over a paged cache, FlashAttention's paged varlen call): k and v are the page pools [num_blocks,
page_block_size, nheads_k, headdim], sequence b's keys are its first cu_seqlens_k[b + 1] -
cu_seqlens_k[b] cache tokens, and the call is selfattn.attention_with_kv_cache(cu_seqlens_q=...)
(no backward, as with flash_attn_with_kvcache; graph-safe on the fused path).

Rotary embedding follows FlashAttention's positions through selfattn's rotary_positions: new k and
v token t at (cache_seqlens - cache_leftpad) + t, q's row i there + i when the call is causal or
local and every row at cache_seqlens - cache_leftpad otherwise.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from typing import Optional, Union

import torch

import selfattn
from selfattn import BackendError, Error, InvalidArgument, NotAvailable, WorkspaceTooSmall

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "FlashAttnError",
           "FlashAttnArgumentError", "FlashAttnNotSupported", "FlashAttnOutOfMemory", "FlashAttnBackendError",
           "check_cache_capacity"]

# The KV cache's capacity is checked on the host (reading cache_seqlens back) unless this is False.
check_cache_capacity = True


class FlashAttnError(RuntimeError):
    """Every error this module raises (a RuntimeError, as FlashAttention's are)."""


class FlashAttnArgumentError(FlashAttnError, InvalidArgument):
    """An invalid argument: a RuntimeError and selfattn.InvalidArgument (a ValueError)."""


class FlashAttnNotSupported(FlashAttnError, NotAvailable):
    """An argument or combination selfattn cannot run (also selfattn.NotAvailable)."""


class FlashAttnOutOfMemory(FlashAttnError, WorkspaceTooSmall):
    """The library's workspace was too small (also selfattn.WorkspaceTooSmall, a MemoryError)."""


class FlashAttnBackendError(FlashAttnError, BackendError):
    """The backend failed (also selfattn.BackendError)."""


_AS_MODULE_ERROR = ((InvalidArgument, FlashAttnArgumentError), (NotAvailable, FlashAttnNotSupported),
                    (WorkspaceTooSmall, FlashAttnOutOfMemory), (BackendError, FlashAttnBackendError),
                    (Error, FlashAttnError))


@contextlib.contextmanager
def _runtime_errors(function):
    """selfattn's errors raised inside as this module's, naming `function` (the library's exception
    is the __cause__)."""
    try:
        yield
    except FlashAttnError:
        raise
    except Error as e:
        cls = next(ours for theirs, ours in _AS_MODULE_ERROR if isinstance(e, theirs))
        raise cls(f"{function}: {e}") from e


def _refuse(function, message):
    raise FlashAttnNotSupported(f"{function}: {message}")


def _invalid(function, message):
    raise FlashAttnArgumentError(f"{function}: {message}")


def _tensor(function, name, x, ndim):
    if not isinstance(x, torch.Tensor):
        _invalid(function, f"{name} expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        _invalid(function, f"{name} expected {ndim} dimensions, got shape {tuple(x.shape)}")
    return x if x.stride(-1) == 1 else x.contiguous()  # headdim's stride must be 1, as FlashAttention needs


def _window(function, window_size):
    """window_size as the library's window (None for (-1, -1))."""
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2 and
            all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= -1 for w in window_size)):
        _invalid(function, f"window_size expected a pair (left, right) of ints >= -1 (-1: unbounded), "
                           f"got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    return None if (left, right) == (-1, -1) else (left, right)


def _softcap(function, softcap):
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not softcap >= 0:
        _invalid(function, f"softcap expected a number >= 0 (0.0: none), got {softcap!r}")
    return None if softcap == 0 else float(softcap)


def _scale(function, softmax_scale):
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        _invalid(function, f"softmax_scale expected None or a number, got {softmax_scale!r}")
    return float(softmax_scale)


def _refuse_training_options(function, dropout_p, return_attn_probs):
    """Checks dropout_p and refuses return_attn_probs; returns dropout_p as a float. dropout_p > 0
    is attention dropout as FlashAttention applies it (selfattn.attention's dropout_p, its seed drawn
    from torch's default generator, so torch.manual_seed reproduces it; the backward regenerates
    the same mask). As in FlashAttention, the caller passes 0.0 in evaluation."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0 <= dropout_p < 1:
        _invalid(function, f"dropout_p expected a probability in [0, 1), got {dropout_p!r}")
    if return_attn_probs:
        _refuse(function, "return_attn_probs=True is not supported: selfattn never forms the attention "
                          "probabilities (S_dmask)")
    return float(dropout_p)


def _descales(q_descale, k_descale, v_descale):
    """FlashAttention-3's FP8 descales as selfattn.attention's keyword arguments (only those given)."""
    given = dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    return {name: value for name, value in given.items() if value is not None}


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, q_descale=None,
                    k_descale=None, v_descale=None):
    """Attention of q [batch, seqlen_q, nheads, headdim] to k, v [batch, seqlen_k, nheads_k,
    headdim] (nheads_k divides nheads: grouped-query attention); returns out shaped like q.
    Differentiable in q, k and v. See the module's doc for each argument and what is refused."""
    name = "flash_attn_func"
    dropout_p = _refuse_training_options(name, dropout_p, return_attn_probs)
    q, k, v = _tensor(name, "q", q, 4), _tensor(name, "k", k, 4), _tensor(name, "v", v, 4)
    options = dict(causal="bottom_right" if causal else None, scale=_scale(name, softmax_scale),
                   window=_window(name, window_size), softcap=_softcap(name, softcap), alibi_slopes=alibi_slopes,
                   deterministic=bool(deterministic), dropout_p=dropout_p,
                   **_descales(q_descale, k_descale, v_descale))
    with _runtime_errors(name):
        return selfattn.attention(q, k, v, layout="bshd", **options)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, q_descale=None,
                           k_descale=None, v_descale=None):
    """Attention over sequences packed without padding: q [total_q, nheads, headdim], k, v
    [total_k, nheads_k, headdim], cu_seqlens_q/k int32 [batch + 1] (sequence b owns rows
    [cu_seqlens[b], cu_seqlens[b + 1])); the masks align within each sequence. Returns out shaped
    like q; differentiable in q, k and v. See the module's doc."""
    name = "flash_attn_varlen_func"
    dropout_p = _refuse_training_options(name, dropout_p, return_attn_probs)
    paged = block_table is not None
    if paged and dropout_p > 0:
        _refuse(name, f"dropout_p={dropout_p} with block_table: the paged KV-cache call has no dropout (inference)")
    descales = _descales(q_descale, k_descale, v_descale)
    if paged and descales:
        _refuse(name, f"{', '.join(descales)} with block_table: an FP8 cache takes its scales through "
                      "selfattn.attention_with_kv_cache(k_scale=, v_scale=)")
    q = _tensor(name, "q", q, 3)
    k, v = _tensor(name, "k", k, 4 if paged else 3), _tensor(name, "v", v, 4 if paged else 3)
    for label, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            _invalid(name, f"{label} expected an int >= 0, got {value!r}")
    options = dict(causal="bottom_right" if causal else None, scale=_scale(name, softmax_scale),
                   window=_window(name, window_size), softcap=_softcap(name, softcap), alibi_slopes=alibi_slopes)
    with _runtime_errors(name):
        if paged:  # k, v: page pools; each sequence's key count from cu_seqlens_k, on the device
            cu_k = _tensor(name, "cu_seqlens_k", cu_seqlens_k, 1)
            lengths = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
            return selfattn.attention_with_kv_cache(q, k, v, lengths, block_table=block_table, layout="bshd",
                                                    cu_seqlens_q=cu_seqlens_q, max_seqlen_q=int(max_seqlen_q),
                                                    **options)
        return selfattn.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=int(max_seqlen_q),
                                         max_seqlen_k=int(max_seqlen_k), deterministic=bool(deterministic),
                                         dropout_p=dropout_p, **descales, **options)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
                            cache_batch_idx: Optional[torch.Tensor] = None,
                            cache_leftpad: Optional[torch.Tensor] = None, block_table: Optional[torch.Tensor] = None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
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
    Returns out shaped like q, and with return_softmax_lse=True (out, softmax_lse float32 [batch,
    nheads, seqlen_q], +inf for a row without keys). No backward. See the module's doc."""
    name = "flash_attn_with_kvcache"
    if cache_batch_idx is not None and block_table is not None:
        _refuse(name, "cache_batch_idx with block_table is not supported: the block table maps sequences to pages")
    q = _tensor(name, "q", q, 4)
    k_cache, v_cache = _tensor(name, "k_cache", k_cache, 4), _tensor(name, "v_cache", v_cache, 4)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        _invalid(name, "k_cache and v_cache expected a contiguous last dimension (they are written in place)")
    if (k is None) != (v is None):
        _invalid(name, "k and v expected both or neither")
    if k is not None:
        k, v = _tensor(name, "k", k, 4), _tensor(name, "v", v, 4)
    if (rotary_cos is None) != (rotary_sin is None):
        _invalid(name, "rotary_cos and rotary_sin expected both or neither")
    if rotary_cos is not None and k is None:
        _invalid(name, "rotary_cos and rotary_sin apply to the new k and q: they need k and v")
    batch, seqlen_q = q.shape[0], q.shape[1]
    seqlen_new = 0 if k is None else k.shape[1]
    if block_table is not None:
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
            _invalid(name, "block_table expected an int32 tensor [batch, max_blocks_per_seq]")
        capacity = block_table.shape[1] * k_cache.shape[1]
    elif cache_batch_idx is not None:
        capacity = k_cache.shape[1]  # sequence b is the cache's row cache_batch_idx[b] (selfattn's batch_index)
    else:
        if k_cache.shape[0] < batch or v_cache.shape[0] < batch:
            _invalid(name, f"k_cache and v_cache expected at least q's batch ({batch}) rows, got "
                           f"{k_cache.shape[0]} and {v_cache.shape[0]}")
        k_cache, v_cache = k_cache[:batch], v_cache[:batch]  # views: the append still writes the caller's cache
        capacity = k_cache.shape[1]
    window = _window(name, window_size)
    if cache_seqlens is None:
        if k is not None:
            _invalid(name, "k and v need cache_seqlens (where to write them)")
        lengths = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        lengths = torch.full((batch,), int(cache_seqlens), dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dim() == 1 and cache_seqlens.shape[0] == batch \
            and not cache_seqlens.is_floating_point() and not cache_seqlens.is_complex():
        lengths = cache_seqlens
    else:
        _invalid(name, f"cache_seqlens expected an int or an int32 tensor [batch={batch}], got "
                       f"{getattr(cache_seqlens, 'shape', cache_seqlens)!r}")
    if check_cache_capacity:
        _check_capacity(name, lengths, seqlen_new, capacity)
    rotary = dict(rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=bool(rotary_interleaved))
    q_rotary = dict(rotary)
    if rotary_cos is not None:
        # FlashAttention's positions, counted from the first real token: the new tokens at
        # cache_seqlens - cache_leftpad + t; q's rows there + i, or all there (_q_rows_step).
        first = lengths.to(torch.int32) if cache_leftpad is None else (lengths - cache_leftpad).to(torch.int32)
        rotary.update(rotary_positions=first)
        q_rotary.update(rotary_positions=first,
                        rotary_position_step=_q_rows_step(seqlen_q, causal, window, alibi_slopes, capacity))
    with _runtime_errors(name):
        if k is not None:
            lengths = selfattn.append_kv(k_cache, v_cache, lengths, k, v, block_table=block_table,
                                         batch_index=cache_batch_idx, layout="bshd", return_lengths=True, **rotary)
        result = selfattn.attention_with_kv_cache(
            q, k_cache, v_cache, lengths, block_table=block_table, batch_index=cache_batch_idx, layout="bshd",
            causal="bottom_right" if causal else None, scale=_scale(name, softmax_scale),
            return_lse=bool(return_softmax_lse), num_splits=num_splits, window=window,
            softcap=_softcap(name, softcap), alibi_slopes=alibi_slopes, key_start=cache_leftpad, **q_rotary)
    if not return_softmax_lse:
        return result
    out, lse = result
    return out, _flash_lse(lse)


def _flash_lse(lse):
    """selfattn's LSE in FlashAttention's convention: +inf (not -inf) for a row without keys."""
    return lse.masked_fill(lse == -math.inf, math.inf)


def _check_capacity(name, lengths, seqlen_new, capacity):
    """cache_seqlens[b] + seqlen_new <= capacity for every b, on the host (FlashAttention checks it)."""
    for b, length in enumerate(lengths.tolist()):
        if length < 0 or length + seqlen_new > capacity:
            what = f"cache_seqlens[{b}] + seqlen_new ({length} + {seqlen_new})" if seqlen_new else \
                f"cache_seqlens[{b}] ({length})"
            _invalid(name, f"{what} exceeds the KV cache's capacity ({capacity} tokens)" if length >= 0 else
                     f"cache_seqlens[{b}] expected >= 0, got {length}")


def _q_rows_step(seqlen_q, causal, window, alibi_slopes, capacity):
    """1 where FlashAttention rotates q's row i at its own position (cache_seqlens + i), 0 where it
    rotates every row at cache_seqlens. Its rule, restated: with seqlen_q == 1 and no ALiBi the
    causal mask is dropped (it changes nothing); causal sets the window's right side to 0; a side
    >= the capacity is unbounded; the rows take their own positions when a side is bounded."""
    left, right = window if window is not None else (-1, -1)
    if causal and not (seqlen_q == 1 and alibi_slopes is None):
        right = 0
    left, right = (-1 if side >= capacity else side for side in (left, right))
    return 1 if left >= 0 or right >= 0 else 0
