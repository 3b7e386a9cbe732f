"""FlashAttention-2's lower layer over selfattn: its compiled extension's four entry points
(``flash_attn_gpu.fwd``, ``varlen_fwd``, ``bwd``, ``varlen_bwd``, positional arguments in
FlashAttention's order) and the private wrappers of flash_attn_interface over them
(``_flash_attn_forward``, ``_flash_attn_varlen_forward``, ``_flash_attn_backward``,
``_flash_attn_varlen_backward``), which ring attention and other projects call to run the forward
and the backward themselves. flash_attn.py re-exports them; its doc says what each argument means.

What these calls are, as in FlashAttention: plain functions, no autograd (run under no_grad);
out, softmax_lse (+inf for a row that sees no key), S_dmask (with return_softmax, which needs
dropout) and rng_state (int64 [2]: the dropout seed the forward drew from torch's generator, and
the offset 0) from the forwards; dq, dk, dv written into the tensors passed (allocated where None)
and softmax_d, D_i = sum(dout_i * out_i) in float32, from the backwards. The backward takes the
forward's rng_state to draw the same dropout mask. softmax_d is [batch, nheads, seqlen_q]
([nheads, total_q] for varlen): FlashAttention pads its rows to a multiple of 128, which no caller
reads.

Differences, each refused by name or documented: leftpad_k in varlen_fwd is refused (use
flash_attn_with_kvcache's cache_leftpad); num_splits > 1 with block_table runs the split-KV kernel
(FlashAttention refuses it); a generator other than None is refused, as FlashAttention refuses it.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

import selfattn

from . import _flash_attn_arguments as arguments


def _no_generator(function, generator):
    if generator is not None:
        arguments.invalid(function, "the `generator` argument is no longer supported (FlashAttention's slot kept for "
                                    "positions): pass None; dropout draws its seed from torch's default generator")


def _masks(function, causal, window_size_left, window_size_right, softmax_scale, softcap, alibi_slopes):
    return dict(causal="bottom_right" if causal else None, scale=arguments.scale(function, softmax_scale),
                window=arguments.window(function, (window_size_left, window_size_right)),
                softcap=arguments.softcap(function, softcap), alibi_slopes=alibi_slopes)


def _rng_state(seed, device):
    return torch.tensor([seed, 0], dtype=torch.int64, device=device)


def _probabilities_asked(function, return_softmax, dropout_p):
    if return_softmax and dropout_p == 0:
        arguments.invalid(function, "return_softmax=True needs dropout_p > 0 (as in FlashAttention: S_dmask encodes "
                                    "the dropout mask)")
    return bool(return_softmax)


def _into(given, computed):
    """A gradient written into the tensor the caller gave (FlashAttention's dq/dk/dv), or returned."""
    if given is None:
        return computed
    given.copy_(computed)
    return given


def _selfattn_lse(softmax_lse):
    """FlashAttention's softmax_lse (+inf where a row sees no key) in selfattn's convention (-inf)."""
    return torch.where(softmax_lse == float("inf"), torch.full_like(softmax_lse, float("-inf")), softmax_lse)


def _softmax_d(dout, out):
    """D_i = sum over features of dout_i * out_i in float32, the heads before the rows ([batch,
    nheads, seqlen_q] from bshd, [nheads, total_q] from packed rows)."""
    return (dout.float() * out.float()).sum(-1).transpose(-1, -2).contiguous()


def _backward_dropout(dropout_p, rng_state):
    if dropout_p == 0:
        return dict(dropout_p=0.0)
    if rng_state is None:
        arguments.invalid("flash_attn_gpu.bwd", "dropout_p > 0 needs the forward's rng_state")
    seed, offset = (int(x) for x in rng_state.tolist())
    return dict(dropout_p=dropout_p, dropout_seed=seed, dropout_offset=offset)


def fwd(q, k, v, out, alibi_slopes, p_dropout, softmax_scale, is_causal, window_size_left, window_size_right, softcap,
        return_softmax, gen=None):
    """mha_fwd: q [batch, seqlen_q, nheads, d], k, v [batch, seqlen_k, nheads_k, d]; out (None: a new
    tensor) -> (out, softmax_lse [batch, nheads, seqlen_q], S_dmask or None, rng_state)."""
    name = "flash_attn_gpu.fwd"
    _no_generator(name, gen)
    dropout_p = arguments.dropout_p(name, p_dropout)
    q, k, v = (arguments.tensor(name, label, x, 4) for label, x in (("q", q), ("k", k), ("v", v)))
    masks = _masks(name, is_causal, window_size_left, window_size_right, softmax_scale, softcap, alibi_slopes)
    probs = _probabilities_asked(name, return_softmax, dropout_p)
    seed = arguments.draw_dropout_seed() if dropout_p > 0 else 0
    dropout = dict(dropout_p=dropout_p, dropout_seed=seed if dropout_p > 0 else None)
    with torch.no_grad(), arguments.runtime_errors(name):
        result, lse = selfattn.attention(q, k, v, layout="bshd", out=out, return_lse=True, **dropout, **masks)
        dmask = arguments.s_dmask(selfattn.attention_probabilities(q, k, v, layout="bshd", **dropout, **masks)) \
            if probs else None
    return result, arguments.flash_lse(lse), dmask, _rng_state(seed, q.device)


def varlen_fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes, max_seqlen_q,
               max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left, window_size_right,
               softcap, return_softmax, gen=None, num_splits=0):
    """mha_varlen_fwd: packed q [total_q, nheads, d] and k, v [total_k, nheads_k, d] (with
    block_table: the page pools [num_blocks, page_block_size, nheads_k, d]); seqused_k: the keys
    each sequence uses -> (out, softmax_lse [nheads, total_q], S_dmask or None, rng_state).
    zero_tensors is accepted: rows no sequence owns are 0 in an out made here either way."""
    name = "flash_attn_gpu.varlen_fwd"
    _no_generator(name, gen)
    if leftpad_k is not None:
        arguments.refuse(name, "leftpad_k: left padding of packed keys is not served here; "
                               "flash_attn_with_kvcache(cache_leftpad=) takes it for a KV cache")
    dropout_p = arguments.dropout_p(name, p_dropout)
    paged = block_table is not None
    q = arguments.tensor(name, "q", q, 3)
    k, v = arguments.tensor(name, "k", k, 4 if paged else 3), arguments.tensor(name, "v", v, 4 if paged else 3)
    masks = _masks(name, is_causal, window_size_left, window_size_right, softmax_scale, softcap, alibi_slopes)
    probs = _probabilities_asked(name, return_softmax, dropout_p)
    if paged:
        if dropout_p > 0:
            arguments.refuse(name, f"dropout_p={dropout_p} with block_table: the paged KV-cache call has no dropout")
        cu_k = arguments.tensor(name, "cu_seqlens_k", cu_seqlens_k, 1)
        lengths = seqused_k if seqused_k is not None else cu_k[1:] - cu_k[:-1]
        with torch.no_grad(), arguments.runtime_errors(name):
            result, lse = selfattn.attention_with_kv_cache(
                q, k, v, lengths.to(torch.int32), block_table=block_table, layout="bshd", out=out,
                cu_seqlens_q=cu_seqlens_q, max_seqlen_q=int(max_seqlen_q), num_splits=int(num_splits),
                return_lse=True, **masks)
        return result, arguments.flash_lse(lse), None, _rng_state(0, q.device)
    seed = arguments.draw_dropout_seed() if dropout_p > 0 else 0
    call = dict(max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k), dropout_p=dropout_p,
                dropout_seed=seed if dropout_p > 0 else None, **masks)
    with torch.no_grad(), arguments.runtime_errors(name):
        result, lse = selfattn.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, key_lengths=seqused_k, out=out,
                                                return_lse=True, **call)
        dmask = arguments.s_dmask(selfattn.attention_probabilities(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **call)) if probs else None
    return result, arguments.flash_lse(lse), dmask, _rng_state(seed, q.device)


def bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, p_dropout, softmax_scale, is_causal,
        window_size_left, window_size_right, softcap, deterministic, gen=None, rng_state=None):
    """mha_bwd: the gradients of fwd for dout, written into dq, dk, dv (None: new tensors) ->
    (dq, dk, dv, softmax_d)."""
    name = "flash_attn_gpu.bwd"
    _no_generator(name, gen)
    dropout_p = arguments.dropout_p(name, p_dropout)
    masks = _masks(name, is_causal, window_size_left, window_size_right, softmax_scale, softcap, alibi_slopes)
    with torch.no_grad(), arguments.runtime_errors(name):
        grads = selfattn.attention_backward(q, k, v, out, dout, _selfattn_lse(softmax_lse), layout="bshd",
                                            deterministic=bool(deterministic),
                                            **_backward_dropout(dropout_p, rng_state), **masks)
        dq, dk, dv = (_into(given, grad) for given, grad in zip((dq, dk, dv), grads))
        return dq, dk, dv, _softmax_d(dout, out)


def varlen_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q,
               max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left, window_size_right,
               softcap, deterministic, gen=None, rng_state=None):
    """mha_varlen_bwd: the gradients of varlen_fwd (without block_table) -> (dq, dk, dv, softmax_d)."""
    name = "flash_attn_gpu.varlen_bwd"
    _no_generator(name, gen)
    dropout_p = arguments.dropout_p(name, p_dropout)
    masks = _masks(name, is_causal, window_size_left, window_size_right, softmax_scale, softcap, alibi_slopes)
    with torch.no_grad(), arguments.runtime_errors(name):
        grads = selfattn.attention_varlen_backward(
            q, k, v, out, dout, _selfattn_lse(softmax_lse), cu_seqlens_q, cu_seqlens_k, max_seqlen_q=int(max_seqlen_q),
            max_seqlen_k=int(max_seqlen_k), deterministic=bool(deterministic),
            **_backward_dropout(dropout_p, rng_state), **masks)
        dq, dk, dv = (_into(given, grad) for given, grad in zip((dq, dk, dv), grads))
        return dq, dk, dv, _softmax_d(dout, out)


