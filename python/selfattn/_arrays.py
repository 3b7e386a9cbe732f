"""What selfattn needs to know about the caller's arrays, whichever framework made them: where they
live (DLPack device), how to allocate an output beside them, how to swap two axes (a view), the
caller's current CUDA stream. NumPy is imported here; PyTorch and CuPy only when their arrays come."""
from __future__ import annotations

import numpy as np

from ._selfattn import InvalidArgument

CPU, CUDA = 1, 2  # DLPack device types


def _framework(a) -> str:
    module = type(a).__module__.split(".")[0]
    if isinstance(a, np.ndarray):
        return "numpy"
    return module if module in ("torch", "cupy") else "dlpack"


def is_torch(a) -> bool:
    return _framework(a) == "torch"


def device_of(a):
    """(DLPack device type, device id) of an array."""
    if isinstance(a, np.ndarray):
        return CPU, 0
    device_type, device_id = a.__dlpack_device__()
    return int(device_type), int(device_id)


def _is_bfloat16(a) -> bool:
    # ml_dtypes.bfloat16 is a NumPy dtype named "bfloat16"; NumPy cannot export it through DLPack.
    return isinstance(a, np.ndarray) and a.dtype.name == "bfloat16"


# The FP8 formats the library takes (OCP FP8, selfattn/types.h), by the name NumPy (ml_dtypes) and
# torch give their dtypes, and the compiled module's name for each.
_FP8_FORMATS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def _dtype_name(a) -> str:
    dtype = getattr(a, "dtype", None)
    return str(dtype).replace("torch.", "") if is_torch(a) else getattr(dtype, "name", str(dtype))


def fp8_format(a):
    """The compiled module's name of a's FP8 format ("e4m3", "e5m2"), or None for any other dtype.
    Other 8-bit float formats (float8_e4m3fnuz, ml_dtypes' float8_e4m3 with infinities, ...) are
    refused here, naming the two the library takes: their bytes would read as garbage."""
    if a is None or not (isinstance(a, np.ndarray) or is_torch(a)):
        return None
    name = _dtype_name(a)
    if name in _FP8_FORMATS:
        return _FP8_FORMATS[name]
    if name.startswith("float8"):
        raise InvalidArgument(f"dtype {name} is not an FP8 format selfattn takes: float8_e4m3fn or float8_e5m2 (OCP "
                              f"FP8)")
    return None


def fp8_dtype(like, fmt):
    """The dtype of FP8 format `fmt` ("e4m3", "e5m2") in like's framework (ml_dtypes for NumPy)."""
    name = {v: k for k, v in _FP8_FORMATS.items()}[fmt]
    if is_torch(like):
        import torch
        return getattr(torch, name)
    import ml_dtypes
    return np.dtype(getattr(ml_dtypes, name))


class Arguments:
    """The array arguments of one call: checked to be DLPack arrays of one framework on one device,
    with the right number of dimensions, and handed to the compiled module through dl()."""

    def __init__(self, named: dict, ndim):
        self._arrays = {}
        self._first = None
        self.bf16_as_uint16 = False
        self.fp8 = None  # the FP8 format of the call's FP8 arrays ("e4m3", "e5m2"), passed as uint8
        self._fp8_first = None
        for name, a in named.items():
            if a is not None:
                if name == "out":
                    self.add_output(name, a)
                else:
                    self._add(name, a)
                if ndim is not None:
                    self.expect_ndim(name, ndim)

    def _add(self, name, a):
        if not hasattr(a, "__dlpack__"):
            raise InvalidArgument(f"{name} expected an array with __dlpack__ (NumPy, PyTorch, CuPy), "
                                  f"got {type(a).__name__}")
        if self._first is None:
            self._first = (name, a)
        else:
            first_name, first = self._first
            if _framework(a) != _framework(first) or device_of(a) != device_of(first):
                raise InvalidArgument(f"{name} expected the framework and device of {first_name} "
                                      f"({type(first).__module__} on DLPack device {device_of(first)}), got "
                                      f"{type(a).__module__} on {device_of(a)}")
        if is_torch(a):
            a = a.detach()  # DLPack refuses tensors that require grad; torch gradients come from _torch.py
        self.bf16_as_uint16 = self.bf16_as_uint16 or _is_bfloat16(a)
        try:
            fmt = fp8_format(a)
        except InvalidArgument as error:
            raise InvalidArgument(f"{name}.{error}") from None
        if fmt is not None:
            # The compiled module takes one FP8 format per call (every uint8 data array is read as it).
            if self.fp8 is not None and fmt != self.fp8:
                raise InvalidArgument(f"{name}.dtype expected {_dtype_name(self._fp8_first[1])} "
                                      f"({self._fp8_first[0]}.dtype: one FP8 format per call), got {_dtype_name(a)}")
            self.fp8, self._fp8_first = fmt, (name, a)
        self._arrays[name] = a
        return a

    def add_output(self, name, a):
        a = self._add(name, a)
        if isinstance(a, np.ndarray) and not a.flags.writeable:
            raise InvalidArgument(f"{name} expected a writeable array, got a read-only one")

    def add_input(self, name, a, ndim):
        """One more input (None: nothing) with its own number of dimensions (bias beside q, k, v)."""
        if a is not None:
            self._add(name, a)
            self.expect_ndim(name, ndim)

    def __getitem__(self, name):
        return self._arrays.get(name)

    def expect_ndim(self, name, ndim):
        a = self._arrays.get(name)
        if a is not None and len(a.shape) != ndim:
            raise InvalidArgument(f"{name} expected {ndim} dimension{'s' if ndim != 1 else ''}, got {len(a.shape)} "
                                  f"(shape {tuple(a.shape)})")

    @staticmethod
    def dl(a):
        """a as the compiled module takes it: bfloat16 NumPy arrays as uint16, FP8 arrays as uint8
        (same bytes, same strides in elements); anything else as it is."""
        if a is None:
            return None
        if _is_bfloat16(a):
            return a.view(np.uint16)
        if fp8_format(a) is not None:
            if is_torch(a):
                import torch
                return a.view(torch.uint8)
            return a.view(np.uint8)
        return a


