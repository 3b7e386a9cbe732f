"""FP8 inputs of the forward calls (host/src/forward/fp8_inputs.cpp's side in Python): the
refusals only the Python layer can make, out's dtype, and the descales as the compiled module and
the torch ops take them. _forward.py's attention() and attention_varlen() use them."""
from __future__ import annotations

import numbers

import numpy as np

from . import _arrays
from ._calls import _check_positive_floats, _host_positive_floats, _torch_requiring_grad
from ._selfattn import InvalidArgument, NotAvailable

_OUT_DTYPES = ("float32", "float16", "bfloat16")
_DESCALES_EXPECTED = "a float or a float32 array [batch, kv_heads]"


def _out_dtype_name(out_dtype):
    """out_dtype (None, a name, a torch dtype, a NumPy dtype or type) as one of _OUT_DTYPES, or None."""
    if out_dtype is None:
        return None
    if isinstance(out_dtype, str):
        name = out_dtype
    elif type(out_dtype).__module__.split(".")[0] == "torch":
        name = str(out_dtype).replace("torch.", "")
    else:
        try:
            name = np.dtype(out_dtype).name
        except TypeError:
            name = repr(out_dtype)
    if name not in _OUT_DTYPES:
        raise InvalidArgument(f"out_dtype expected None, float32, float16 or bfloat16, got {out_dtype!r}")
    return name


def _fp8_forward(function, q, k, v, sinks, out, q_descale, k_descale, v_descale, out_dtype):
    """Whether q is FP8 (the library then checks that k and v are too), after the refusals that
    only the Python layer can make: inputs that require grad (FP8 has no backward), descales or
    out_dtype without FP8 inputs, an out_dtype that contradicts out's."""
    try:
        fp8 = _arrays.fp8_format(q) is not None
    except InvalidArgument as error:
        raise InvalidArgument(f"q.{error}") from None
    name = _out_dtype_name(out_dtype)
    if not fp8:
        for what, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale),
                            ("out_dtype", out_dtype)):
            if value is not None:
                raise InvalidArgument(f"{function}: {what} expected None: q.dtype is {_arrays._dtype_name(q)}, not "
                                      f"FP8 (descales and out_dtype are for FP8 inputs)")
        return False
    wanting = _torch_requiring_grad(dict(q=q, k=k, v=v, sinks=sinks, out=out, q_descale=q_descale,
                                         k_descale=k_descale, v_descale=v_descale))
    if wanting:
        raise NotAvailable(f"{function}: {wanting[0]} requires grad, but FP8 inputs have no backward; detach them or "
                           f"run under torch.no_grad()")
    if out is not None and name is not None and _arrays._dtype_name(out) != name:
        raise InvalidArgument(f"{function}: out_dtype expected None or out.dtype ({_arrays._dtype_name(out)}), got "
                              f"{name}")
    return True


def _fp8_out_dtype(like, out_dtype):
    """The result's dtype name of an FP8 call without out=: out_dtype, else bfloat16 for torch and
    float32 for other arrays."""
    name = _out_dtype_name(out_dtype)
    if name is not None:
        return name
    return "bfloat16" if _arrays.is_torch(like) else "float32"


def _descale_shape(q, k, layout=None, cu_seqlens_q=None):
    """The descales' [batch, kv_heads]: a row per batch entry, or per sequence of a varlen call."""
    if cu_seqlens_q is not None:  # varlen: k [total_k, kv_heads, head_dim]
        return int(cu_seqlens_q.shape[0]) - 1, int(k.shape[1])
    return int(q.shape[0]), int(k.shape[2] if layout == "bshd" else k.shape[1])


def _op_fp8(q, shape, q_descale, k_descale, v_descale, out_dtype):
    """The FP8 arguments of the attention ops: the descales as float32 tensors where q lives (a
    float made a filled `shape`, [batch, kv_heads], its value checked here in plain Python), and
    out's dtype (a torch dtype) for the ops without out=."""
    import torch
    descales = []
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if isinstance(value, torch.Tensor):
            value = value.to(device=q.device, dtype=torch.float32)
        elif isinstance(value, numbers.Real) and not isinstance(value, (bool, np.generic)):
            _check_positive_floats(name, [float(value)])
            value = torch.full(shape, float(value), dtype=torch.float32, device=q.device)
        elif value is not None:
            value = torch.from_numpy(_host_positive_floats(name, value, _DESCALES_EXPECTED)).to(q.device)
        descales.append(value)
    return (*descales, getattr(torch, _fp8_out_dtype(q, out_dtype)))


def _descales(arrays, shape, q_descale, k_descale, v_descale):
    """The descales as the compiled module takes them: float32 `shape` ([batch, kv_heads])
    contiguous where q lives (a float fills one), host values checked to be finite and > 0. None for
    16- and 32-bit inputs (refused with descales by _fp8_forward)."""
    q = arrays["q"]
    converted = []
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if value is None:
            converted.append(None)
            continue
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = np.full(shape, float(value), np.float32)
        if _arrays.is_torch(value) and value.device.type == "cpu":
            value = value.detach().numpy()
        if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack__"):
            value = _arrays.float32_array(name, _host_positive_floats(name, value, _DESCALES_EXPECTED), like=q)
        else:
            value = _arrays.float32_array(name, value, like=q)  # a device array: read on the device, unchecked
        if tuple(value.shape) != shape:
            raise InvalidArgument(f"{name} expected {_DESCALES_EXPECTED} = {list(shape)}, got shape "
                                  f"{tuple(value.shape)}")
        converted.append(value)
    return converted
