"""An FP8 cache's dequantization scales, k_scale and v_scale (see _kv_cache's doc), as the
compiled functions and the torch ops take them: float32 1-D arrays of 1 (per tensor) or kv_heads
(per kv head) entries where the cache lives. Scales given as host values (floats, NumPy arrays,
CPU tensors) are checked to be finite and > 0 (InvalidArgument naming the scale and the entry);
CUDA tensors are read on the device, unchecked, as the library reads them."""
from __future__ import annotations

import numbers

import numpy as np

from . import _arrays
from ._calls import _check_positive_floats, _host_positive_floats
from ._selfattn import InvalidArgument


def _scales_expected(kv_heads="kv_heads"):
    return f"a float or a 1-D array of 1 (per tensor) or {kv_heads} (per kv head) float32 entries"


_SCALES_EXPECTED = _scales_expected()


def op_scales(k_scale, v_scale, like):
    """k_scale and v_scale as the torch ops take them: None, or float32 tensors where `like` lives
    (a float becomes a tensor of one entry; a float's value is checked here, where it is known
    without a host read)."""
    return tuple(_scale_tensor(name, scale, like) for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)))


def _scale_tensor(name, scale, like):
    if scale is None:
        return None
    import torch
    if isinstance(scale, torch.Tensor):
        return scale.to(device=like.device, dtype=torch.float32)
    if isinstance(scale, numbers.Real) and not isinstance(scale, (bool, np.generic)):
        # A Python number in plain Python (torch.compile traces no NumPy calls), made a tensor of one entry.
        _check_positive_floats(name, [float(scale)])
        return torch.full((1,), float(scale), dtype=torch.float32, device=like.device)
    return _torch_from_host(_host_positive_floats(name, scale, _SCALES_EXPECTED), like)


def cache_scales(arrays, as_bhsd, k_scale, v_scale):
    """k_scale and v_scale as the compiled module takes them: None for a 16-bit or float32 cache
    (which refuses scales), else contiguous float32 1-D arrays of one length (1 or kv_heads: a
    per-tensor one beside a per-head one is repeated, as the library takes one count for both)
    where the cache lives. Host values are checked to be finite and > 0; CUDA tensors are not read."""
    cache = arrays["k_cache"]
    if arrays.fp8 is None or _arrays.fp8_format(cache) is None:
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is not None:
                raise InvalidArgument(f"{name} expected None: k_cache.dtype is {_arrays._dtype_name(cache)}, not FP8 "
                                      f"(scales dequantize an FP8 cache)")
        return None, None
    kv_heads = int(as_bhsd(cache).shape[1])
    scales = []
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            raise InvalidArgument(f"{name} expected {_SCALES_EXPECTED} (k_cache.dtype is "
                                  f"{_arrays._dtype_name(cache)}: real value = stored x scale), got None")
        scales.append(_scale_array(name, scale, cache, kv_heads))
    k, v = scales
    if k.shape[0] != v.shape[0]:  # one per tensor, one per kv head: repeat the single one
        k, v = (_repeat(s, kv_heads) for s in (k, v))
    return k, v


def _scale_array(name, scale, cache, kv_heads):
    """One scale argument as a float32 1-D array where the cache lives, its shape and (host values)
    entries checked."""
    if _arrays.is_torch(cache) and _arrays.is_torch(scale):
        import torch
        if scale.is_complex() or scale.dtype == torch.bool:
            raise InvalidArgument(f"{name} expected {_SCALES_EXPECTED}, got dtype {scale.dtype}")
        array = scale.detach().to(device=cache.device, dtype=torch.float32)
        array = (array.reshape(1) if array.ndim == 0 else array).contiguous()
        _check_scale_shape(name, tuple(array.shape), kv_heads)
        if scale.device.type == "cpu":
            _check_positive_floats(name, array.cpu().numpy())
        return array
    on_device = hasattr(scale, "__dlpack__") and not isinstance(scale, np.ndarray)
    if on_device and _arrays.device_of(scale)[0] != _arrays.CPU:
        array = _arrays.float32_array(name, scale, like=cache)  # a device array: read on the device, unchecked
        _check_scale_shape(name, tuple(array.shape), kv_heads)
        return array
    array = _host_positive_floats(name, scale.cpu().numpy() if _arrays.is_torch(scale) else scale,
                                  _SCALES_EXPECTED)
    _check_scale_shape(name, array.shape, kv_heads)
    return _torch_from_host(array, cache) if _arrays.is_torch(cache) else \
        _arrays.float32_array(name, array, like=cache)


def _torch_from_host(array, like):
    """A float32 NumPy array as a tensor on like's device."""
    import torch
    return torch.from_numpy(array).to(like.device)


def _check_scale_shape(name, shape, kv_heads):
    if len(shape) != 1 or shape[0] not in (1, kv_heads):
        raise InvalidArgument(f"{name} expected {_scales_expected(f'kv_heads = {kv_heads}')}, got shape "
                              f"{tuple(shape)}")


def _repeat(scales, count):
    """A scale array of 1 or `count` entries as `count` entries (a copy where it repeats)."""
    if scales.shape[0] == count:
        return scales
    if _arrays.is_torch(scales):
        return scales.expand(count).contiguous()
    return np.ascontiguousarray(np.repeat(scales, count))
