"""The forward calls (host/src/attention.cpp and self_attention.cpp): attention(),
attention_varlen() for packed sequences of different lengths, and self_attention() from token
embeddings, on any DLPack arrays. On torch tensors attention() and attention_varlen() go through the
custom ops (_torch.py, reached through _calls.torch_ops(); with out= their out variants), whose
implementations call _attention() and _attention_varlen() here; the package's __init__ documents the
calls as a whole."""
from __future__ import annotations

from typing import Any, Optional

from . import _arrays, _selfattn
from ._calls import (_check_keywords, _context_for, _dropout, _float32_or_none, _float_or_none, _int32_or_none,
                     _max_seqlen, _op_dropout, _packed, _score_mods, _torch_requiring_grad, _window_sides, torch_ops)
from ._fp8_inputs import _descale_shape, _descales, _fp8_forward, _fp8_out_dtype, _op_fp8
from ._messages import BHSD, PACKED, ROWS, in_caller_terms, layout_axes
from ._selfattn import Context, InvalidArgument, NotAvailable


def attention(q: Any, k: Any, v: Any, *, causal: Optional[str] = None, scale: Optional[float] = None,
              path: str = "auto", key_lengths: Any = None, return_lse: bool = False, out: Any = None,
              layout: str = "bhsd", window: Optional[tuple] = None, softcap: Optional[float] = None,
              alibi_slopes: Any = None, bias: Any = None, sinks: Any = None, key_start: Any = None,
              q_offset: Any = None, deterministic: bool = False, dropout_p: float = 0.0,
              dropout_seed: Optional[int] = None, dropout_offset: int = 0, generator: Any = None,
              q_descale: Any = None, k_descale: Any = None, v_descale: Any = None, out_dtype: Any = None,
              context: Optional[Context] = None, return_dropout_seed: bool = False) -> Any:
    """Scaled dot-product attention, ``out = softmax(scale * q k^T + mask) v`` per (batch, head).

    Shapes (layout="bhsd"; with layout="bshd" swap the heads and seq axes of every array):

    - q: [batch, heads, seq_q, head_dim]
    - k, v: [batch, kv_heads, seq_k, head_dim]; kv_heads divides heads (grouped-query attention:
      head h reads kv head h // (heads // kv_heads))
    - returns out: [batch, heads, seq_q, head_dim], q's dtype (float32, float16 or bfloat16), and
      with ``return_lse=True`` also lse: float32 [batch, heads, seq_q], the natural log of each
      row's sum of exp(scale * q.k) (after the modifiers below) over the keys it sees, and the
      sink's exp(sinks[h]) with sinks (-inf for a row that sees no key, sinks[h] with a sink).

    causal: None; "top_left" (query i sees keys j <= i); "bottom_right" (query i sees keys
    j <= i + len_k - seq_q, the last query sees every key). len_k is the batch's key length.
    scale: defaults to 1 / sqrt(head_dim).
    path: "auto", "naive", "cublas" or "fused"; an explicit path that cannot run the call raises
    NotAvailable with the reason.
    key_lengths: int32 [batch] (any integer sequence is converted): batch b uses keys [0, n_b) only.
    out: an array shaped like q to write into (nothing else is allocated for it) and return (with
    return_lse=True: (out, lse), lse new); it must not overlap an input. head_dim's stride must be 1
    in every array; other strides are free. A torch out goes through the custom op
    ``selfattn::attention_out``, which writes it in place, so torch.compile(fullgraph=True) traces a
    call with a preallocated out too.
    context: a selfattn.Context; by default the sim's for host arrays, or the one of the CUDA
    tensors' device and the framework's current stream.

    Masks and score modifiers (any combination; selfattn/attention.h has the exact rule). For row
    i and key j the softmax takes s = scale * q_i.k_j, then softcap, then ALiBi, then bias. i' is
    row i aligned as the causal mask aligns it: i' = i under "top_left", i + len_k - seq_q under
    "bottom_right" and under None (FlashAttention's convention for windows and ALiBi).

    - window: (left, right) ints, -1 for unbounded on that side: row i sees keys
      i' - left <= j <= i' + right only (on top of the causal mask and key_lengths).
    - softcap: a number > 0: s = softcap * tanh(s / softcap) (Gemma 2's logit soft-capping).
    - alibi_slopes: float32 [heads] or [batch, heads] (host arrays: any sequence of numbers is
      converted): s -= slope * abs(i' - j).
    - bias: [batch or 1, heads or 1, seq_q, seq_k], float32 or q's dtype, added to s; -inf masks a
      key; or bool (SDPA's attn_mask: True may attend, False masks), read as bytes by the kernels,
      no float copy (a row whose every key is masked gives 0 and lse -inf). Always in that [batch,
      heads, q, k] order, whatever `layout` is; an extent of 1 or a stride of 0 broadcasts.
    - sinks: float32 [heads] (host arrays: any sequence of numbers is converted), attention sinks
      (gpt-oss): one logit per query head that joins every row's softmax as one more key whose
      value is 0, taken as it is (not scaled or modified): out_i = sum_j e^(s_ij) v_j /
      (e^(sinks[h]) + sum_j e^(s_ij)), so a row's weights sum to less than 1. A row that sees no
      key gives 0 and lse sinks[h]; -inf is a head without a sink. Their gradient:
      attention_backward(..., return_dsinks=True).
    - key_start: int32 [batch] (any integer sequence is converted): batch b's keys before
      key_start[b] are padding (left padding, FlashAttention's cache_leftpad), never seen or read,
      so they may hold anything; key positions count from it (the causal alignments, the window and
      ALiBi treat key key_start[b] as the first). With key_lengths the keys are [key_start[b], n_b).
    - q_offset: int32 [batch]: the position of query row 0 among batch b's keys, counted from
      key_start[b] (or 0): row i sits at i' = q_offset[b] + i, whatever the lengths, so under either
      causal alignment it sees the keys at positions <= i', and the window and ALiBi measure from
      there (a static cache: every slot handed over, the new rows at the positions they hold).
      Out-of-range values are clamped (key_start to [0, n_b], q_offset to >= 0); the fused kernels
      skip the key tiles either rules out. The bias stays indexed by the key's row in k.

    With torch tensors that need gradients (``loss.backward()``), call it without out= and context=
    (out= and context= record no autograd graph: inputs that require grad are refused then, with
    NotAvailable, and so is an out that requires grad); sinks train with q, k and v, alibi_slopes
    and bias get no gradient and must not require one.

    deterministic: the mode of the backward that loss.backward() runs on torch tensors through the
    custom op (see attention_backward's ``deterministic``: bitwise-identical gradients run to run; on
    the fused path dQ then comes from a second kernel instead of atomics). The forward is
    deterministic already, so it changes nothing else: a call without autograd (other arrays, out=,
    context=) accepts it and computes the same out.

    Dropout on the attention weights (FlashAttention's and SDPA's dropout_p; selfattn/attention.h
    has the exact rule): dropout_p in [0, 1); after the softmax (lse is the one before dropout) each
    weight is kept with probability 1 - dropout_p and scaled by 1 / (1 - dropout_p), else zeroed. A
    sink is never dropped. The mask is a pure function of (dropout_seed, dropout_offset, batch, head,
    row, key) (Philox4x32-10): the same seed and offset give the same mask on every path and in the
    backward. On torch tensors the seed, unless given, is drawn from ``generator`` (a
    torch.Generator; torch's default CPU generator when None, so torch.manual_seed makes it
    reproducible), which advances it: two calls get two masks; loss.backward() regenerates the
    forward's mask. Other arrays need dropout_seed (an int in [0, 2^64)). dropout_offset is
    PyTorch's philox offset: calls that share a seed get independent masks when their offsets differ
    by at least batch * heads. dropout_p=0 is no dropout. return_dropout_seed=True returns the seed
    the call used (drawn or given; 0 without dropout) after out and lse, as FlashAttention returns
    its RNG state: pass it as dropout_seed= (with the same dropout_offset) to attention_backward(),
    attention_probabilities() or dropout_keep_mask() to get this call's mask again.

    FP8 inputs (FlashAttention-3's FP8 forward; selfattn/attention.h has the rule): q, k and v all
    float8_e4m3fn or all float8_e5m2 (torch's dtypes, or ml_dtypes' for NumPy), each real value its
    stored value times a descale factor per (batch, kv head):

    - q_descale, k_descale, v_descale: float32 [batch, kv_heads] (q head h uses its kv head's entry,
      h // (heads // kv_heads)); a float fills one; None is 1. Host values (floats, NumPy arrays,
      CPU tensors) must be finite and > 0 (InvalidArgument naming the entry); CUDA tensors are read
      on the device, unchecked, as the library reads them. Refused beside 16- or 32-bit inputs.
    - out_dtype: the result's dtype, float32, float16 or bfloat16 (a name, or the framework's dtype);
      by default bfloat16 for torch tensors (FlashAttention-3's output) and float32 for NumPy
      arrays (NumPy's own type: bfloat16 there is ml_dtypes', an extra type to convert). With out=
      the result's dtype is out's (out_dtype then None or the same). Without FP8 inputs out has q's
      dtype and out_dtype must be None.
    - No backward: FP8 torch tensors that require grad (or sinks that do) are refused with
      NotAvailable, naming the argument; detach them or run under torch.no_grad().
    """
    _check_keywords(causal, layout, path)
    fp8 = _fp8_forward("attention", q, k, v, sinks, out, q_descale, k_descale, v_descale, out_dtype)
    dropout = _dropout("attention", dropout_p, dropout_seed, dropout_offset, generator, q)
    op = _torch_op("attention", (q, k, v, alibi_slopes, bias, sinks), out, context)
    if op is not None:
        lengths = _arrays.int32_vector("key_lengths", key_lengths, like=q) if key_lengths is not None else None
        options = (causal, _float_or_none("scale", scale), path, lengths, layout)
        mods = _op_mods(window, softcap, alibi_slopes, bias, key_start, q_offset, sinks, q)
        # The FP8 arguments are the ops' last (with defaults), passed only for FP8 inputs.
        extra = _op_fp8(q, _descale_shape(q, k, layout), q_descale, k_descale, v_descale, out_dtype) if fp8 else ()
        if out is None:  # deterministic goes to the backward op through the autograd formula
            result, lse = op(q, k, v, *options, bool(deterministic), *mods, *_op_dropout(dropout), *extra)
        else:
            result, lse = out, op(q, k, v, out, *options, *mods, bool(return_lse), *_op_dropout(dropout), *extra[:3])
        return _with_dropout_seed((result, lse) if return_lse else result, dropout, return_dropout_seed)
    return _with_dropout_seed(
        _attention(q, k, v, causal=causal, scale=scale, path=path, key_lengths=key_lengths, return_lse=return_lse,
                   out=out, layout=layout, context=context, window=window, softcap=softcap,
                   alibi_slopes=alibi_slopes, bias=bias, sinks=sinks, key_start=key_start, q_offset=q_offset,
                   dropout=dropout, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                   out_dtype=out_dtype), dropout, return_dropout_seed)


