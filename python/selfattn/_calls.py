"""What the package's entry points share: the checks of their keywords, the context a call runs
on (default_context), the score modifiers' arguments, which torch inputs want gradients, the way to
the torch custom ops (torch_ops), and the varlen calls' view of a packed array and max_seqlen (the
forward's and the backward's)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _arrays
from ._selfattn import Context, InvalidArgument, MaskArgs

_CAUSAL = (None, "top_left", "bottom_right")
_LAYOUTS = ("bhsd", "bshd")
_default_contexts: dict = {}
# _torch.ops, installed by the package's __init__: the call modules reach the custom ops through
# here, so that _torch (whose ops call them) is never imported by them and no import circle forms.
_torch_ops_source = None


def install_torch_ops(source) -> None:
    """Makes torch_ops() answer with source() (the package's __init__ passes _torch.ops)."""
    global _torch_ops_source
    _torch_ops_source = source


def torch_ops():
    """The torch custom ops by the public function they serve (see _torch.py), registered on first
    use; None where this PyTorch has no torch.library.custom_op, or before install_torch_ops()."""
    return None if _torch_ops_source is None else _torch_ops_source()


def default_context(backend: str = "sim", device: int = 0, stream: int = 0) -> Context:
    """The module's shared context for a backend: one for the sim, one per (CUDA device, stream).

    Calls without ``context=`` use these: host arrays the sim's, CUDA arrays the one of their device
    and the caller's current stream. Each context keeps its workspace between calls."""
    key = ("sim",) if backend == "sim" else (backend, device, stream)
    if key not in _default_contexts:
        _default_contexts[key] = Context(backend, device=device, stream=stream)
    return _default_contexts[key]


def _check_keywords(causal, layout, path):
    if not (causal is None or (isinstance(causal, str) and causal in _CAUSAL)):
        raise InvalidArgument(f"causal expected None, 'top_left' or 'bottom_right', got {causal!r}")
    if layout not in _LAYOUTS:
        raise InvalidArgument(f"layout expected 'bhsd' or 'bshd', got {layout!r}")
    if not isinstance(path, str):
        raise InvalidArgument(f"path expected 'auto', 'naive', 'cublas' or 'fused', got {path!r}")


def _context_for(first, context):
    if context is not None:
        if not isinstance(context, Context):
            raise InvalidArgument(f"context expected a selfattn.Context, got {type(context).__name__}")
        return context
    device_type, device_id = _arrays.device_of(first)
    if device_type == _arrays.CUDA:
        return default_context("cuda", device_id, _arrays.current_stream(first))
    return default_context("sim")


def _torch_requiring_grad(named):
    """The names of the torch tensors among `named` that autograd would differentiate."""
    if not any(_arrays.is_torch(a) for a in named.values()):
        return []
    import torch
    if not torch.is_grad_enabled():
        return []
    return [name for name, a in named.items() if isinstance(a, torch.Tensor) and a.requires_grad]


def _score_mods(arrays, window, softcap, alibi_slopes, bias, sinks, like="q", key_start=None, q_offset=None):
    """The compiled functions' masks and modifiers, one MaskArgs (window_left, window_right,
    softcap, alibi_slopes, bias, sinks, key_start, q_offset: the library's MaskOptions, bound once by
    the extension) that every entry point takes as `masks`. bias joins `arrays` (the framework,
    device and bfloat16 handling of the data); alibi_slopes and sinks are converted to float32 where arrays[like] lives
    (sinks join `arrays` then, detached: their gradient, if any, comes from the backward's dsinks),
    key_start and q_offset to int32 (as key_lengths is); the library checks the values (window
    sides >= -1, softcap > 0, bias dtype and shape), the binding the shapes of alibi_slopes, sinks,
    key_start and q_offset."""
    arrays.add_input("bias", bias, 4)
    arrays.add_input("sinks", _float32_or_none("sinks", sinks, arrays[like]), 1)
    return MaskArgs(*_window_sides(window), _float_or_none("softcap", softcap),
                    _float32_or_none("alibi_slopes", alibi_slopes, arrays[like]), arrays.dl(arrays["bias"]),
                    arrays["sinks"], _int32_or_none("key_start", key_start, arrays[like]),
                    _int32_or_none("q_offset", q_offset, arrays[like]))


def _int32_or_none(name, values, like):
    """values (None, an int32 array, or any sequence of integers: key_lengths, key_start, q_offset)
    as int32 where `like` lives, as _arrays.int32_vector converts them."""
    return None if values is None else _arrays.int32_vector(name, values, like=like)


def _float32_or_none(name, values, like):
    """values (None, a float32 array, or any sequence of numbers: alibi_slopes, sinks) as float32
    where `like` lives, as _arrays.float32_array converts them."""
    return None if values is None else _arrays.float32_array(name, values, like=like)


def _window_sides(window):
    """window (None, or a pair of ints) as the library's window_left, window_right (-1: unbounded)."""
    if window is None:
        return -1, -1
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and
            all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and -2**31 <= w < 2**31 for w in window)):
        raise InvalidArgument(f"window expected None or a pair (left, right) of ints that fit int32 (-1: "
                              f"unbounded on that side), got {window!r}")
    return int(window[0]), int(window[1])


_U64 = 1 << 64


