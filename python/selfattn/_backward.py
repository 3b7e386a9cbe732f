"""The backward calls (host/src/attention_backward.cpp): attention_backward() and
attention_varlen_backward(), the gradients dq, dk, dv (and dsinks) of the forward calls of
_forward.py from their out and lse, on any DLPack arrays. On torch tensors the custom ops' autograd
formulas (_torch.py) call them."""
from __future__ import annotations

from typing import Any, Optional

from . import _arrays, _selfattn
from ._calls import (_check_keywords, _context_for, _dropout, _float_or_none, _int32_or_none, _max_seqlen, _packed,
                     _score_mods)
from ._messages import PACKED, in_caller_terms, layout_axes
from ._selfattn import Context, InvalidArgument


def attention_backward(q: Any, k: Any, v: Any, out: Any, dout: Any, lse: Any, *, causal: Optional[str] = None,
                       scale: Optional[float] = None, path: str = "auto", key_lengths: Any = None,
                       layout: str = "bhsd", deterministic: bool = False, grad_dtype: Optional[str] = None,
                       window: Optional[tuple] = None, softcap: Optional[float] = None, alibi_slopes: Any = None,
                       bias: Any = None, sinks: Any = None, key_start: Any = None, q_offset: Any = None,
                       dlse: Any = None, return_dsinks: bool = False, dropout_p: float = 0.0,
                       dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                       context: Optional[Context] = None) -> tuple:
    """The gradients of :func:`attention`: returns (dq, dk, dv) for the upstream gradient dout, or
    (dq, dk, dv, dsinks) with ``return_dsinks=True``.

    - q, k, v, and the keyword arguments causal, scale, path, key_lengths, layout, window,
      softcap, alibi_slopes, bias, sinks, key_start and q_offset: exactly as the forward call took them (no gradient is
      computed for bias or alibi_slopes)
    - out: the forward's output; lse: its float32 [batch, heads, seq_q] log-sum-exp
      (``attention(..., return_lse=True)``)
    - dout: d(loss)/d(out), shaped and typed like out
    - dlse: d(loss)/d(lse) where the loss uses lse too, float32 shaped like lse (None: 0)
    - dq is shaped like q, dk and dv like k, in q's dtype, or float32 with ``grad_dtype="float32"``
    - deterministic: bitwise-identical gradients run to run on every path (the fused path then
      computes dq in a second kernel instead of with atomics; see selfattn/backward.h)
    - return_dsinks: also return dsinks, float32 [heads], the gradient of the loss with respect to
      sinks (needs sinks): -sum over the head's rows i of exp(sinks[h] - lse_i) (D_i - dlse_i),
      D_i = sum(dout_i * out_i)
    - dropout_p, dropout_seed, dropout_offset: the forward's (the seed it used, given explicitly even
      where the forward drew it from a generator), so the backward regenerates its mask: dv takes
      the dropped weights, dP goes through the same mask and 1 / (1 - dropout_p); dsinks keeps its
      formula (the sink is never dropped)

    Rows that see no key get dq = 0; keys no row sees get dk = dv = 0.
    """
    _check_keywords(causal, layout, path)
    dropout = _backward_dropout("attention_backward", dropout_p, dropout_seed, dropout_offset, q)
    arrays, ctx, grads = _backward_arrays(q, k, v, out, dout, lse, dlse, 4, grad_dtype, context)
    q = arrays["q"]
    as_bhsd = _arrays.layout_view(layout)
    dsinks = _dsinks_output(arrays, as_bhsd(q).shape[1], sinks, return_dsinks)
    lengths = _arrays.int32_vector("key_lengths", key_lengths, like=q) if key_lengths is not None else None
    mods = _score_mods(arrays, window, softcap, alibi_slopes, bias, sinks, key_start=key_start, q_offset=q_offset)
    views = [arrays.dl(as_bhsd(arrays[name])) for name in ("q", "k", "v", "out", "dout")]
    grad_views = [arrays.dl(as_bhsd(arrays[name])) for name in ("dq", "dk", "dv")]
    with in_caller_terms(dict.fromkeys(_BACKWARD_ARRAYS, layout_axes(layout))):
        _selfattn.attention_backward(ctx, *views, arrays["lse"], *grad_views, causal, _float_or_none("scale", scale),
                                     path, lengths, mods, bool(deterministic), arrays["dlse"], dsinks,
                                     arrays.bf16_as_uint16, *dropout)
    return (*grads, dsinks) if return_dsinks else tuple(grads)


def _backward_dropout(function, dropout_p, dropout_seed, dropout_offset, like):
    """The forward's dropout options: a backward never draws a seed (it must be the forward's)."""
    if dropout_seed is None and not (isinstance(dropout_p, (int, float)) and dropout_p == 0):
        raise InvalidArgument(f"{function}: dropout_p {dropout_p!r} expects dropout_seed, the forward's seed (the "
                              f"backward regenerates the forward's mask from it)")
    return _dropout(function, dropout_p, dropout_seed, dropout_offset, None, like)


# The 4-D arrays of a backward call, which the library sees in its own axis order.
_BACKWARD_ARRAYS = ("q", "k", "v", "out", "dout", "dq", "dk", "dv")