def _with_dropout_seed(result, dropout, wanted):
    """A call's result (out, or (out, lse)), with return_dropout_seed=True its dropout seed appended."""
    if not wanted:
        return result
    return (*result, dropout[1]) if isinstance(result, tuple) else (result, dropout[1])


def _op_mods(window, softcap, alibi_slopes, bias, key_start, q_offset, sinks, like):
    """The masks and modifiers as the attention and attention_varlen ops take them (after their
    other options): window_left, window_right, softcap, alibi_slopes, bias, key_start, q_offset,
    sinks, converted where `like` is (sinks last: the one option with a gradient)."""
    return (*_window_sides(window), _float_or_none("softcap", softcap),
            _float32_or_none("alibi_slopes", alibi_slopes, like), bias, _int32_or_none("key_start", key_start, like),
            _int32_or_none("q_offset", q_offset, like), _float32_or_none("sinks", sinks, like))


def _torch_op(function, inputs, out, context):
    """The custom op that a call of `function` ("attention" or "attention_varlen") on torch tensors
    goes through (see _torch.py): the op named `function`, or with out= (a torch tensor) its out
    variant, `function`_out. None for a call that runs the library directly: one on other arrays, or
    with context= (no op takes it). inputs: q, k, v, alibi_slopes, bias, sinks. Only the op without
    out= records an autograd graph, so elsewhere torch inputs that require grad are refused rather
    than left without a gradient; alibi_slopes and bias get none through the op either (sinks do)."""
    named = dict(zip(("q", "k", "v", "alibi_slopes", "bias", "sinks"), inputs))
    if not all(_arrays.is_torch(named[name]) for name in ("q", "k", "v")):
        return None
    wanting = _torch_requiring_grad({**named, "out": out})  # out would be overwritten outside the graph
    for name in wanting:
        if name in ("alibi_slopes", "bias"):
            raise NotAvailable(f"{function}: {name} requires grad, but selfattn computes no gradient for it; "
                               f"pass it detached")
    if any(not (a is None or _arrays.is_torch(a)) for a in (named["bias"], out)):
        return None  # the direct call refuses a bias or out of another framework, naming it
    if wanting and (out is not None or context is not None):
        raise NotAvailable(f"{function}: {wanting[0]} requires grad, but out= and context= record no autograd "
                           f"graph; call it without out= and context=, or detach the inputs")
    ops = None if context is not None else torch_ops()
    if ops is None and wanting:
        raise NotAvailable(f"{function}: {wanting[0]} requires grad, but this PyTorch has no "
                           f"torch.library.custom_op (2.4 or later is needed for gradients); call it without out= "
                           f"and context=, or detach the inputs")
    return None if ops is None else ops[function if out is None else function + "_out"]


