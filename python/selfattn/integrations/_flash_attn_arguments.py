"""What selfattn.integrations.flash_attn's calls share: its errors, FlashAttention's arguments as
selfattn's keywords (each refused by name when it cannot be one), and the conventions FlashAttention's
users rely on (the LSE's +inf, S_dmask's encoding, forward-only calls that fail only when a
gradient is asked of them). Private: flash_attn.py documents and re-exports what users see."""
from __future__ import annotations

import contextlib
import math
import numbers
import operator

import numpy as np
import torch

from selfattn import BackendError, Error, InvalidArgument, NotAvailable, WorkspaceTooSmall


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
def runtime_errors(function):
    """selfattn's errors raised inside as this module's, naming `function` (the library's exception
    is the __cause__)."""
    try:
        yield
    except FlashAttnError:
        raise
    except Error as e:
        cls = next(ours for theirs, ours in _AS_MODULE_ERROR if isinstance(e, theirs))
        raise cls(f"{function}: {e}") from e


def refuse(function, message):
    raise FlashAttnNotSupported(f"{function}: {message}")


def invalid(function, message):
    raise FlashAttnArgumentError(f"{function}: {message}")


def tensor(function, name, x, ndim):
    if not isinstance(x, torch.Tensor):
        invalid(function, f"{name} expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        invalid(function, f"{name} expected {ndim} dimensions, got shape {tuple(x.shape)}")
    return x if x.stride(-1) == 1 else x.contiguous()  # headdim's stride must be 1, as FlashAttention needs


def _integer(value):
    """value as a Python int when it is one: an int, a NumPy integer, or a one-element integer
    tensor or array (not a bool, not a float); else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if (value.size if isinstance(value, np.ndarray) else value.numel()) != 1:
            return None
        kind = value.dtype
        if isinstance(value, torch.Tensor) and (kind.is_floating_point or kind.is_complex or kind == torch.bool):
            return None
        if isinstance(value, np.ndarray) and not np.issubdtype(kind, np.integer):
            return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def window(function, window_size):
    """window_size, any two integers (a tuple or list, a tensor or array of two, FlashAttention's
    tests pass torch.randint(0, seqlen, (2,))), as the library's window (None for (-1, -1))."""
    sides = None
    if isinstance(window_size, (torch.Tensor, np.ndarray)):
        if tuple(window_size.shape) == (2,):
            sides = [_integer(window_size[i]) for i in range(2)]
    elif isinstance(window_size, (tuple, list)) and len(window_size) == 2:
        sides = [_integer(w) for w in window_size]
    if sides is None or any(w is None or not -1 <= w < 2**31 for w in sides):
        invalid(function, f"window_size expected two integers (left, right), each >= -1 (-1: unbounded): a tuple, "
                          f"list, tensor or array, got {window_size!r}")
    return None if sides == [-1, -1] else (sides[0], sides[1])


def softcap(function, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
        invalid(function, f"softcap expected a number >= 0 (0.0: none), got {value!r}")
    return None if value == 0 else float(value)


def scale(function, softmax_scale):
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        invalid(function, f"softmax_scale expected None or a number, got {softmax_scale!r}")
    return float(softmax_scale)


def dropout_p(function, value):
    """dropout_p as a float in [0, 1): attention dropout as FlashAttention applies it (its seed drawn
    from torch's default generator, so torch.manual_seed reproduces it; the backward regenerates the
    mask). As in FlashAttention, the caller passes 0.0 in evaluation."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        invalid(function, f"dropout_p expected a probability in [0, 1), got {value!r}")
    return float(value)


def draw_dropout_seed():
    """A dropout seed drawn from torch's default generator (torch.manual_seed repeats it), for a
    call whose seed must be known: S_dmask and FlashAttention's rng_state."""
    return int(torch.randint(0, 1 << 62, (1,), dtype=torch.int64).item())


def descales(q_descale, k_descale, v_descale):
    """FlashAttention-3's FP8 descales as selfattn.attention's keyword arguments (only those given)."""
    given = dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    return {name: value for name, value in given.items() if value is not None}


def flash_lse(lse):
    """selfattn's LSE in FlashAttention's convention: +inf (not -inf) for a row without keys."""
    return lse.masked_fill(lse == -math.inf, math.inf)


# The key block of S_dmask's encoding (FlashAttention's _get_block_size_n): this module encodes each
# row as one block, so the size is past any row.
S_DMASK_BLOCK = 2**31 - 1


def s_dmask(probs):
    """attention_probabilities()'s weights in FlashAttention's S_dmask encoding: each row divided by
    its largest weight (FlashAttention stores exp(s - m) with m the running maximum of the row's
    scores, one block here, so m is the row's maximum and exp(m - lse) its largest weight), signs
    kept (dropped entries negative). A row without weights stays 0."""
    largest = probs.abs().amax(dim=-1, keepdim=True)
    return torch.where(largest > 0, probs / largest.clamp_min(torch.finfo(torch.float32).tiny), probs)


class _NoBackward(torch.autograd.Function):
    """Ties a forward-only call's output to its inputs that require grad: the forward is free (a
    view), and only a gradient asked through it raises."""

    @staticmethod
    def forward(ctx, function, out, *inputs):
        ctx.function = function
        return out.view_as(out)

    @staticmethod
    def backward(ctx, *grads):
        raise FlashAttnNotSupported(f"{ctx.function}: no backward (a KV-cache call, as in FlashAttention); detach "
                                    f"its inputs or ask no gradient through its output")


def forward_only(function, run, inputs):
    """Runs `run` (a call without backward) as FlashAttention does when inputs require grad: the
    forward runs, and the output raises only if a gradient is asked through it."""
    wanting = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad] \
        if torch.is_grad_enabled() else []
    if not wanting:
        return run()
    with torch.no_grad():
        result = run()
    if isinstance(result, tuple):  # (out, lse): lse is no more differentiable than out
        return tuple(_NoBackward.apply(function, r, *wanting) for r in result)
    return _NoBackward.apply(function, result, *wanting)


def check_capacity(name, lengths, seqlen_new, capacity, paged):
    """cache_seqlens[b] + seqlen_new <= capacity for every b, on the host (FlashAttention checks it).
    A paged cache's capacity is block_table's: its columns x page_block_size."""
    where = "the block_table's pages" if paged else "the KV cache's capacity"
    for b, length in enumerate(lengths.tolist()):
        if length < 0:
            invalid(name, f"cache_seqlens[{b}] expected >= 0, got {length}")
        if length + seqlen_new > capacity:
            what = f"cache_seqlens[{b}] + seqlen_new ({length} + {seqlen_new})" if seqlen_new else \
                f"cache_seqlens[{b}] ({length})"
            invalid(name, f"{what} exceeds {where} ({capacity} tokens)" + (
                " (block_table holds max_blocks_per_seq x page_block_size tokens a sequence)" if paged else ""))


def q_rows_step(seqlen_q, causal, window_sides, alibi_slopes, capacity):
    """1 where FlashAttention rotates q's row i at its own position (cache_seqlens + i), 0 where it
    rotates every row at cache_seqlens. Its rule, restated: with seqlen_q == 1 and no ALiBi the
    causal mask is dropped (it changes nothing); causal sets the window's right side to 0; a side
    >= the capacity is unbounded; the rows take their own positions when a side is bounded."""
    left, right = window_sides if window_sides is not None else (-1, -1)
    if causal and not (seqlen_q == 1 and alibi_slopes is None):
        right = 0
    left, right = (-1 if side >= capacity else side for side in (left, right))
    return 1 if left >= 0 or right >= 0 else 0
