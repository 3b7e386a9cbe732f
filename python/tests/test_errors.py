"""Bad inputs raise the library's exceptions, as subclasses of the matching built-in ones, with the
library's message; nothing is written into out when a call is refused."""
import ctypes

import numpy as np
import pytest

import selfattn
from conftest import random


def arrays(rng, shape=(1, 2, 5, 8), dtype="float32"):
    return [random(rng, shape, dtype) for _ in range(3)]


def test_exception_hierarchy():
    assert issubclass(selfattn.InvalidArgument, ValueError)
    assert issubclass(selfattn.NotAvailable, NotImplementedError)
    assert issubclass(selfattn.WorkspaceTooSmall, MemoryError)
    assert issubclass(selfattn.BackendError, RuntimeError)
    for e in (selfattn.InvalidArgument, selfattn.NotAvailable, selfattn.WorkspaceTooSmall, selfattn.BackendError):
        assert issubclass(e, selfattn.Error)


def test_wrong_dtype(rng):
    q, k, v = arrays(rng)
    with pytest.raises(selfattn.InvalidArgument, match="q.dtype expected float32, float16 or bfloat16, got float64"):
        selfattn.attention(q.astype(np.float64), k, v)
    with pytest.raises(selfattn.InvalidArgument, match=r"k.dtype expected f32 \(q.dtype\), got f16"):
        selfattn.attention(q, k.astype(np.float16), v)


def test_wrong_shapes(rng):
    q, k, v = arrays(rng)
    with pytest.raises(selfattn.InvalidArgument, match="q expected 4 dimensions"):
        selfattn.attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"k.shape\[3\]"):
        selfattn.attention(q, k[..., :4], v)
    with pytest.raises(selfattn.InvalidArgument, match="heads"):
        selfattn.attention(random(rng, (1, 3, 5, 8), "float32"), k, v)  # 2 kv heads do not divide 3


def test_non_contiguous_head_dim(rng):
    q, k, v = arrays(rng, (1, 2, 5, 16))
    with pytest.raises(selfattn.InvalidArgument, match=r"q.strides\[3\]"):
        selfattn.attention(q[..., ::2], k[..., :8], v[..., :8])


def test_bad_keywords(rng):
    q, k, v = arrays(rng)
    with pytest.raises(selfattn.InvalidArgument, match="causal expected"):
        selfattn.attention(q, k, v, causal=True)
    with pytest.raises(selfattn.InvalidArgument, match="layout expected"):
        selfattn.attention(q, k, v, layout="sbhd")
    with pytest.raises(selfattn.InvalidArgument, match="path expected"):
        selfattn.attention(q, k, v, path="fastest")
    with pytest.raises(selfattn.InvalidArgument, match="expected an array with __dlpack__"):
        selfattn.attention(q.tolist(), k, v)


def test_key_lengths_checked(rng):
    q, k, v = arrays(rng)
    with pytest.raises(selfattn.InvalidArgument, match=r"key_lengths expected shape \[1\]"):
        selfattn.attention(q, k, v, key_lengths=[3, 4])
    with pytest.raises(selfattn.InvalidArgument, match="key_lengths expected integers"):
        selfattn.attention(q, k, v, key_lengths=[2.5])


def test_cu_seqlens_checked(rng):
    q, k, v = (random(rng, (6, 2, 8), "float32") for _ in range(3))
    with pytest.raises(selfattn.InvalidArgument, match="cu_seqlens_k expected shape"):
        selfattn.attention_varlen(q, k, v, [0, 2, 6], [0, 6])


def test_refused_call_writes_nothing(rng):
    q, k, v = arrays(rng)
    out = np.full(q.shape, 3.0, dtype=np.float32)
    with pytest.raises(selfattn.InvalidArgument):
        selfattn.attention(q, k, v, out=out, scale=float("nan"))
    assert np.all(out == 3.0)


def test_out_overlapping_an_input(rng):
    qkv = random(rng, (1, 5, 3, 2, 8), "float32")
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    with pytest.raises(selfattn.InvalidArgument, match="out expected not to overlap"):
        selfattn.attention(q, k, v, layout="bshd", out=qkv[:, :, 2])


def test_read_only_out(rng):
    q, k, v = arrays(rng)
    out = np.empty_like(q)
    out.flags.writeable = False
    with pytest.raises(selfattn.InvalidArgument, match="writeable"):
        selfattn.attention(q, k, v, out=out)


def test_mixed_devices_or_frameworks(rng):
    q, k, v = arrays(rng)

    class Foreign:  # a DLPack producer of another framework
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    with pytest.raises(selfattn.InvalidArgument, match="expected the framework and device of q"):
        selfattn.attention(q, Foreign(k), v)