def _backward_arrays(q, k, v, out, dout, lse, dlse, ndim, grad_dtype, context):
    """A backward call's checked arrays, the context they run on, and (dq, dk, dv) allocated like
    q, k, v (in their dtype, or float32 with grad_dtype="float32")."""
    if grad_dtype not in (None, "float32"):
        raise InvalidArgument(f"grad_dtype expected None (q's dtype) or 'float32', got {grad_dtype!r}")
    arrays = _arrays.Arguments(dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse, dlse=dlse), ndim=None)
    for name in ("q", "k", "v", "out", "dout"):
        arrays.expect_ndim(name, ndim)
    ctx = _context_for(arrays["q"], context)
    grads = [_arrays.empty_like(arrays[name], tuple(arrays[name].shape), grad_dtype) for name in ("q", "k", "v")]
    for name, grad in zip(("dq", "dk", "dv"), grads):
        arrays.add_output(name, grad)
    return arrays, ctx, grads


def _dsinks_output(arrays, heads, sinks, return_dsinks):
    """A backward call's dsinks: None, or with return_dsinks a float32 [heads] array like q's, added
    to arrays as an output (return_dsinks without sinks is refused: no sink to differentiate)."""
    if not return_dsinks:
        return None
    if sinks is None:
        raise InvalidArgument("return_dsinks=True expected sinks (the forward's sink logits, whose gradient dsinks "
                              "is), got sinks=None")
    dsinks = _arrays.empty_like(arrays["q"], (heads,), "float32")
    arrays.add_output("dsinks", dsinks)
    return dsinks


def attention_varlen_backward(q: Any, k: Any, v: Any, out: Any, dout: Any, lse: Any, cu_seqlens_q: Any,
                              cu_seqlens_k: Any, *, max_seqlen_q: Optional[int] = None,
                              max_seqlen_k: Optional[int] = None, causal: Optional[str] = None,
                              scale: Optional[float] = None, path: str = "auto", deterministic: bool = False,
                              grad_dtype: Optional[str] = None, window: Optional[tuple] = None,
                              softcap: Optional[float] = None, alibi_slopes: Any = None, bias: Any = None,
                              sinks: Any = None, key_start: Any = None, q_offset: Any = None, key_lengths: Any = None,
                              dlse: Any = None, return_dsinks: bool = False, dropout_p: float = 0.0,
                              dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                              context: Optional[Context] = None) -> tuple:
    """The gradients of :func:`attention_varlen`: returns (dq, dk, dv) for the upstream gradient dout,
    or (dq, dk, dv, dsinks) with ``return_dsinks=True``.

    - q, k, v, cu_seqlens_q, cu_seqlens_k and the keyword arguments max_seqlen_q, max_seqlen_k,
      causal, scale, path, window, softcap, alibi_slopes, bias, sinks, key_start, q_offset and
      key_lengths: exactly as the forward call took them (packed [total, heads, head_dim]; no gradient is
      computed for bias or alibi_slopes)
    - out: the forward's output; lse: its float32 [heads, total_q] log-sum-exp
      (``attention_varlen(..., return_lse=True)``)
    - dout: d(loss)/d(out), shaped and typed like out; dlse: d(loss)/d(lse), as for attention_backward
    - dq is shaped like q, dk and dv like k, in q's dtype, or float32 with ``grad_dtype="float32"``
    - deterministic, return_dsinks: as for :func:`attention_backward` (dsinks sums the rows of every
      sequence; rows outside them count for nothing)
    - dropout_p, dropout_seed, dropout_offset: the forward's, as for :func:`attention_backward`

    Rows that see no key get dq = 0; keys no row sees, and rows outside every sequence, get 0.
    """
    _check_keywords(causal, "bhsd", path)
    dropout = _backward_dropout("attention_varlen_backward", dropout_p, dropout_seed, dropout_offset, q)
    arrays, ctx, grads = _backward_arrays(q, k, v, out, dout, lse, dlse, 3, grad_dtype, context)
    q = arrays["q"]
    dsinks = _dsinks_output(arrays, q.shape[1], sinks, return_dsinks)
    cu_q = _arrays.int32_vector("cu_seqlens_q", cu_seqlens_q, like=q)
    cu_k = _arrays.int32_vector("cu_seqlens_k", cu_seqlens_k, like=q)
    mods = _score_mods(arrays, window, softcap, alibi_slopes, bias, sinks, key_start=key_start, q_offset=q_offset)
    views = [arrays.dl(_packed(arrays[name])) for name in ("q", "k", "v", "out", "dout")]
    grad_views = [arrays.dl(_packed(arrays[name])) for name in ("dq", "dk", "dv")]
    max_q = _max_seqlen("attention_varlen_backward", max_seqlen_q, cu_q, "q", q)
    max_k = _max_seqlen("attention_varlen_backward", max_seqlen_k, cu_k, "k", arrays["k"])
    with in_caller_terms(dict.fromkeys(_BACKWARD_ARRAYS, PACKED)):
        _selfattn.attention_varlen_backward(ctx, *views, arrays["lse"], *grad_views, cu_q, cu_k, max_q, max_k, causal,
                                            _float_or_none("scale", scale), path,
                                            _int32_or_none("key_lengths", key_lengths, q), mods, bool(deterministic),
                                            arrays["dlse"], dsinks, arrays.bf16_as_uint16, *dropout)
    return (*grads, dsinks) if return_dsinks else tuple(grads)
