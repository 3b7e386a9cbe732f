"""selfattn: self-attention kernels, ``out = softmax(scale * Q K^T + mask) V``, from Python.

Inputs are any arrays that speak DLPack (``__dlpack__``):

- NumPy arrays (host memory) run on **the sim**, the CPU simulator that executes the library's
  CUDA kernel source: they are copied into guarded sim device memory, the call runs, and the
  output is copied back. bfloat16 comes from NumPy through ``ml_dtypes.bfloat16``.
- PyTorch or CuPy CUDA tensors run on **the cuda backend** without copies, on the caller's current
  stream; the output is allocated by the caller's framework (or written into ``out=``).

Strides are taken from the arrays, so BSHD views (for example the q, k and v slices of a packed
QKV tensor) are used as they are. Errors are raised as :class:`InvalidArgument` (a ``ValueError``),
:class:`NotAvailable` (a ``NotImplementedError``), :class:`WorkspaceTooSmall` (a ``MemoryError``)
and :class:`BackendError` (a ``RuntimeError``), all subclasses of :class:`selfattn.Error`, with the
library's message in the caller's terms: the axis numbers of the arrays as they were passed (their
layout and rank) and the Python argument names (_messages.py). PyTorch is optional and imported
only when a torch tensor is passed.

Gradients: :func:`attention_backward` (and :func:`attention_varlen_backward` for packed
sequences) computes dq, dk, dv from the forward's out and lse (any arrays). On torch tensors
:func:`attention`, :func:`attention_varlen` and :func:`self_attention` are differentiable, with
every mask and score modifier (``loss.backward()`` reaches the library's backward through the
custom ops' autograd formulas, see _torch.py), attention sinks included; calls that would leave a
tensor that requires grad without its gradient raise NotAvailable instead.

Inspection: :func:`attention_probabilities` writes the softmax weights a call forms (dropped ones
negated: FlashAttention's S_dmask), :func:`dropout_keep_mask` the keep flags of its dropout.

FP8: :func:`attention` and :func:`attention_varlen` take q, k, v of float8_e4m3fn / float8_e5m2
(torch's dtypes, or ml_dtypes' for NumPy) with ``q_descale=``, ``k_descale=``, ``v_descale=`` and
``out_dtype=``, forward only (see attention()'s doc).

Decoding: :func:`append_kv` and :func:`attention_with_kv_cache` work on a KV cache the caller owns
(contiguous or paged, also in FP8: float8_e4m3fn / float8_e5m2 with ``k_scale=``, ``v_scale=``),
:func:`merge_states` combines partial results (see _kv_cache.py).

Packed calls (:func:`attention_varlen`; :func:`attention_with_kv_cache` with ``cu_seqlens_q=``):
rows that no sequence owns (past ``cu_seqlens_q[-1]``, say) come back as 0 in an ``out`` the call
allocates, and as -inf in its lse; an ``out=`` the caller passes keeps them as they were. A packed
KV-cache call checks metadata given on the host (NumPy arrays, lists, CPU tensors) on every path;
metadata on a CUDA device is clamped by the kernels (see _kv_cache.py).

The calls live by family, as host/src has them: _forward.py, _backward.py, _kv_cache.py (its
metadata and FP8 scales in _kv_metadata.py and _kv_scales.py) and _probabilities.py, with what they share in _calls.py,
_arrays.py and _messages.py; _torch.py registers the custom ops over
them. This module puts the package together: it re-exports the calls and hands the call modules the
custom ops (_calls.torch_ops).
"""
from __future__ import annotations

import sys as _sys

from . import _torch
from ._backward import attention_backward, attention_varlen_backward
from ._calls import default_context, install_torch_ops
from ._forward import attention, attention_varlen, self_attention
from ._kv_cache import append_kv, attention_with_kv_cache, cu_seqlens_from_lengths, merge_states, rotary_embedding
from ._probabilities import attention_probabilities, dropout_keep_mask
from ._selfattn import (BackendError, Context, Error, InvalidArgument, NotAvailable, WorkspaceTooSmall,
                        __version__)

__all__ = ["attention", "attention_backward", "attention_varlen", "attention_varlen_backward", "self_attention",
           "attention_probabilities", "dropout_keep_mask",
           "append_kv", "attention_with_kv_cache", "merge_states", "cu_seqlens_from_lengths", "rotary_embedding",
           "Context", "default_context", "backends", "paths", "version",
           "Error", "InvalidArgument", "NotAvailable", "WorkspaceTooSmall", "BackendError", "__version__"]

# Shown as selfattn.X (where users find and catch them), not as the private module that holds them
# (selfattn._selfattn.Error, selfattn._forward.attention). The KV-cache calls and default_context
# keep their modules' names, as they always have.
for _public in (Error, InvalidArgument, NotAvailable, WorkspaceTooSmall, BackendError, attention, attention_varlen,
                self_attention, attention_backward, attention_varlen_backward, attention_probabilities,
                dropout_keep_mask):
    _public.__module__ = __name__
del _public


def version() -> str:
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return __version__


def backends() -> list:
    """The backends usable here: always "sim"; "cuda" when the build has it and a GPU is usable
    (Context("cuda") says why not)."""
    names = ["sim"]
    try:
        default_context("cuda")
        names.append("cuda")
    except NotAvailable:
        pass
    return names


def paths(backend: str = "sim") -> list:
    """The attention paths ("naive", "cublas", "fused") this build provides on ``backend``
    ("auto" always works and is not listed)."""
    context = default_context(backend)
    return [p for p in ("naive", "cublas", "fused") if context.path_available(p)]


# The call modules reach the custom ops through _calls.torch_ops() (importing _torch costs nothing:
# it imports torch only when ops() first runs).
install_torch_ops(_torch.ops)

# torch.compile cannot trace the custom ops' registration: register them now where torch is already
# imported (otherwise the first eager call on torch tensors does).
if "torch" in _sys.modules:
    _torch.ops()