def test_host_arrays_on_a_cuda_context(rng):
    try:
        ctx = selfattn.Context("cuda")
    except selfattn.NotAvailable as e:
        assert "GPU" in str(e) or "CUDA" in str(e) or "cuda" in str(e)
        pytest.skip(f"no usable GPU: {e}")
    q, k, v = arrays(rng)
    with pytest.raises(selfattn.InvalidArgument, match="host array"):
        selfattn.attention(q, k, v, context=ctx)


def test_unavailable_path(rng):
    if "cublas" in selfattn.paths("sim"):
        pytest.skip("the sim provides every path")
    q, k, v = arrays(rng)
    with pytest.raises(selfattn.NotAvailable):
        selfattn.attention(q, k, v, path="cublas")


def test_workspace_too_small(rng):
    q, k, v = arrays(rng, (1, 1, 64, 8))
    ctx = selfattn.Context("sim", workspace_limit=16)
    with pytest.raises(selfattn.WorkspaceTooSmall):
        selfattn.attention(q, k, v, path="naive", context=ctx)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class OtherDevice:
    """A float32 array that DLPack says lives on another kind of device (type 9, Vulkan); its data
    pointer is a host array's, never to be read, since the call must refuse it first."""
    DEVICE_TYPE = 9

    def __init__(self, a):
        self.host = np.ascontiguousarray(a, dtype=np.float32)
        self.shape = self.host.shape
        self._shape = (ctypes.c_int64 * self.host.ndim)(*self.host.shape)
        self._managed = _DLManagedTensor()
        self._managed.dl_tensor = _DLTensor(self.host.ctypes.data, _DLDevice(self.DEVICE_TYPE, 0), self.host.ndim,
                                            _DLDataType(2, 32, 1), self._shape, None, 0)

    def __dlpack__(self, **kwargs):
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(self._managed), b"dltensor", None)

    def __dlpack_device__(self):
        return self.DEVICE_TYPE, 0


def test_unsupported_device(rng):
    q, k, v = (OtherDevice(a) for a in arrays(rng))
    with pytest.raises(selfattn.NotAvailable, match="DLPack device type 9"):
        selfattn.attention(q, k, v, out=OtherDevice(np.zeros(q.shape)))


def test_batch_index_of_the_wrong_size_is_named(rng):
    # With batch_index the cache's rows are not the batch: batch_index and lengths are each checked
    # against the call's own (q's or k_new's, a packed call's offsets), and the one that differs is
    # named; where both agree and q differs, q is named against lengths. Nothing is written.
    k_cache, v_cache = (random(rng, (4, 2, 8, 16), "float32") for _ in range(2))  # 4 rows, 3 sequences
    pool_k = k_cache.copy()
    q = random(rng, (3, 2, 1, 16), "float32")
    out = np.full(q.shape, np.nan, np.float32)
    with pytest.raises(selfattn.InvalidArgument,
                       match=r"batch_index expected shape \[3\] \(batch: q.shape\[0\]\), got \[2\]"):
        selfattn.attention_with_kv_cache(q, k_cache, v_cache, [2, 3, 4], batch_index=[0, 1], out=out)
    with pytest.raises(selfattn.InvalidArgument,
                       match=r"lengths expected shape \[3\] \(batch: q.shape\[0\]\), got \[2\]"):
        selfattn.attention_with_kv_cache(q, k_cache, v_cache, [2, 3], batch_index=[0, 1, 3], out=out)
    with pytest.raises(selfattn.InvalidArgument,
                       match=r"q.shape\[0\] \(batch\) expected 2 \(lengths.shape\[0\]\), got 3"):
        selfattn.attention_with_kv_cache(q, k_cache, v_cache, [2, 3], batch_index=[0, 1], out=out)
    assert np.all(np.isnan(out))
    k_new = random(rng, (3, 1, 2, 16), "float32")  # bshd: [batch, seq_new, kv_heads, head_dim]
    with pytest.raises(selfattn.InvalidArgument,
                       match=r"batch_index expected shape \[3\] \(batch: k_new.shape\[0\]\), got \[4\]"):
        selfattn.append_kv(k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3), [2, 3, 4], k_new, k_new,
                           batch_index=[0, 1, 2, 3], layout="bshd")
    packed_q = random(rng, (5, 2, 16), "float32")
    with pytest.raises(selfattn.InvalidArgument, match=r"batch_index expected shape \[3\] \(batch: cu_seqlens_q's "
                                                       r"entries - 1\), got \[2\]"):
        selfattn.attention_with_kv_cache(packed_q, k_cache, v_cache, [2, 3, 4], batch_index=[0, 1],
                                         cu_seqlens_q=[0, 1, 3, 5])
    np.testing.assert_array_equal(k_cache, pool_k)
