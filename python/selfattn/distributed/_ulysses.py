"""ulysses_attention(): all-to-all (DeepSpeed-Ulysses) context parallelism over attention()."""
from __future__ import annotations

from typing import Any, Optional

from ._checks import host_offsets
from ._comm import group_name
from ._ops import ops
from ._plan import SHARDINGS
from ._sharding import positions


def _described(value):
    """An option as the ranks compare it: tensors by shape (their values are not read back)."""
    shape = getattr(value, "shape", None)
    return f"tensor of shape {tuple(shape)}" if shape is not None else repr(value)


def ulysses_attention(q: Any, k: Any, v: Any, *, group: Any = None, sharding: str = "contiguous",
                      layout: str = "bhsd", seq_len: Optional[int] = None, cu_seqlens: Any = None,
                      causal: Optional[str] = None, scale: Optional[float] = None, key_lengths: Any = None,
                      window: Optional[tuple] = None, softcap: Optional[float] = None, alibi_slopes: Any = None,
                      bias: Any = None, sinks: Any = None, path: str = "auto", deterministic: bool = False,
                      return_lse: bool = False) -> Any:
    """Attention over a sequence split across the ranks of `group`, by all-to-all: each rank sends
    its rows of every head away and gets every row of heads / W heads, runs attention() (or
    attention_varlen()) on them, and the outputs go back the same way.

    q, k, v, group, sharding, layout, seq_len, cu_seqlens and return_lse as ring_attention takes
    them (shards of one sequence; every rank the same shapes and options, checked). Every option of
    attention() applies to the whole sequence, as on one device: causal, scale, key_lengths (per
    batch, of the whole sequence), window, softcap, alibi_slopes ([heads] or [batch, heads]), bias
    ([batch|1, heads|1, seq_len, seq_len], the whole sequence's, the same on every rank), sinks,
    path, deterministic. Rank r attends the heads [r H/W, (r+1) H/W) and the kv heads likewise, so
    heads and kv_heads must both be multiples of the group's size W (an InvalidArgument names both
    numbers otherwise; ring_attention takes any head count).

    Differentiable (the all-to-alls are custom ops whose gradient is the opposite move, the
    attention the package's own op) and traced by torch.compile without a graph break. The
    gradient of sinks holds this rank's heads (summed over the ranks, it is the whole gradient).
    """
    import torch
    import torch.distributed as dist
    import selfattn

    name = group_name(group)
    group = dist.group.WORLD if group is None else group
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    packed = cu_seqlens is not None
    if not packed and layout not in ("bhsd", "bshd"):
        raise selfattn.InvalidArgument(f"ulysses_attention: layout expected 'bhsd' or 'bshd', got {layout!r}")
    if sharding not in SHARDINGS:
        raise selfattn.InvalidArgument(f"ulysses_attention: sharding expected 'contiguous' or 'zigzag', got "
                                       f"{sharding!r}")
    seq_dim, head_dim = (0, 1) if packed else ((2, 1) if layout == "bhsd" else (1, 2))
    offsets = host_offsets("ulysses_attention", cu_seqlens) if packed else None
    options = dict(sharding=sharding, layout=layout, seq_len=seq_len, cu_seqlens=offsets, causal=causal,
                   scale=scale, key_lengths=key_lengths, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                   bias=bias, sinks=sinks, path=path, deterministic=deterministic, return_lse=return_lse)
    check = "\n".join(f"{key}={_described(value)}" for key, value in options.items())
    moves = ops()["ulysses_all_to_all"]
    q, k, v = moves([q, k, v], name, [seq_dim] * 3, [head_dim] * 3, True, "q,k,v", check)

    # Every row of the sequence, in the ranks' order: put it in the global order, cut the padding.
    total = q.shape[seq_dim]
    if sharding == "zigzag" and (total // world) % 2:
        raise selfattn.InvalidArgument(f"ulysses_attention: q.shape[{seq_dim}] (this rank's rows) expected an even "
                                       f"number under sharding='zigzag', got {total // world}")
    real = offsets[-1] if packed else (total if seq_len is None else int(seq_len))
    if not 0 <= real <= total:
        given = "cu_seqlens[-1]" if packed else "seq_len"
        raise selfattn.InvalidArgument(f"ulysses_attention: {given} expected at most the group's rows ({total}), "
                                       f"got {real}")
    order = torch.cat([positions(total, world, r, sharding) for r in range(world)]).to(q.device)
    if sharding == "zigzag":
        q, k, v = (t.index_select(seq_dim, torch.argsort(order)) for t in (q, k, v))
    q, k, v = (t.narrow(seq_dim, 0, real) for t in (q, k, v))

    heads = q.shape[head_dim]
    mine = slice(rank * heads, (rank + 1) * heads)  # this rank's query heads
    if alibi_slopes is not None:
        alibi_slopes = torch.as_tensor(alibi_slopes, device=q.device)[..., mine]
    if bias is not None and bias.shape[1] != 1:
        bias = bias[:, mine]
    if sinks is not None:
        sinks = torch.as_tensor(sinks, device=q.device).to(torch.float32)[mine]
    mods = dict(causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes, bias=bias,
                sinks=sinks, path=path, deterministic=deterministic, return_lse=True)
    if packed:
        cu = torch.tensor(offsets, dtype=torch.int32)
        out, lse = selfattn.attention_varlen(q, k, v, cu, cu, **mods)
    else:
        out, lse = selfattn.attention(q, k, v, layout=layout, key_lengths=key_lengths, **mods)

    # Back to the ranks' order (padding rows: out 0, lse -inf), then to this rank's rows.
    lse_seq_dim = 1 if packed else 2
    out = _padded(out, seq_dim, total, 0.0)
    lse = _padded(lse, lse_seq_dim, total, -torch.inf)
    if sharding == "zigzag":
        out, lse = out.index_select(seq_dim, order), lse.index_select(lse_seq_dim, order)
    out, = moves([out], name, [seq_dim], [head_dim], False, "out", "")
    if not return_lse:
        return out
    lse, = moves([lse], name, [lse_seq_dim], [lse_seq_dim - 1], False, "lse", "")
    return out, lse


def _padded(x, dim, length, value):
    import torch
    if x.shape[dim] == length:
        return x
    shape = list(x.shape)
    shape[dim] = length - x.shape[dim]
    return torch.cat([x, x.new_full(shape, value)], dim)