def _qkv_out(q, k, v, out, ndim, context, out_dtype=None):
    """The checked arrays, the context they run on, and out (allocated like q with v's head dim -
    the last axis, v's own where it differs from q's and k's - when not given; of out_dtype's name
    when given: FP8 inputs)."""
    arrays = _arrays.Arguments(dict(q=q, k=k, v=v, out=out), ndim=ndim)
    ctx = _context_for(arrays["q"], context)
    if out is None:
        shape = (*arrays["q"].shape[:-1], arrays["v"].shape[-1])
        out = _arrays.empty_like(arrays["q"], tuple(shape), out_dtype)
        arrays.add_output("out", out)
    return arrays, ctx, out


def _attention(q, k, v, *, causal, scale, path, key_lengths, return_lse, out, layout, context, window=None,
               softcap=None, alibi_slopes=None, bias=None, sinks=None, key_start=None, q_offset=None,
               dropout=(0.0, 0, 0), q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
    """attention() without the torch.library dispatch (the custom op's implementation calls this);
    dropout: (p, seed, offset) as _dropout() gives them."""
    fp8 = _fp8_forward("attention", q, k, v, sinks, out, q_descale, k_descale, v_descale, out_dtype)
    out_dtype = _fp8_out_dtype(q, out_dtype) if fp8 else None
    arrays, ctx, out = _qkv_out(q, k, v, out, 4, context, out_dtype)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    descales = _descales(arrays, _descale_shape(q, k, layout), q_descale, k_descale, v_descale)
    as_bhsd = _arrays.layout_view(layout)
    bhsd_q = as_bhsd(q)
    lse = _arrays.empty_like(q, tuple(bhsd_q.shape[:3]), "float32") if return_lse else None
    lengths = _arrays.int32_vector("key_lengths", key_lengths, like=q) if key_lengths is not None else None
    mods = _score_mods(arrays, window, softcap, alibi_slopes, bias, sinks, key_start=key_start, q_offset=q_offset)
    views = [arrays.dl(as_bhsd(a)) for a in (q, k, v, arrays["out"])]
    with in_caller_terms(dict.fromkeys(("q", "k", "v", "out"), layout_axes(layout))):
        _selfattn.attention(ctx, *views, causal, _float_or_none("scale", scale), path, lengths, lse, mods,
                            arrays.bf16_as_uint16, *dropout, arrays.fp8, *descales)
    return (out, lse) if return_lse else out


def attention_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *,
                     max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                     causal: Optional[str] = None, scale: Optional[float] = None, path: str = "auto",
                     return_lse: bool = False, out: Any = None, window: Optional[tuple] = None,
                     softcap: Optional[float] = None, alibi_slopes: Any = None, bias: Any = None,
                     sinks: Any = None, key_start: Any = None, q_offset: Any = None, key_lengths: Any = None,
                     deterministic: bool = False, dropout_p: float = 0.0, dropout_seed: Optional[int] = None,
                     dropout_offset: int = 0, generator: Any = None, q_descale: Any = None, k_descale: Any = None,
                     v_descale: Any = None, out_dtype: Any = None, context: Optional[Context] = None,
                     return_dropout_seed: bool = False) -> Any:
    """Attention over a batch of sequences of different lengths, packed without padding.

    - q: [total_q, heads, head_dim]; k, v: [total_k, kv_heads, head_dim] (the tokens of all
      sequences one after the other, FlashAttention's varlen layout)
    - cu_seqlens_q, cu_seqlens_k: int32 [batch + 1], starting at 0: sequence b owns query rows
      [cu_seqlens_q[b], cu_seqlens_q[b+1]) and key rows [cu_seqlens_k[b], cu_seqlens_k[b+1]).
    - max_seqlen_q, max_seqlen_k: bounds on the per-sequence lengths; computed from cu_seqlens
      when not given (for CUDA tensors that waits for the GPU, and torch.compile cannot trace it:
      pass them to avoid both).
    - returns out: [total_q, heads, head_dim], and with return_lse=True lse: float32 [heads, total_q].

    causal, scale, path, out, window, softcap, deterministic and context mean what they mean for
    attention() (deterministic: the backward's mode under loss.backward(), nothing else); the
    causal mask, the window and the scale apply within each sequence, rows and keys counted from
    the sequence's first. alibi_slopes: float32 [heads] or [batch, heads] (one row per sequence).
    bias: [batch or 1, heads or 1, max_seqlen_q, max_seqlen_k], sequence b's rows and keys counted
    from 0. sinks: float32 [heads], as for attention() (the rows of a sequence without keys give 0
    and lse sinks[h]). key_start, q_offset: int32 [batch], one entry per sequence, counted within
    it, as for attention(). key_lengths: int32 [batch]: sequence b uses its first key_lengths[b]
    keys only (FlashAttention's seqused_k: a batch packed with room to grow, say). On torch
    tensors it is differentiable as attention() is, sinks included; a torch out= goes through
    ``selfattn::attention_varlen_out`` (in place, traced by torch.compile, no autograd graph:
    inputs that require grad are refused with it, as with attention()). dropout_p, dropout_seed,
    dropout_offset, generator and return_dropout_seed as for attention(); the mask's batch is the
    sequence, its rows and keys counted within it. FP8 q, k, v as for attention(): q_descale,
    k_descale, v_descale float32 [batch, kv_heads], a row per sequence; out_dtype; no backward.
    """
    _check_keywords(causal, "bhsd", path)
    fp8 = _fp8_forward("attention_varlen", q, k, v, sinks, out, q_descale, k_descale, v_descale, out_dtype)
    dropout = _dropout("attention_varlen", dropout_p, dropout_seed, dropout_offset, generator, q)
    op = _torch_op("attention_varlen", (q, k, v, alibi_slopes, bias, sinks), out, context)
    if op is not None:
        cu_q = _arrays.int32_vector("cu_seqlens_q", cu_seqlens_q, like=q)
        cu_k = _arrays.int32_vector("cu_seqlens_k", cu_seqlens_k, like=q)
        options = (cu_q, cu_k, _max_seqlen("attention_varlen", max_seqlen_q, cu_q, "q", q),
                   _max_seqlen("attention_varlen", max_seqlen_k, cu_k, "k", k), causal,
                   _float_or_none("scale", scale), path, _int32_or_none("key_lengths", key_lengths, q))
        mods = _op_mods(window, softcap, alibi_slopes, bias, key_start, q_offset, sinks, q)
        extra = _op_fp8(q, _descale_shape(q, k, cu_seqlens_q=cu_q), q_descale, k_descale, v_descale,
                        out_dtype) if fp8 else ()
        if out is None:  # deterministic goes to the backward op through the autograd formula
            result, lse = op(q, k, v, *options, bool(deterministic), *mods, *_op_dropout(dropout), *extra)
        else:
            result, lse = out, op(q, k, v, out, *options, *mods, bool(return_lse), *_op_dropout(dropout), *extra[:3])
        return _with_dropout_seed((result, lse) if return_lse else result, dropout, return_dropout_seed)
    return _with_dropout_seed(
        _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                          causal=causal, scale=scale, path=path, return_lse=return_lse, out=out, window=window,
                          softcap=softcap, alibi_slopes=alibi_slopes, bias=bias, sinks=sinks, context=context,
                          key_start=key_start, q_offset=q_offset, key_lengths=key_lengths, dropout=dropout,
                          q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype),
        dropout, return_dropout_seed)


