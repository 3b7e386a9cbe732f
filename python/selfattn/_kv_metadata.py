"""The KV-cache calls' metadata (lengths, block_table, batch_index, a packed call's offsets) as the
compiled functions and the torch ops take them, and a packed call's metadata checked on the host.

Metadata on the host (NumPy arrays, Python lists and tuples, CPU torch tensors) costs nothing to
read, so a packed call (append_kv with cu_seqlens_new, attention_with_kv_cache with cu_seqlens_q)
checks it here, on every path, before anything is written: the offsets (entry 0 is 0, none below
the one before, none past the packed rows, each step at most max_seqlen when given), lengths
(each in [0, capacity]) and, for attention over a paged cache, the pages that hold each sequence's
cached tokens (in [0, num_pages)). InvalidArgument names the argument and the entry, as the
library's validate_metadata does ("cu_seqlens_q[3] = 24 runs past q's 16 rows (sequence 2: rows
[16, 24))"). Metadata on a CUDA device is not read here (that would wait for the GPU): the kernels
clamp it (selfattn/kv_cache.h), except that attention's naive and cublas paths read cu_seqlens_q
back and name a bad entry, and validate_metadata=True checks all of it in the library, reading it
back. Dense calls keep the clamp for host metadata too (their docstrings say what it does).
"""
from __future__ import annotations

import numpy as np

from . import _arrays
from ._calls import _int32_or_none, _max_seqlen
from ._selfattn import InvalidArgument


def cache_metadata(lengths, block_table, like, batch_index=None):
    """lengths, block_table, batch_index as the compiled functions take them (int32, where `like` lives)."""
    table = _arrays.int32_vector("block_table", block_table, like=like) if block_table is not None else None
    return (_arrays.int32_vector("lengths", lengths, like=like), table,
            _int32_or_none("batch_index", batch_index, like))


def packed_rows(function, rows, cu_seqlens, max_seqlen, packed):
    """A packed call's offsets (int32 [batch + 1] where `packed` lives) and max_seqlen (as given, or
    the offsets' largest step), or (None, 0) for a dense call. rows: "q" or "new"."""
    if cu_seqlens is None:
        if max_seqlen is not None:
            raise InvalidArgument(f"max_seqlen_{rows} expected None without cu_seqlens_{rows}")
        return None, 0
    offsets = _arrays.int32_vector(f"cu_seqlens_{rows}", cu_seqlens, like=packed)
    return offsets, _max_seqlen(function, max_seqlen, offsets, rows, packed)


def check_packed(function, rows, cu_seqlens, max_seqlen, packed, k_cache, layout, lengths, block_table,
                 before_op=False):
    """A packed call's host metadata checked (see the module's doc); nothing for a dense call
    (cu_seqlens None), for metadata on a device, or for shapes the compiled module names itself.

    rows: "q" or "new" (packed: q, or k_new, [total, heads, head_dim]); k_cache as the caller passed
    it, in `layout`. before_op: the call goes on to a torch custom op, which gets the metadata where
    q lives: checked here only where that is a CUDA device (the op's implementation checks CPU
    tensors itself) and not while torch.compile traces the call (a traced call reads no values)."""
    if cu_seqlens is None or len(getattr(packed, "shape", ())) != 3 or len(getattr(k_cache, "shape", ())) != 4:
        return
    if before_op and ((_compiling() or packed.device.type == "cpu") if _arrays.is_torch(packed)
                      else _arrays.device_of(packed)[0] == _arrays.CPU):
        return
    offsets = _host_ints(cu_seqlens)
    if offsets is not None and offsets.ndim == 1 and offsets.size > 0:
        _check_offsets(function, rows, offsets, max_seqlen, int(packed.shape[0]))
    counts = _host_ints(lengths)
    if counts is None or counts.ndim != 1:
        return
    page_size = int(k_cache.shape[2 if layout == "bhsd" else 1])
    table = None if block_table is None else _host_ints(block_table)
    if block_table is None:
        capacity, source = page_size, f"k_cache.shape[{2 if layout == 'bhsd' else 1}]"
    elif table is not None and table.ndim == 2 and table.shape[0] == counts.size:
        capacity, source = page_size * table.shape[1], "block_table.shape[1] * page_size"
    else:
        return  # a device table with host lengths (no page check), or a shape the library names
    _first_bad(function, (counts < 0) | (counts > capacity),
               lambda b: f"lengths[{b}] = {counts[b]} expected 0 to the cache's capacity, {capacity} tokens "
                         f"({source})")
    if table is not None and rows == "q":  # append_kv drops tokens bound for a page outside the pool
        pages = (counts.astype(np.int64) + page_size - 1) // page_size
        used = np.arange(table.shape[1])[None, :] < pages[:, None]
        num_pages = int(k_cache.shape[0])
        outside = used & ((table < 0) | (table >= num_pages))
        if outside.any():
            b, i = (int(x) for x in np.argwhere(outside)[0])
            raise InvalidArgument(f"{function}: block_table[{b}, {i}] = {table[b, i]} is outside the pool's "
                                  f"{num_pages} pages (k_cache.shape[0]), and sequence {b}'s {counts[b]} cached "
                                  f"tokens (lengths[{b}]) use it")


def _check_offsets(function, rows, offsets, max_seqlen, total):
    """The rules and the words of the library's check (check_packed_offsets in
    host/src/validation/kv_metadata_validation.cpp), on the host."""
    name, bound, array = f"cu_seqlens_{rows}", f"max_seqlen_{rows}", "q" if rows == "q" else "k_new"
    cu = offsets.astype(np.int64)
    if cu[0] != 0:
        raise InvalidArgument(f"{function}: {name}[0] = {cu[0]} expected 0 (sequence 0 starts at {array}'s first "
                              f"row)")
    steps = np.diff(cu)
    bad = (steps < 0) | (cu[1:] > total)
    if max_seqlen is not None:
        bad |= steps > int(max_seqlen)

    def message(b):
        first, last = int(cu[b]), int(cu[b + 1])
        span = f"sequence {b}: rows [{first}, {last})"
        if last < first:
            return (f"{name}[{b + 1}] = {last} is below {name}[{b}] = {first} (sequence {b} would own "
                    f"{last - first} rows; the offsets must not decrease)")
        if last > total:
            return f"{name}[{b + 1}] = {last} runs past {array}'s {total} rows ({span})"
        return f"{name}[{b + 1}] - {name}[{b}] = {last - first} exceeds {bound} = {max_seqlen} ({span})"

    _first_bad(function, bad, message)


def _first_bad(function, bad, message):
    """InvalidArgument with message(b) for the first b where `bad` (a boolean vector) holds."""
    if bad.any():
        raise InvalidArgument(f"{function}: {message(int(np.argmax(bad)))}")


def _host_ints(values):
    """values as a NumPy integer array where they are on the host (a NumPy array, a list or tuple, a
    CPU torch tensor, another DLPack array on the CPU), without a copy where they are one already;
    None on a device, or for values that are not integers (the conversion names those)."""
    try:
        if _arrays.is_torch(values):
            array = values.detach().numpy() if values.device.type == "cpu" else None
        elif isinstance(values, (np.ndarray, list, tuple)):
            array = np.asarray(values)
        elif hasattr(values, "__dlpack__") and _arrays.device_of(values)[0] == _arrays.CPU:
            array = np.from_dlpack(values)
        else:
            array = None
    except (TypeError, ValueError, RuntimeError, BufferError):
        return None
    return array if array is not None and array.dtype.kind in "iu" else None


def _compiling():
    """Whether torch.compile is tracing the call (its values are not there to read)."""
    import torch
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())
