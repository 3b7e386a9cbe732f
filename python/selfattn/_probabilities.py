"""The attention probabilities (host/src/forward/probabilities.cpp): attention_probabilities()
writes the softmax weights a call of attention() or attention_varlen() forms, for inspection and
tests (FlashAttention's S_dmask), and dropout_keep_mask() draws the keep flags of its dropout. No
torch custom op: the probabilities have no gradient, and torch tensors are read detached."""
from __future__ import annotations

import numbers
from typing import Any, Optional

import numpy as np

from . import _arrays, _selfattn
from ._calls import (_check_keywords, _context_for, _dropout, _float_or_none, _int32_or_none, _max_seqlen, _packed,
                     _score_mods)
from ._messages import PACKED, in_caller_terms, layout_axes
from ._selfattn import Context, InvalidArgument


def attention_probabilities(q: Any, k: Any, v: Any, *, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None,
                            max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                            causal: Optional[str] = None, scale: Optional[float] = None, path: str = "auto",
                            key_lengths: Any = None, layout: str = "bhsd", window: Optional[tuple] = None,
                            softcap: Optional[float] = None, alibi_slopes: Any = None, bias: Any = None,
                            sinks: Any = None, key_start: Any = None, q_offset: Any = None, dropout_p: float = 0.0,
                            dropout_seed: Optional[int] = None, dropout_offset: int = 0, generator: Any = None,
                            context: Optional[Context] = None) -> Any:
    """The softmax weights of attention(q, k, v, ...) with the same keywords (or, with
    cu_seqlens_q and cu_seqlens_k, of attention_varlen()), as a new float32 array of q's framework
    and device: probs[b, h, i, j], the weight of key j in query row i after every mask and modifier,
    exp(s_ij - lse_i); 0 for a key the row does not see (a row's weights sum to 1, or to less with
    sinks). Shape [batch, heads, seq_q, seq_k] in either layout; varlen: [batch, heads,
    max_seqlen_q, max_seqlen_k], sequence b's rows and keys counted from 0, 0 where no sequence's
    row and key are.

    With dropout (dropout_p > 0; the seed as attention() takes it: give the call's dropout_seed, or
    the one attention(..., return_dropout_seed=True) returned) a weight that dropout drops is
    negated (-P, its sign bit set; -0.0 where P is 0) and a kept one is as it is, unscaled: the
    forward's weight is P / (1 - dropout_p) where the sign bit is clear, else 0 (FlashAttention's
    S_dmask marks dropped entries the same way). Keys a row does not see are +0.

    The weights come from the naive path's kernels (path "auto" or "naive") on the call's device or
    the sim; no FP8 inputs. Cost: the naive path's Q K^T and softmax, and batch x heads x seq_q x
    seq_k floats of memory: a tool for tests and inspection, not for training.
    """
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise InvalidArgument("attention_probabilities: cu_seqlens_q and cu_seqlens_k expected both or neither")
    if varlen and layout != "bhsd":
        raise InvalidArgument(f"attention_probabilities: layout expected 'bhsd' (the default) with cu_seqlens: "
                              f"varlen arrays are [total, heads, head_dim], got {layout!r}")
    _check_keywords(causal, layout, path)
    dropout = _dropout("attention_probabilities", dropout_p, dropout_seed, dropout_offset, generator, q)
    arrays = _arrays.Arguments(dict(q=q, k=k, v=v), ndim=3 if varlen else 4)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    ctx = _context_for(q, context)
    mods = _score_mods(arrays, window, softcap, alibi_slopes, bias, sinks, key_start=key_start, q_offset=q_offset)
    lengths = _int32_or_none("key_lengths", key_lengths, q)
    options = (causal, _float_or_none("scale", scale), path, lengths, mods, arrays.bf16_as_uint16, *dropout)
    if varlen:
        cu_q = _arrays.int32_vector("cu_seqlens_q", cu_seqlens_q, like=q)
        cu_k = _arrays.int32_vector("cu_seqlens_k", cu_seqlens_k, like=q)
        max_q = _max_seqlen("attention_probabilities", max_seqlen_q, cu_q, "q", q)
        max_k = _max_seqlen("attention_probabilities", max_seqlen_k, cu_k, "k", k)
        probs = _arrays.empty_like(q, (int(cu_q.shape[0]) - 1, q.shape[1], max_q, max_k), "float32")
        views = [arrays.dl(_packed(a)) for a in (q, k, v)]
        with in_caller_terms(dict.fromkeys(("q", "k", "v"), PACKED)):
            _selfattn.attention_probabilities(ctx, *views, probs, cu_q, cu_k, max_q, max_k, *options)
        return probs
    as_bhsd = _arrays.layout_view(layout)
    bhsd_q, bhsd_k = as_bhsd(q), as_bhsd(k)
    probs = _arrays.empty_like(q, (*bhsd_q.shape[:3], bhsd_k.shape[2]), "float32")
    views = [arrays.dl(as_bhsd(a)) for a in (q, k, v)]
    with in_caller_terms(dict.fromkeys(("q", "k", "v"), layout_axes(layout))):
        _selfattn.attention_probabilities(ctx, *views, probs, None, None, 0, 0, *options)
    return probs


def dropout_keep_mask(shape: tuple, dropout_p: float, dropout_seed: int, dropout_offset: int = 0,
                      first_batch: int = 0) -> np.ndarray:
    """The keep flags of dropout for a call of shape (batch, heads, seq_q, seq_k): a NumPy bool
    array, True where attention() with this dropout_p, dropout_seed and dropout_offset keeps the
    weight P[b, h, i, j] (scaled by 1 / (1 - dropout_p)), False where it drops it; all True for
    dropout_p = 0. The library's own rule (Philox4x32-10; selfattn/attention.h), so
    attention_backward(..., dropout_seed=...) and a hand-written reference agree with it bit for
    bit. first_batch is the batch b = 0 stands for: sequence b of attention_varlen() alone is
    dropout_keep_mask((1, heads, len_q_b, len_k_b), p, seed, offset, first_batch=b)."""
    if not (isinstance(shape, (tuple, list)) and len(shape) == 4 and
            all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and 0 <= n < 2**31 for n in shape)):
        raise InvalidArgument(f"dropout_keep_mask: shape expected (batch, heads, seq_q, seq_k), ints >= 0, "
                              f"got {shape!r}")
    p, seed, offset = _dropout("dropout_keep_mask", dropout_p, dropout_seed if dropout_p else 0, dropout_offset,
                               None, None)
    if isinstance(first_batch, bool) or not isinstance(first_batch, numbers.Integral) or not 0 <= first_batch < 2**31:
        raise InvalidArgument(f"dropout_keep_mask: first_batch expected an int >= 0, got {first_batch!r}")
    batch, heads, seq_q, seq_k = (int(n) for n in shape)
    if p == 0.0:
        return np.ones((batch, heads, seq_q, seq_k), dtype=bool)
    flags = _selfattn.dropout_keep_mask(p, seed, offset, batch, heads, seq_q, seq_k, int(first_batch))
    return np.frombuffer(flags, dtype=np.uint8).reshape(batch, heads, seq_q, seq_k).astype(bool)
