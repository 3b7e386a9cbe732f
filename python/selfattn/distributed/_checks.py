"""The arguments of ring_attention and ulysses_attention, checked. What can differ between ranks
(shapes, dtypes, options) is compared across the group first (_comm.Group.check_agreement), inside
the ops, before any other check and any transfer: ranks that disagree all raise, naming what
differs, and ranks that agree all pass or all raise the same error. No rank is left waiting."""
from __future__ import annotations

import numbers
import zlib

from ._plan import SHARDINGS, Geometry, Mask

CAUSAL = (None, "top_left", "bottom_right")
LAYOUTS = ("bhsd", "bshd")


def _invalid(message):
    from selfattn import InvalidArgument
    return InvalidArgument(message)


def window_sides(function, window):
    """window (None, or a pair of ints >= -1) as (left, right), -1 for an unbounded side."""
    if window is None:
        return -1, -1
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and
            all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and -1 <= w < 2 ** 31 for w in window)):
        raise _invalid(f"{function}: window expected None or a pair (left, right) of ints >= -1 (-1: unbounded on "
                       f"that side), got {window!r}")
    return int(window[0]), int(window[1])


def host_offsets(function, cu_seqlens):
    """cu_seqlens (a list, or a tensor read back on the host) as a tuple of ints."""
    values = cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else list(cu_seqlens)
    if not values or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        raise _invalid(f"{function}: cu_seqlens expected a non-empty sequence of ints, got {cu_seqlens!r}")
    return tuple(int(v) for v in values)


def _described(offsets):
    """cu_seqlens as the agreement check compares them: the values, or a digest of many."""
    text = repr(list(offsets))
    return text if len(text) < 60 else f"{len(offsets)} entries, crc32 {zlib.crc32(text.encode()):08x}"


def agreement_items(q, k, v, sinks, offsets, options: dict):
    """(name, value) of everything every rank must pass alike."""
    items = [("q.shape", tuple(q.shape)), ("k.shape", tuple(k.shape)), ("v.shape", tuple(v.shape)),
             ("q.dtype", q.dtype), ("sinks.shape", None if sinks is None else tuple(sinks.shape)),
             ("cu_seqlens", None if offsets is None else _described(offsets))]
    return items + sorted(options.items())


def _check_tensors(function, q, k, v, packed):
    ndim = 3 if packed else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != ndim:
            what = "packed [total, heads, head_dim] (cu_seqlens given)" if packed else "4-D"
            raise _invalid(f"{function}: {name} expected a {what} tensor, got {t.dim()}-D {tuple(t.shape)}")
        if t.dtype != q.dtype or t.device != q.device:
            raise _invalid(f"{function}: {name} expected q's dtype and device ({q.dtype} on {q.device}), got "
                           f"{t.dtype} on {t.device}")
    if k.shape != v.shape:
        raise _invalid(f"{function}: v.shape expected k.shape {tuple(k.shape)}, got {tuple(v.shape)}")


def ring_setting(function, world, q, k, v, sinks, offsets, layout, sharding, seq_len, causal, window, softcap):
    """(Geometry, Mask, layout of the steps) of a ring_attention call whose ranks agree; raises
    InvalidArgument naming the argument otherwise."""
    packed = offsets is not None
    if not packed and layout not in LAYOUTS:
        raise _invalid(f"{function}: layout expected 'bhsd' or 'bshd', got {layout!r}")
    _check_tensors(function, q, k, v, packed)
    seq_axis, head_axis = (0, 1) if packed else ((2, 1) if layout == "bhsd" else (1, 2))
    heads, kv_heads = q.shape[head_axis], k.shape[head_axis]
    if kv_heads == 0 or heads % kv_heads:
        raise _invalid(f"{function}: k.shape[{head_axis}] (kv_heads) expected a divisor of q's heads ({heads}), got "
                       f"{kv_heads}")
    same = [i for i in range(q.dim()) if i != head_axis]
    if [q.shape[i] for i in same] != [k.shape[i] for i in same]:
        raise _invalid(f"{function}: k.shape expected q's but for the heads (q and k are shards of one sequence), "
                       f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if sharding not in SHARDINGS:
        raise _invalid(f"{function}: sharding expected 'contiguous' or 'zigzag', got {sharding!r}")
    local_len = q.shape[seq_axis]
    if sharding == "zigzag" and local_len % 2:
        raise _invalid(f"{function}: q.shape[{seq_axis}] (this rank's rows) expected an even number under "
                       f"sharding='zigzag' (two chunks per rank; shard() pads to it), got {local_len}")
    total = world * local_len
    if packed:
        if offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])) or offsets[-1] > total:
            raise _invalid(f"{function}: cu_seqlens expected non-decreasing offsets from 0 to at most the group's "
                           f"rows ({world} x {local_len} = {total}), got {list(offsets)}")
        if seq_len is not None and seq_len != offsets[-1]:
            raise _invalid(f"{function}: seq_len expected None or cu_seqlens[-1] ({offsets[-1]}), got {seq_len}")
        seq_len = offsets[-1]
    elif seq_len is None:
        seq_len = total
    elif not 0 <= seq_len <= total:
        raise _invalid(f"{function}: seq_len expected the real length of the sequence, at most the group's rows "
                       f"({world} x {local_len} = {total}), got {seq_len}")
    if causal not in CAUSAL:
        raise _invalid(f"{function}: causal expected None, 'top_left' or 'bottom_right', got {causal!r}")
    if min(window) < -1:
        raise _invalid(f"{function}: window expected sides >= -1 (-1: unbounded on that side), got {window}")
    if softcap is not None and not softcap > 0:
        raise _invalid(f"{function}: softcap expected a number > 0 or None, got {softcap!r}")
    if sinks is not None and tuple(sinks.shape) != (heads,):
        raise _invalid(f"{function}: sinks.shape expected [{heads}] (one logit per query head), got "
                       f"{list(sinks.shape)}")
    window = None if window == (-1, -1) else window
    return (Geometry(world, local_len, sharding, seq_len), Mask.of(causal, window, offsets),
            "packed" if packed else layout)


def heads_divisible(function, names, tensors, head_dims, world):
    """Ulysses splits the heads over the ranks: each tensor's heads must be a multiple of the group's size."""
    for name, t, axis in zip(names, tensors, head_dims):
        if t.shape[axis] % world:
            what = "kv_heads" if name in ("k", "v") else "heads"
            raise _invalid(f"{function}: {name}.shape[{axis}] ({what}) = {t.shape[axis]} expected a multiple of the "
                           f"group's size ({world}): all-to-all attention gives each rank heads / {world} of them; "
                           f"use ring_attention, which takes any head count")
