"""Inference over a KV cache (selfattn/kv_cache.h has the exact rules): append_kv writes new tokens'
K and V into a cache the caller owns, attention_with_kv_cache attends a few new query rows per
sequence to it, merge_states combines attention results over disjoint key sets, and
cu_seqlens_from_lengths turns per-sequence lengths into varlen offsets on the device.

The cache is either contiguous, k_cache and v_cache [batch, kv_heads, capacity, head_dim]
(layout="bhsd") or [batch, capacity, kv_heads, head_dim] (layout="bshd"), or a pool of pages,
[num_pages, kv_heads, page_size, head_dim] or [num_pages, page_size, kv_heads, head_dim], with
block_table (int32 [batch, max_pages_per_seq]) mapping sequence b's token t to page
block_table[b, t // page_size], row t % page_size. A contiguous cache may have more rows than
sequences: batch_index (int32 [batch], FlashAttention's cache_batch_idx) names sequence b's row.
lengths (int32 [batch]) holds each sequence's number of valid tokens. Wrong lengths, page indices
or rows give wrong numbers, never an access outside the arrays given (validate_metadata=True checks
them first, reading them back to the host).

A serving engine's step, where each sequence has its own number of new rows (prefill chunks beside
single-token decodes, continuous batching), is one packed call: cu_seqlens_q= (attention) or
cu_seqlens_new= (append_kv), int32 [batch + 1] starting at 0, with q / k_new / v_new packed
[total, heads, head_dim] as attention_varlen() takes them (sequence b owns rows [cu[b], cu[b+1]),
0 allowed); max_seqlen_q / max_seqlen_new bound each sequence's rows (computed from the offsets
when not given: for CUDA tensors that waits for the GPU, and torch.compile cannot trace it).
Which metadata of a packed call is checked where (InvalidArgument naming the argument and the
entry, e.g. "cu_seqlens_q[3] = 24 runs past q's 16 rows (sequence 2: rows [16, 24))", before
anything is written):
- on the host (NumPy arrays, lists, CPU torch tensors): here, on every path, for free
  (_kv_metadata.py): the offsets (entry 0 is 0, non-decreasing, none past the packed rows, each
  step at most max_seqlen when given), lengths (each in [0, capacity]) and, for attention over a
  paged cache, the block_table entries that hold each sequence's cached tokens;
- on a CUDA device: not read (no sync, graph-safe): the kernels clamp them (offsets read in
  order, each into [0, total], each sequence cut to max_seqlen rows; a length into [0, capacity]),
  except that attention's naive and cublas paths read cu_seqlens_q back and refuse bad entries;
  validate_metadata=True checks every entry in the library (synchronously), its message saying
  what the kernels would have clamped. Dense calls keep the clamp for host metadata too.
Rows of q no sequence owns are not read; in out they are 0 and in lse -inf where the call
allocates them, and kept as they were in a caller's out=.

FP8 caches: k_cache and v_cache of torch.float8_e4m3fn or torch.float8_e5m2 (NumPy: ml_dtypes'
float8_e4m3fn / float8_e5m2; OCP FP8, both of one format) store each value divided by a float32
dequantization scale, real value = stored x scale (vLLM's and FlashInfer's convention), given as
k_scale= and v_scale= to both calls: a float (per tensor), or a 1-D array/tensor of 1 or kv_heads
entries (per kv head, head h's at [h]); a per-tensor one beside a per-head one is broadcast. An FP8
cache needs both (the library requires them); a 16-bit or float32 cache refuses them. Scales given
as host values (floats, NumPy arrays, CPU tensors) must be finite and > 0 (InvalidArgument naming
the scale and the entry); CUDA tensors are read on the device, unchecked, as the library reads them.
append_kv takes k_new / v_new in float32, float16 or bfloat16 and quantizes them (after rotary): in
fp32, value / scale rounded to nearest even, saturated to the format's finite range (+-448 e4m3,
+-57344 e5m2), NaN kept. attention_with_kv_cache takes q (and returns out) in float32, float16 or
bfloat16 and attends to stored x scale. kv_cache.h says which kernels do it.

K and V rows may differ in length: v_cache's head_dim (head_dim_v, out's) beside k_cache's (q's),
as MLA's expanded caches have them (192 and 128). A latent cache (DeepSeek's absorbed MLA) keeps
one pool whose rows are [c_kv | k_rope] and V as its leading columns: pass v_cache=k_cache[..., :512]
(a view, no copy; the library reads it as V), and to append_kv v_new=k_new[..., :512] (K's rows
are written whole, V's among them). The split-KV kernels (the fused path) take head dims up to 256;
automatic runs larger ones, DeepSeek's (576, 512), on the naive or cublas path.

Rotary embedding uses the caller's tables, rotary_cos and rotary_sin, [max_position, rotary_dim / 2]
in float32, or float16/bfloat16 (read as they are, no copy per call; NumPy: float16): rotary_dim
elements of each row are rotated, from rotary_first_dim on (0: the first ones; MLA's rope part
after its 512 latent values: 512), in pairs (2i, 2i+1) with rotary_interleaved=True (GPT-J),
(i, i + rotary_dim / 2) otherwise (GPT-NeoX), counted from there.

These calls record no autograd graph: torch tensors that require grad are refused (NotAvailable).
On torch tensors append_kv, attention_with_kv_cache and merge_states go through custom ops (see
_torch.py; with out= the out variants attention_with_kv_cache_out and merge_states_out, which write
the caller's out in place), so torch.compile traces a decode step whole, preallocated outputs
included.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _arrays, _selfattn
from ._calls import (_check_keywords, _context_for, _float32_or_none, _float_or_none, _int32_or_none, _packed,
                     _score_mods, _torch_requiring_grad, _window_sides, torch_ops)
from ._kv_metadata import cache_metadata, check_packed, packed_rows
from ._kv_scales import cache_scales, op_scales
from ._messages import PACKED, in_caller_terms, layout_axes
from ._selfattn import Context, InvalidArgument, NotAvailable


def append_kv(k_cache: Any, v_cache: Any, lengths: Any, k_new: Any, v_new: Any, *, block_table: Any = None,
              batch_index: Any = None, layout: str = "bhsd", rotary_cos: Any = None, rotary_sin: Any = None,
              rotary_interleaved: bool = False, rotary_positions: Any = None, rotary_position_step: int = 1,
              rotary_first_dim: int = 0, return_lengths: bool = False, validate_metadata: bool = False,
              cu_seqlens_new: Any = None,
              max_seqlen_new: Optional[int] = None, k_scale: Any = None, v_scale: Any = None,
              context: Optional[Context] = None) -> Any:
    """Writes token t of k_new and v_new at position lengths[b] + t of sequence b, in place, across
    page boundaries; lengths itself is not changed.

    - k_cache, v_cache: the cache (see the module's doc), written in place
    - lengths: int32 [batch] (any integer sequence is converted)
    - batch_index: int32 [batch], a contiguous cache's row of each sequence (None: row b); a row
      outside the cache drops the sequence's tokens
    - k_new, v_new: [batch, kv_heads, seq_new, head_dim] (layout="bshd": [batch, seq_new, kv_heads,
      head_dim]), the cache's dtype, k_new with k_cache's head_dim and v_new with v_cache's; they must
      not overlap the cache. A latent cache (v_cache a view of k_cache's leading columns) takes
      v_new as the same view of k_new (K's rows are written whole)
    - rotary_cos, rotary_sin: rotate k_new on the way in (v is never rotated), token t of sequence b
      at position lengths[b] + t, or with rotary_positions (int32 [batch]) at rotary_positions[b] +
      rotary_position_step * t (step 1, or 0: every token at rotary_positions[b]; left padding:
      positions counted from the first real token, lengths[b] - key_start[b]); rotary_first_dim:
      the first rotated element of each row (0, or the latent width of MLA's [c_kv | k_rope] rows)
    - cu_seqlens_new: int32 [batch + 1]: a packed call, k_new and v_new [total_new, kv_heads,
      head_dim] with sequence b's tokens at rows [cu_seqlens_new[b], cu_seqlens_new[b+1]), its own
      count n_b (0 allowed; max_seqlen_new bounds them); seq_new is then n_b. Host offsets and
      lengths are checked, device ones clamped (see the module's doc); rows no sequence owns are
      not read
    - k_scale, v_scale: an FP8 cache's dequantization scales (see the module's doc); k_new and v_new
      are then float32, float16 or bfloat16 (the two alike), quantized on the way in
    - returns None, or with return_lengths=True a new int32 [batch] array of
      min(lengths[b] + seq_new, capacity): the lengths for the next attention call.

    Tokens that would land past the capacity, or in a page outside the pool, are dropped.
    """
    _check_keywords(None, layout, "auto")
    _refuse_gradients("append_kv", k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new, rotary_cos=rotary_cos,
                      rotary_sin=rotary_sin, k_scale=k_scale, v_scale=v_scale)
    op = _torch_kv_op("append_kv", (k_cache, v_cache, k_new, v_new), context)
    if op is not None:
        check_packed("append_kv", "new", cu_seqlens_new, max_seqlen_new, k_new, k_cache, layout, lengths, block_table,
                     before_op=True)
        cos, sin, positions = _rotary_tables(rotary_cos, rotary_sin, k_new, rotary_positions)
        updated = op(k_cache, v_cache, *cache_metadata(lengths, block_table, k_new, batch_index), k_new, v_new,
                     layout, cos, sin, bool(rotary_interleaved), positions, _step(rotary_position_step),
                     bool(validate_metadata), *packed_rows("append_kv", "new", cu_seqlens_new, max_seqlen_new, k_new),
                     *op_scales(k_scale, v_scale, k_new), _first_dim(rotary_first_dim))
        return updated if return_lengths else None
    return _append_kv(k_cache, v_cache, lengths, k_new, v_new, block_table=block_table, layout=layout,
                      rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
                      return_lengths=return_lengths, validate_metadata=validate_metadata, context=context,
                      batch_index=batch_index, rotary_positions=rotary_positions,
                      rotary_position_step=rotary_position_step, cu_seqlens_new=cu_seqlens_new,
                      max_seqlen_new=max_seqlen_new, k_scale=k_scale, v_scale=v_scale,
                      rotary_first_dim=rotary_first_dim)


def _append_kv(k_cache, v_cache, lengths, k_new, v_new, *, block_table, layout, rotary_cos, rotary_sin,
               rotary_interleaved, return_lengths, validate_metadata, context, batch_index=None,
               rotary_positions=None, rotary_position_step=1, cu_seqlens_new=None, max_seqlen_new=None, k_scale=None,
               v_scale=None, rotary_first_dim=0):
    """append_kv() without the torch.library dispatch (the custom op's implementation calls this)."""
    packed = cu_seqlens_new is not None
    arrays = _arrays.Arguments(dict(k_new=k_new, v_new=v_new), ndim=3 if packed else 4)
    arrays.add_output("k_cache", k_cache)
    arrays.add_output("v_cache", v_cache)
    arrays.expect_ndim("k_cache", 4)
    arrays.expect_ndim("v_cache", 4)
    like = arrays["k_new"]
    ctx = _context_for(like, context)
    check_packed("append_kv", "new", cu_seqlens_new, max_seqlen_new, like, k_cache, layout, lengths, block_table)
    metadata = cache_metadata(lengths, block_table, like, batch_index)
    cos, sin, positions = _rotary_tables(rotary_cos, rotary_sin, like, rotary_positions)
    offsets, max_seqlen = packed_rows("append_kv", "new", cu_seqlens_new, max_seqlen_new, like)
    updated = None
    if return_lengths:
        updated = _arrays.empty_like(like, (metadata[0].shape[0],), "int32")
    as_bhsd = _arrays.layout_view(layout)
    new_view = _packed if packed else as_bhsd
    scales = cache_scales(arrays, as_bhsd, k_scale, v_scale)
    with _cache_terms(("k_new", "v_new"), layout, block_table, packed, batch_index):
        _selfattn.append_kv(ctx, arrays.dl(as_bhsd(arrays["k_cache"])), arrays.dl(as_bhsd(arrays["v_cache"])),
                            *metadata, arrays.dl(new_view(arrays["k_new"])), arrays.dl(new_view(arrays["v_new"])), cos,
                            sin, bool(rotary_interleaved), positions, _step(rotary_position_step), updated,
                            bool(validate_metadata), offsets, max_seqlen, arrays.bf16_as_uint16, arrays.fp8, *scales,
                            _first_dim(rotary_first_dim))
    return updated


def attention_with_kv_cache(q: Any, k_cache: Any, v_cache: Any, lengths: Any, *, block_table: Any = None,
                            batch_index: Any = None, layout: str = "bhsd", causal: Optional[str] = "bottom_right",
                            scale: Optional[float] = None, path: str = "auto", return_lse: bool = False,
                            out: Any = None, rotary_cos: Any = None, rotary_sin: Any = None,
                            rotary_interleaved: bool = False, rotary_positions: Any = None,
                            rotary_position_step: int = 1, rotary_first_dim: int = 0, num_splits: int = 0,
                            window: Optional[tuple] = None,
                            softcap: Optional[float] = None, alibi_slopes: Any = None, bias: Any = None,
                            sinks: Any = None, key_start: Any = None, q_offset: Any = None,
                            validate_metadata: bool = False, cu_seqlens_q: Any = None,
                            max_seqlen_q: Optional[int] = None, k_scale: Any = None, v_scale: Any = None,
                            context: Optional[Context] = None) -> Any:
    """Attention of the new query rows of each sequence to its cached tokens (append them first).

    - q: [batch, heads, seq_q, head_dim] (layout="bshd": [batch, seq_q, heads, head_dim]), the
      cache's dtype and k_cache's head_dim; heads a multiple of the cache's kv_heads
    - k_cache, v_cache, lengths, block_table, batch_index: the cache (see the module's doc), read only
    - causal: "bottom_right" (row i of sequence b sees cache tokens j <= lengths[b] - seq_q + i, its
      own position) or None (every cached token); "top_left" has no meaning against a cache
    - rotary_cos, rotary_sin: rotate q, row i at position lengths[b] - seq_q + i (the cache is read as
      it is), or with rotary_positions (int32 [batch]) at rotary_positions[b] + rotary_position_step * i
      (0: every row at rotary_positions[b], FlashAttention's q without a causal mask or window);
      rotary_first_dim: the first rotated element of each row (MLA's rope part: the latent width)
    - num_splits: the fused path's split of each sequence's keys over blocks (flash-decoding),
      0..4096; 0 lets the library choose
    - window, softcap, alibi_slopes, sinks: as for attention(), row i placed at lengths[b] - seq_q + i;
      bias: [batch or 1, heads or 1, seq_q, capacity], keys indexed by cache position
    - key_start: int32 [batch]: sequence b's cache tokens before key_start[b] are padding (left
      padding, FlashAttention's cache_leftpad), never read; positions count from it
    - q_offset: int32 [batch]: new row 0's position counted from key_start[b], instead of
      lengths[b] - key_start[b] - seq_q: row i sees the tokens at positions <= q_offset[b] + i, and
      the window and ALiBi measure from there (neither moves the rotary positions)
    - out: an array of q's rows with v_cache's head_dim to write into and return, as for
      attention() (a torch out goes through ``selfattn::attention_with_kv_cache_out``, in place, and
      torch.compile traces it)
    - cu_seqlens_q: int32 [batch + 1]: a packed call (see the module's doc), q and out
      [total_q, heads, head_dim] (whatever the cache's layout) with sequence b's rows at
      [cu_seqlens_q[b], cu_seqlens_q[b+1]), its own count n_b, placed at lengths[b] - n_b + i; seq_q is
      then n_b, bias [batch or 1, heads or 1, max_seqlen_q, capacity] and lse [heads, total_q]. The
      fused path serves every sequence in one launch (graph-safe once warm); naive and cublas read
      cu_seqlens_q back. Host metadata is checked on every path, device metadata clamped (see the
      module's doc). Rows no sequence owns: 0 in an out this call allocates (lse -inf there); a
      caller's out= keeps them as they were.
    - k_scale, v_scale: an FP8 cache's dequantization scales (see the module's doc); q and out are
      then float32, float16 or bfloat16
    - validate_metadata: read lengths, block_table, batch_index (and cu_seqlens_q) back and check
      them in the library first (synchronous, not graph-safe), rather than have the kernels clamp them
    - returns out (q's rows, v_cache's head_dim), and with return_lse=True lse: float32 [batch,
      heads, seq_q] (-inf for a row without keys, or sinks[h] with sinks; a sequence of length 0
      gives rows of 0).
    """
    _check_keywords(causal, layout, path)
    _refuse_gradients("attention_with_kv_cache", q=q, k_cache=k_cache, v_cache=v_cache, alibi_slopes=alibi_slopes,
                      bias=bias, sinks=sinks, rotary_cos=rotary_cos, rotary_sin=rotary_sin, out=out, k_scale=k_scale,
                      v_scale=v_scale)
    _check_num_splits(num_splits)
    op = None
    if bias is None or _arrays.is_torch(bias):
        op = _torch_kv_op("attention_with_kv_cache", (q, k_cache, v_cache), context, out)
    if op is not None:
        check_packed("attention_with_kv_cache", "q", cu_seqlens_q, max_seqlen_q, q, k_cache, layout, lengths,
                     block_table, before_op=True)
        cos, sin, positions = _rotary_tables(rotary_cos, rotary_sin, q, rotary_positions)
        options = (layout, causal, _float_or_none("scale", scale), path, cos, sin, bool(rotary_interleaved), positions,
                   _step(rotary_position_step), num_splits,
                   *_window_sides(window), _float_or_none("softcap", softcap),
                   _float32_or_none("alibi_slopes", alibi_slopes, q), bias, _int32_or_none("key_start", key_start, q),
                   _int32_or_none("q_offset", q_offset, q), _float32_or_none("sinks", sinks, q),
                   bool(validate_metadata),
                   *packed_rows("attention_with_kv_cache", "q", cu_seqlens_q, max_seqlen_q, q))
        metadata = cache_metadata(lengths, block_table, q, batch_index)
        scales = op_scales(k_scale, v_scale, q)
        if out is None:
            result, lse = op(q, k_cache, v_cache, *metadata, *options, *scales, _first_dim(rotary_first_dim))
        else:
            result, lse = out, op(q, k_cache, v_cache, *metadata, out, *options, bool(return_lse), *scales,
                                  _first_dim(rotary_first_dim))
        return (result, lse) if return_lse else result
    return _attention_with_kv_cache(q, k_cache, v_cache, lengths, block_table=block_table, layout=layout,
                                    causal=causal, scale=scale, path=path, return_lse=return_lse, out=out,
                                    rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                    rotary_interleaved=rotary_interleaved, rotary_positions=rotary_positions,
                                    rotary_position_step=rotary_position_step, num_splits=num_splits, window=window,
                                    softcap=softcap, alibi_slopes=alibi_slopes, bias=bias, sinks=sinks,
                                    validate_metadata=validate_metadata, context=context, key_start=key_start,
                                    q_offset=q_offset, batch_index=batch_index, cu_seqlens_q=cu_seqlens_q,
                                    max_seqlen_q=max_seqlen_q, k_scale=k_scale, v_scale=v_scale,
                                    rotary_first_dim=rotary_first_dim)


def _attention_with_kv_cache(q, k_cache, v_cache, lengths, *, block_table, layout, causal, scale, path, return_lse,
                             out, rotary_cos, rotary_sin, rotary_interleaved, num_splits, window, softcap,
                             alibi_slopes, bias, sinks, validate_metadata, context, key_start=None, q_offset=None,
                             batch_index=None, rotary_positions=None, rotary_position_step=1, cu_seqlens_q=None,
                             max_seqlen_q=None, k_scale=None, v_scale=None, rotary_first_dim=0):
    """attention_with_kv_cache() without the torch.library dispatch (the custom op's implementation
    calls this)."""
    packed = cu_seqlens_q is not None
    arrays = _arrays.Arguments(dict(q=q), ndim=3 if packed else 4)
    arrays.add_input("k_cache", k_cache, 4)
    arrays.add_input("v_cache", v_cache, 4)
    q = arrays["q"]
    check_packed("attention_with_kv_cache", "q", cu_seqlens_q, max_seqlen_q, q, k_cache, layout, lengths, block_table)
    allocated = out is None
    out_shape = (*q.shape[:-1], arrays["v_cache"].shape[-1])  # q's rows, V's head dim
    ctx, out = _context_and_out(arrays, "q", out, context, ndim=3 if packed else 4, shape=out_shape)
    as_bhsd = _arrays.layout_view(layout)
    q_view = _packed if packed else as_bhsd
    bhsd_q = q_view(q)
    lse_shape = (q.shape[1], q.shape[0]) if packed else tuple(bhsd_q.shape[:3])
    lse = _arrays.empty_like(q, lse_shape, "float32") if return_lse else None
    metadata = cache_metadata(lengths, block_table, q, batch_index)
    offsets, max_seqlen = packed_rows("attention_with_kv_cache", "q", cu_seqlens_q, max_seqlen_q, q)
    cos, sin, positions = _rotary_tables(rotary_cos, rotary_sin, q, rotary_positions)
    mods = _score_mods(arrays, window, softcap, alibi_slopes, bias, sinks, key_start=key_start, q_offset=q_offset)
    scales = cache_scales(arrays, as_bhsd, k_scale, v_scale)
    if packed:  # rows no sequence owns: out 0 and lse -inf in what this call allocates
        _arrays.prefill_unowned(out if allocated else None, lse, ctx.stream)
    with _cache_terms(("q", "out"), layout, block_table, packed, batch_index):
        _selfattn.attention_with_kv_cache(ctx, arrays.dl(bhsd_q), arrays.dl(as_bhsd(arrays["k_cache"])),
                                          arrays.dl(as_bhsd(arrays["v_cache"])), *metadata,
                                          arrays.dl(q_view(arrays["out"])), causal, _float_or_none("scale", scale),
                                          path, lse, cos, sin, bool(rotary_interleaved), positions,
                                          _step(rotary_position_step), num_splits, mods,
                                          bool(validate_metadata), offsets, max_seqlen, arrays.bf16_as_uint16,
                                          arrays.fp8, *scales, _first_dim(rotary_first_dim))
    return (out, lse) if return_lse else out


def rotary_embedding(x: Any, rotary_cos: Any, rotary_sin: Any, *, positions: Any = None, position_step: int = 1,
                     interleaved: bool = False, first_dim: int = 0, layout: str = "bhsd", out: Any = None,
                     context: Optional[Context] = None) -> Any:
    """Rotary position embedding on its own (a model that rotates q and k itself): out = x with
    rotary_dim elements of each row from first_dim on rotated (the module's doc says how), row s of
    batch b at positions[b] + position_step * s (positions int32 [batch]; None: at s).

    - x: [batch, heads, seq, head_dim] (layout="bshd": [batch, seq, heads, head_dim]), float32,
      float16 or bfloat16; rotary_cos, rotary_sin: float32 [max_position, rotary_dim / 2]
    - out: an array shaped like x to write into (it must not overlap x), else a new one; returned.
    No autograd: torch tensors that require grad are refused (NotAvailable)."""
    _check_keywords(None, layout, "auto")
    _refuse_gradients("rotary_embedding", x=x, rotary_cos=rotary_cos, rotary_sin=rotary_sin, out=out)
    arrays = _arrays.Arguments(dict(x=x), ndim=4)
    x = arrays["x"]
    ctx, out = _context_and_out(arrays, "x", out, context)
    cos, sin, rows = _rotary_tables(rotary_cos, rotary_sin, x, positions)
    if cos is None:
        raise InvalidArgument("rotary_cos and rotary_sin expected arrays, got None")
    as_bhsd = _arrays.layout_view(layout)
    with in_caller_terms(dict.fromkeys(("x", "out"), layout_axes(layout))):
        _selfattn.rotary_embedding(ctx, arrays.dl(as_bhsd(x)), arrays.dl(as_bhsd(arrays["out"])), cos, sin,
                                   bool(interleaved), rows, _step(position_step), arrays.bf16_as_uint16,
                                   _first_dim(first_dim))
    return out


def merge_states(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any, *, out: Any = None, layout: str = "bhsd",
                 context: Optional[Context] = None) -> tuple:
    """Merges two attention results of the same query rows over disjoint key sets (say a shared
    prefix and each sequence's own tokens) into the result over their union.

    - out_a, out_b: [batch, heads, seq, head_dim] (layout="bshd": [batch, seq, heads, head_dim]),
      one dtype; lse_a, lse_b: their float32 [batch, heads, seq] log-sum-exps (return_lse=True)
    - out: where to write (out=out_a merges in place); a new array like out_a by default (a torch
      out goes through ``selfattn::merge_states_out``, in place, and torch.compile traces it)
    - returns (out, lse): lse the merged float32 [batch, heads, seq] (a row with both lse -inf
      gives 0 and -inf).
    """
    _check_keywords(None, layout, "auto")
    _refuse_gradients("merge_states", out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b, out=out)
    op = _torch_kv_op("merge_states", (out_a, lse_a, out_b, lse_b), context, out)
    if op is not None:
        if out is None:
            return op(out_a, lse_a, out_b, lse_b, layout)
        return out, op(out_a, lse_a, out_b, lse_b, out, layout)
    return _merge_states(out_a, lse_a, out_b, lse_b, out=out, layout=layout, context=context)


def _merge_states(out_a, lse_a, out_b, lse_b, *, out, layout, context):
    """merge_states() without the torch.library dispatch (the custom op's implementation calls this)."""
    arrays = _arrays.Arguments(dict(out_a=out_a, out_b=out_b, lse_a=lse_a, lse_b=lse_b), ndim=None)
    arrays.expect_ndim("out_a", 4)
    arrays.expect_ndim("out_b", 4)
    first = arrays["out_a"]
    ctx, out = _context_and_out(arrays, "out_a", out, context)
    as_bhsd = _arrays.layout_view(layout)
    lse = _arrays.empty_like(first, tuple(as_bhsd(first).shape[:3]), "float32")
    with in_caller_terms(dict.fromkeys(("out_a", "out_b", "out"), layout_axes(layout)), {"lse_out": "lse"}):
        _selfattn.merge_states(ctx, arrays.dl(as_bhsd(first)), arrays["lse_a"], arrays.dl(as_bhsd(arrays["out_b"])),
                               arrays["lse_b"], arrays.dl(as_bhsd(arrays["out"])), lse, arrays.bf16_as_uint16)
    return out, lse


def cu_seqlens_from_lengths(lengths: Any, *, context: Optional[Context] = None) -> Any:
    """Varlen offsets from per-sequence lengths: int32 [batch + 1] = 0, l0, l0 + l1, ..., computed
    where lengths lives (for CUDA tensors on the device, without a host read). lengths: [batch]
    integers of any type (a list, an int64 array), converted to int32 where they live."""
    # Integers of any type (a list, an int64 array or tensor) become int32 where they live.
    lengths = _arrays.int32_vector("lengths", lengths, like=lengths if hasattr(lengths, "__dlpack__") else np.empty(0))
    arrays = _arrays.Arguments(dict(lengths=lengths), ndim=1)
    lengths = arrays["lengths"]
    ctx = _context_for(lengths, context)
    cu = _arrays.empty_like(lengths, (lengths.shape[0] + 1,), "int32")
    with in_caller_terms():
        _selfattn.cu_seqlens_from_lengths(ctx, lengths, cu)
    return cu


def _context_and_out(arrays, like, out, context, ndim=4, shape=None):
    """The context a call on arrays[like] runs on, and out (a new array like it, of `shape` or its
    own, when not given), added to arrays as the output of `ndim` dimensions."""
    ctx = _context_for(arrays[like], context)
    if out is None:
        out = _arrays.empty_like(arrays[like], tuple(shape if shape is not None else arrays[like].shape))
    arrays.add_output("out", out)
    arrays.expect_ndim("out", ndim)
    return ctx, out


def _cache_terms(arrays, layout, block_table, packed=False, batch_index=None):
    """The library's messages about a KV-cache call in the caller's terms (see _messages.py): the
    cache's views in the caller's layout, `arrays` too (or packed [total, heads, head_dim]), and the
    cache's batch under the name of what it was taken from (block_table's rows for a paged pool,
    lengths' entries with a batch_index, k_cache's first axis otherwise)."""
    batch = "block_table.shape[0]" if block_table is not None else \
        "lengths.shape[0]" if batch_index is not None else "k_cache.shape[0]"
    views = dict.fromkeys(("cache.k", "cache.v"), layout_axes(layout))
    views.update(dict.fromkeys(arrays, PACKED if packed else layout_axes(layout)))
    return in_caller_terms(views, {"cache.batch": batch})


def _check_num_splits(num_splits):
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 0 <= num_splits <= 4096:
        raise InvalidArgument(f"num_splits expected an int from 0 (the library chooses) to 4096, got {num_splits!r}")


def _torch_kv_op(function, tensors, context, out=None):
    """The custom op (see _torch.py) that a call on torch tensors goes through, so torch.compile
    traces it: the op named `function`, or with out= (a torch tensor) its out variant, `function`_out.
    None for other arrays (tensors, or out), with context= (no op takes it), or where this PyTorch
    has no torch.library.custom_op."""
    if context is not None or not all(_arrays.is_torch(a) for a in tensors):
        return None
    if out is not None and not _arrays.is_torch(out):
        return None  # the direct call refuses an out of another framework, naming it
    ops = torch_ops()
    return None if ops is None else ops[function if out is None else function + "_out"]


def _rotary_tables(cos, sin, like, positions=None):
    """rotary_cos, rotary_sin (float32) and rotary_positions (int32 [batch]) where `like` lives."""
    if (cos is None) != (sin is None):
        raise InvalidArgument("rotary_cos and rotary_sin expected both or neither")
    if cos is None:
        if positions is not None:
            raise InvalidArgument("rotary_positions expected None without rotary_cos and rotary_sin")
        return None, None, None
    return _rotary_table("rotary_cos", cos, like), _rotary_table("rotary_sin", sin, like), \
        _int32_or_none("rotary_positions", positions, like)


def _rotary_table(name, table, like):
    """A rotary table where `like` lives: a float16 or bfloat16 tensor (or a float16 NumPy array)
    of like's framework as it is (the kernels read 16-bit tables, no copy per call), anything else
    converted to float32."""
    if _arrays.is_torch(like) and _arrays.is_torch(table):
        import torch
        if table.dtype in (torch.float16, torch.bfloat16) and table.device == like.device:
            return table.contiguous()
    elif isinstance(table, np.ndarray) and table.dtype == np.float16 and isinstance(like, np.ndarray):
        return np.ascontiguousarray(table)
    return _arrays.float32_array(name, table, like=like)


def _first_dim(first_dim):
    """rotary_first_dim as the library takes it (an int; its range is the library's to check)."""
    if isinstance(first_dim, bool) or not isinstance(first_dim, int):
        raise InvalidArgument(f"rotary_first_dim expected an int, got {first_dim!r}")
    return first_dim


def _step(position_step):
    """rotary_position_step as the library takes it: 1 (consecutive positions) or 0 (one per sequence)."""
    if isinstance(position_step, bool) or position_step not in (0, 1):
        raise InvalidArgument(f"rotary_position_step expected 0 or 1, got {position_step!r}")
    return int(position_step)


def _refuse_gradients(function, **named):
    wanting = _torch_requiring_grad(named)
    if wanting:
        raise NotAvailable(f"{function}: {wanting[0]} requires grad, but {function} has no backward; detach it or "
                           f"run under torch.no_grad()")
