"""The KV-cache calls' metadata (lengths, block_table, batch_index, a packed call's offsets) as the
compiled functions and the torch ops take them."""
from __future__ import annotations

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