def _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k, causal, scale, path,
                      return_lse, out, window, softcap, alibi_slopes, bias, sinks, context, key_start=None,
                      q_offset=None, key_lengths=None, dropout=(0.0, 0, 0), q_descale=None, k_descale=None,
                      v_descale=None, out_dtype=None):
    """attention_varlen() without the torch.library dispatch (the custom op's implementation calls this)."""
    fp8 = _fp8_forward("attention_varlen", q, k, v, sinks, out, q_descale, k_descale, v_descale, out_dtype)
    out_dtype = _fp8_out_dtype(q, out_dtype) if fp8 else None
    arrays, ctx, result = _qkv_out(q, k, v, out, 3, context, out_dtype)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    cu_q = _arrays.int32_vector("cu_seqlens_q", cu_seqlens_q, like=q)
    cu_k = _arrays.int32_vector("cu_seqlens_k", cu_seqlens_k, like=q)
    descales = _descales(arrays, _descale_shape(q, k, cu_seqlens_q=cu_q), q_descale, k_descale, v_descale)
    lse = _arrays.empty_like(q, (q.shape[1], q.shape[0]), "float32") if return_lse else None
    mods = _score_mods(arrays, window, softcap, alibi_slopes, bias, sinks, key_start=key_start, q_offset=q_offset)
    views = [arrays.dl(_packed(a)) for a in (q, k, v, arrays["out"])]
    max_q = _max_seqlen("attention_varlen", max_seqlen_q, cu_q, "q", q)
    max_k = _max_seqlen("attention_varlen", max_seqlen_k, cu_k, "k", k)
    _arrays.prefill_unowned(None if out is not None else result, lse, ctx.stream)  # rows no sequence owns: 0, -inf
    with in_caller_terms(dict.fromkeys(("q", "k", "v", "out"), PACKED)):
        _selfattn.attention_varlen(ctx, *views, cu_q, cu_k, max_q, max_k, causal, _float_or_none("scale", scale),
                                   path, _int32_or_none("key_lengths", key_lengths, q), lse, mods,
                                   arrays.bf16_as_uint16, *dropout, arrays.fp8, *descales)
    return (result, lse) if return_lse else result