# FlashAttention's compiled extension, as flash_attn_interface names it.
flash_attn_gpu = SimpleNamespace(fwd=fwd, varlen_fwd=varlen_fwd, bwd=bwd, varlen_bwd=varlen_bwd)


def _contiguous(*tensors):
    return [x.contiguous() if x is not None and x.stride(-1) != 1 else x for x in tensors]


def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                        softcap=0.0, alibi_slopes=None, return_softmax=False):
    """flash_attn_interface._flash_attn_forward -> (out, softmax_lse, S_dmask, rng_state)."""
    q, k, v = _contiguous(q, k, v)
    return fwd(q, k, v, None, alibi_slopes, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
               softcap, return_softmax, None)


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                               alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False, num_splits=0):
    """flash_attn_interface._flash_attn_varlen_forward -> (out, softmax_lse, S_dmask, rng_state)."""
    q, k, v = _contiguous(q, k, v)
    return varlen_fwd(q, k, v, None, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
                      max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, zero_tensors, causal, window_size_left,
                      window_size_right, softcap, return_softmax, None, num_splits)


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
                         window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None):
    """flash_attn_interface._flash_attn_backward: dq, dk, dv written in place -> softmax_d."""
    dout, q, k, v, out = _contiguous(dout, q, k, v, out)
    return bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, dropout_p, softmax_scale, causal,
               window_size_left, window_size_right, softcap, deterministic, None, rng_state)[3]


def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                                softcap, alibi_slopes, deterministic, rng_state=None, zero_tensors=False):
    """flash_attn_interface._flash_attn_varlen_backward: dq, dk, dv written in place -> softmax_d."""
    dout, q, k, v, out = _contiguous(dout, q, k, v, out)
    return varlen_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                      max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, zero_tensors, causal, window_size_left,
                      window_size_right, softcap, deterministic, None, rng_state)[3]