def swap_axes_1_2(a):
    """The view with axes 1 and 2 exchanged (BSHD <-> BHSD); no data moves."""
    if is_torch(a):
        return a.transpose(1, 2)
    axes = list(range(len(a.shape)))
    axes[1], axes[2] = 2, 1
    return a.transpose(axes)


def layout_view(layout):
    """The function that views an array of `layout` ("bhsd" or "bshd") in the library's BHSD order."""
    return swap_axes_1_2 if layout == "bshd" else (lambda a: a)


def empty_like(like, shape, dtype=None):
    """A new array of `shape` from like's framework, on like's device (dtype: like's, or the name
    "float32", "float16", "bfloat16" or "int32")."""
    framework = _framework(like)
    if framework == "numpy":
        if dtype == "bfloat16":
            import ml_dtypes  # NumPy's bfloat16 (README's set-up installs it)
            return np.empty(shape, dtype=ml_dtypes.bfloat16)
        return np.empty(shape, dtype=np.dtype(dtype) if dtype else like.dtype)
    if framework == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype) if dtype else like.dtype, device=like.device)
    if framework == "cupy":
        import cupy
        with like.device:
            return cupy.empty(shape, dtype=getattr(cupy, dtype) if dtype else like.dtype)
    xp = like.__array_namespace__()
    return xp.empty(shape, dtype=getattr(xp, dtype) if dtype else like.dtype, device=like.device)


def prefill_unowned(out, lse, stream):
    """Fills what a packed call (attention_varlen, attention_with_kv_cache with cu_seqlens_q)
    allocated before it runs, so that the rows no sequence owns, which the library does not write,
    read as out 0 and lse -inf (a row that attends to nothing) rather than as leftover memory. out:
    None where the caller gave it (kept as it is); lse: None without one. The fill runs on the
    caller's current stream (one memset each on a CUDA device, no host sync); a call on another
    stream (a context= made for one: `stream`, the context's) first waits for it on the host."""
    filled = [(a, value) for a, value in ((out, 0), (lse, float("-inf"))) if a is not None]
    for a, value in filled:
        a[...] = value
    if filled and device_of(filled[0][0])[0] == CUDA and stream != current_stream(filled[0][0]):
        a = filled[0][0]
        if is_torch(a):
            import torch
            torch.cuda.current_stream(a.device).synchronize()
        elif _framework(a) == "cupy":
            import cupy
            with a.device:
                cupy.cuda.get_current_stream().synchronize()


def int32_vector(name, values, like):
    """values (an int32 array of like's framework and device, or any integer sequence) as a
    contiguous int32 vector where `like` lives; a conversion copies."""
    return _converted(name, values, like, "int32", "iu", "integers")


def float32_array(name, values, like):
    """values (a float32 array of like's framework and device, or any sequence of real numbers) as
    a contiguous float32 array of the same shape where `like` lives; a conversion copies."""
    return _converted(name, values, like, "float32", "fiu", "real numbers")


def _converted(name, values, like, dtype, kinds, what):
    # kinds: the NumPy dtype kinds accepted ("i" signed, "u" unsigned, "f" float) and converted.
    framework = _framework(like)
    if framework == "torch":
        import torch
        if isinstance(values, torch.Tensor):
            kind = "c" if values.is_complex() else "f" if values.is_floating_point() else \
                "b" if values.dtype == torch.bool else "i"
            if kind not in kinds:
                raise InvalidArgument(f"{name} expected {what}, got {values.dtype}")
            return values.to(device=like.device, dtype=getattr(torch, dtype)).contiguous()
        return torch.as_tensor(_host_array(name, values, dtype, kinds, what), device=like.device)
    if framework == "cupy":
        import cupy
        with like.device:
            return cupy.ascontiguousarray(cupy.asarray(values).astype(dtype, copy=False))
    if device_of(like)[0] != CPU:
        if not hasattr(values, "__dlpack__"):
            raise InvalidArgument(f"{name} expected a {dtype} array on {type(like).__name__}'s device")
        return values  # the compiled module checks its dtype and shape
    return _host_array(name, values, dtype, kinds, what)


def _host_array(name, values, dtype, kinds, what):
    array = np.asarray(values)
    if array.dtype.kind not in kinds and array.size > 0:
        raise InvalidArgument(f"{name} expected {what}, got {array.dtype}")
    if dtype == "int32" and array.size and (array.min() < np.iinfo(np.int32).min or
                                            array.max() > np.iinfo(np.int32).max):
        raise InvalidArgument(f"{name} expected values that fit int32, got range [{array.min()}, {array.max()}]")
    return np.ascontiguousarray(array, dtype=dtype)


def max_difference(cu_seqlens) -> int:
    """The largest cu_seqlens[b+1] - cu_seqlens[b] (0 for an empty batch)."""
    if len(cu_seqlens.shape) != 1 or cu_seqlens.shape[0] < 2:
        return 0
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def current_stream(a) -> int:
    """The caller's current CUDA stream on a's device, as an integer handle (0: legacy default)."""
    framework = _framework(a)
    if framework == "torch":
        import torch
        return int(torch.cuda.current_stream(a.device).cuda_stream)
    if framework == "cupy":
        import cupy
        with a.device:
            return int(cupy.cuda.get_current_stream().ptr)
    return 0