def self_attention(x: Any, wq: Any, wk: Any, wv: Any, heads: int, *, wo: Any = None, causal: Optional[str] = None,
                   scale: Optional[float] = None, path: str = "auto", key_lengths: Any = None, out: Any = None,
                   window: Optional[tuple] = None, softcap: Optional[float] = None, alibi_slopes: Any = None,
                   bias: Any = None, sinks: Any = None, key_start: Any = None, q_offset: Any = None,
                   context: Optional[Context] = None) -> Any:
    """Self-attention from token embeddings: ``Q = x wq``, ``K = x wk``, ``V = x wv``, split into
    heads, attention per head, then optionally the output projection ``wo``.

    - x: [batch, seq, d_model]
    - wq: [d_model, heads * head_dim]; wk, wv: [d_model, kv_heads * head_dim] (kv_heads follows
      from their width and must divide heads)
    - wo: optional [heads * head_dim, d_out]
    - returns out: [batch, heads, seq, head_dim] without wo; [batch, seq, d_out] with wo.

    The projections accumulate in float32 into the context's workspace. causal, scale, path,
    key_lengths, window, softcap, alibi_slopes, bias, sinks, key_start, q_offset and context mean
    what they mean for attention() (alibi_slopes [heads] or [batch, heads]; bias [batch or 1, heads or 1, seq, seq];
    sinks [heads]).

    Torch tensors that require grad (x, a weight or sinks) are projected with torch's matmul
    instead, in their dtype, and attended through attention()'s custom op, so loss.backward()
    reaches them all; that needs out= and context= left unset.
    """
    _check_keywords(causal, "bhsd", path)
    if isinstance(heads, bool) or not isinstance(heads, int):
        raise InvalidArgument(f"heads expected an int, got {heads!r}")
    wanting = _torch_requiring_grad(dict(x=x, wq=wq, wk=wk, wv=wv, wo=wo, alibi_slopes=alibi_slopes, bias=bias,
                                         sinks=sinks))
    if wanting:
        for name in ("alibi_slopes", "bias"):
            if name in wanting:
                raise NotAvailable(f"self_attention: {name} requires grad, but selfattn computes no gradient for "
                                   f"it; pass it detached")
        if out is not None or context is not None:
            raise NotAvailable(f"self_attention: {wanting[0]} requires grad, but out= and context= record no "
                               f"autograd graph; call it without them, or detach the inputs")
        return _self_attention_with_autograd(x, wq, wk, wv, heads, wo, causal=causal, scale=scale, path=path,
                                             key_lengths=key_lengths, window=window, softcap=softcap,
                                             alibi_slopes=alibi_slopes, bias=bias, sinks=sinks, key_start=key_start,
                                             q_offset=q_offset)
    arrays = _arrays.Arguments(dict(x=x, wq=wq, wk=wk, wv=wv, wo=wo), ndim=None)
    x, wq = arrays["x"], arrays["wq"]
    for name, ndim in (("x", 3), ("wq", 2), ("wk", 2), ("wv", 2), ("wo", 2)):
        arrays.expect_ndim(name, ndim)
    ctx = _context_for(x, context)
    batch, seq = x.shape[0], x.shape[1]
    if out is None:
        if wo is not None:
            shape = (batch, seq, arrays["wo"].shape[1])
        else:
            shape = (batch, max(heads, 0), seq, wq.shape[1] // heads if heads > 0 else 0)
        out = _arrays.empty_like(x, shape)
    arrays.add_output("out", out)
    arrays.expect_ndim("out", 3 if wo is not None else 4)
    out_view = arrays["out"][:, None] if wo is not None else arrays["out"]  # [batch, 1, seq, d_out] with wo
    lengths = _arrays.int32_vector("key_lengths", key_lengths, like=x) if key_lengths is not None else None
    mods = _score_mods(arrays, window, softcap, alibi_slopes, bias, sinks, like="x", key_start=key_start,
                       q_offset=q_offset)
    wo_view = arrays.dl(arrays["wo"]) if wo is not None else None
    # q, k and v in the library's messages are the call's own projections, already in its order.
    with in_caller_terms({"x": ROWS, "out": ROWS if wo is not None else BHSD}):
        _selfattn.self_attention(ctx, arrays.dl(x[:, None]), arrays.dl(wq), arrays.dl(arrays["wk"]),
                                 arrays.dl(arrays["wv"]), heads, arrays.dl(out_view), wo_view, causal,
                                 _float_or_none("scale", scale), path, lengths, mods, arrays.bf16_as_uint16)
    return out


def _self_attention_with_autograd(x, wq, wk, wv, heads, wo, **options):
    """self_attention() on torch tensors that require grad: the projections with torch's matmul
    (so autograd sees them), the attention step through attention()'s custom op."""
    for name, a, ndim in (("x", x, 3), ("wq", wq, 2), ("wk", wk, 2), ("wv", wv, 2), ("wo", wo, 2)):
        if a is None:
            continue
        if not _arrays.is_torch(a) or a.dim() != ndim:
            raise InvalidArgument(f"self_attention: {name} expected a {ndim}-D torch tensor (x or a weight requires "
                                  f"grad), got {type(a).__name__} of shape {tuple(getattr(a, 'shape', ()))}")
        if a.dtype != x.dtype or a.device != x.device:
            raise InvalidArgument(f"self_attention: {name} expected x's dtype and device ({x.dtype} on {x.device}), "
                                  f"got {a.dtype} on {a.device}")
    batch, seq, d_model = x.shape
    if heads < 1 or wq.shape[1] % heads != 0 or wq.shape[1] == 0:
        raise InvalidArgument(f"self_attention: wq.shape[1] expected a positive multiple of heads ({heads}), got "
                              f"{wq.shape[1]}")
    dim = wq.shape[1] // heads
    for name, w in (("wq", wq), ("wk", wk), ("wv", wv)):
        if w.shape[0] != d_model:
            raise InvalidArgument(f"self_attention: {name}.shape[0] expected x's d_model ({d_model}), got "
                                  f"{w.shape[0]}")
    if wk.shape[1] % dim != 0 or wv.shape != wk.shape or heads % (wk.shape[1] // dim or 1) != 0 or wk.shape[1] == 0:
        raise InvalidArgument(f"self_attention: wk and wv expected [d_model, kv_heads * {dim}] with kv_heads dividing "
                              f"heads ({heads}), got {tuple(wk.shape)} and {tuple(wv.shape)}")
    kv_heads = wk.shape[1] // dim
    if wo is not None and wo.shape[0] != heads * dim:
        raise InvalidArgument(f"self_attention: wo.shape[0] expected heads * head_dim ({heads * dim}), got "
                              f"{wo.shape[0]}")
    q = (x @ wq).view(batch, seq, heads, dim)
    k = (x @ wk).view(batch, seq, kv_heads, dim)
    v = (x @ wv).view(batch, seq, kv_heads, dim)
    attended = attention(q, k, v, layout="bshd", **options)  # [batch, seq, heads, dim]
    if wo is None:
        return attended.transpose(1, 2).contiguous()  # [batch, heads, seq, dim], as the library writes it
    return attended.reshape(batch, seq, heads * dim) @ wo