def _dropout(function, dropout_p, dropout_seed, dropout_offset, generator, like):
    """The dropout options of a call as (p, seed, offset), ints in [0, 2^64) (AttentionOptions in
    selfattn/attention.h). p = 0 is no dropout, and then the seed is not drawn. Otherwise the seed
    is dropout_seed when given; else, for torch tensors, a draw from `generator` (a torch.Generator;
    torch's default CPU generator when None, so torch.manual_seed reproduces it), which advances it
    so two calls get two masks; arrays of other frameworks need dropout_seed."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise InvalidArgument(f"{function}: dropout_p expected a number in [0, 1), got {dropout_p!r}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:  # NaN fails both
        raise InvalidArgument(f"{function}: dropout_p expected a finite number in [0, 1), got {p}")
    for name, value in (("dropout_seed", dropout_seed), ("dropout_offset", dropout_offset)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                                  or not 0 <= int(value) < _U64):
            raise InvalidArgument(f"{function}: {name} expected an int in [0, 2^64), got {value!r}")
    if generator is not None and not _arrays.is_torch(like):
        raise InvalidArgument(f"{function}: generator= is for torch tensors; pass dropout_seed for other arrays")
    if p == 0.0:
        return 0.0, 0, 0
    offset = int(dropout_offset or 0)
    if dropout_seed is not None:
        return p, int(dropout_seed), offset
    if not _arrays.is_torch(like):
        raise InvalidArgument(f"{function}: dropout_p > 0 expects dropout_seed (an int) for arrays other than torch "
                              f"tensors, whose seed comes from generator=")
    import torch
    device = generator.device if generator is not None else "cpu"
    seed = int(torch.randint(0, 1 << 62, (1,), generator=generator, device=device, dtype=torch.int64).item())
    return p, seed, offset


def _op_dropout(dropout):
    """(p, seed, offset) as the torch ops take them: the ints as int64 (two's complement past 2^63),
    which _op_dropout_back undoes."""
    p, seed, offset = dropout
    return p, seed - _U64 if seed >= 1 << 63 else seed, offset - _U64 if offset >= 1 << 63 else offset


def _op_dropout_back(seed, offset):
    return seed % _U64, offset % _U64


def _float_or_none(name, value):
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{name} expected a number or None, got {value!r}") from None


def _max_seqlen(function, given, cu_seqlens, rows, packed):
    """max_seqlen_q or max_seqlen_k (rows: "q" or "k", packed: that array): as given, or the largest
    step of cu_seqlens. A derived value that the packed array cannot hold is refused here, naming
    the entry of cu_seqlens at fault: the library would name max_seqlen, which the caller never
    passed (and the fused path does not read cu_seqlens back to find the entry itself)."""
    if given is not None:
        return int(given)
    longest = _arrays.max_difference(cu_seqlens)
    total = packed.shape[0] if len(getattr(packed, "shape", ())) == 3 else None
    if total is None or 0 <= longest <= total:
        return longest
    entries = [int(e) for e in cu_seqlens.tolist()]
    for i, entry in enumerate(entries):
        if not 0 <= entry <= total or (i > 0 and entry < entries[i - 1]):
            raise InvalidArgument(f"{function}: cu_seqlens_{rows} expected non-decreasing entries in [0, "
                                  f"{rows}.shape[0] (total_{rows}) = {total}], got cu_seqlens_{rows}[{i}] = {entry} "
                                  f"(max_seqlen_{rows}, not given, would be its largest step, {longest})")
    return longest  # not reached: entries in order and in range have steps in [0, total]


def _packed(a):
    """A varlen array [total, heads, head_dim] viewed as the library's [1, heads, total, head_dim]."""
    return _arrays.swap_axes_1_2(a[None])


def _host_positive_floats(name, values, expected):
    """A host value of scale factors (a number, a sequence, a NumPy array; an FP8 cache's scales,
    FP8 inputs' descales) as a contiguous float32 NumPy array of at least one dimension, each entry
    checked to be finite and > 0. expected: what `name` takes, for the message."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{name} expected {expected}, got {type(values).__name__}") from None
    if array.dtype.kind not in "fiu":
        raise InvalidArgument(f"{name} expected {expected}, got dtype {array.dtype}")
    array = np.ascontiguousarray(np.atleast_1d(array), dtype=np.float32)
    _check_positive_floats(name, array)
    return array


def _check_positive_floats(name, values):
    """Scale factors on the host (a NumPy array, or a list of floats): each finite and > 0 (the
    library reads them on the device and checks none), else InvalidArgument naming the first entry
    that is not. A list is checked in plain Python (torch.compile traces no NumPy calls)."""
    if isinstance(values, list):
        for at, value in enumerate(values):
            if not (math.isfinite(value) and value > 0):
                raise InvalidArgument(f"{name} expected finite values > 0 (real value = stored x {name}), got "
                                      f"{name}[{at}] = {value}")
        return
    array = np.asarray(values, dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(array) & (array > 0)))
    if bad.size:
        at = np.unravel_index(int(bad[0]), array.shape) if array.ndim else ()
        index = ", ".join(str(int(i)) for i in at)
        raise InvalidArgument(f"{name} expected finite values > 0 (real value = stored x {name}), got "
                              f"{name}[{index}] = {float(array.reshape(-1)[bad[0]])}")
