"""The sequence shards: shard() cuts a whole tensor into the piece one rank holds, unshard() puts the
pieces back together, positions() says which global position each row of a shard holds (for rotary
embeddings, or a loss mask), gather() collects the shards of a group into the whole tensor.

The padding rule: a sequence whose length does not divide evenly (by the world size, or twice it for
the zigzag layout) is padded at its end with zeros up to padded_length(); every rank then holds the
same number of rows. The attention calls are told the real length (seq_len=, or cu_seqlens[-1] for
packed documents): the padding rows see no key and no row sees them (their output is 0, their lse
-inf, their gradients 0), and unshard(seq_len=) drops them again."""
from __future__ import annotations

from ._plan import SHARDINGS, Geometry


def _check(world_size, rank, sharding):
    from selfattn import InvalidArgument
    if sharding not in SHARDINGS:
        raise InvalidArgument(f"sharding expected 'contiguous' or 'zigzag', got {sharding!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise InvalidArgument(f"world_size expected an int >= 1, got {world_size!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size):
        raise InvalidArgument(f"rank expected an int in [0, world_size = {world_size}), got {rank!r}")


def padded_length(seq_len: int, world_size: int, sharding: str = "contiguous") -> int:
    """The length a sequence of seq_len tokens is padded to: the next multiple of world_size
    (contiguous) or of 2 * world_size (zigzag: every rank holds two chunks)."""
    _check(world_size, None, sharding)
    unit = world_size * (2 if sharding == "zigzag" else 1)
    return -(-seq_len // unit) * unit


def positions(seq_len: int, world_size: int, rank: int, sharding: str = "contiguous"):
    """The global position of each row of rank `rank`'s shard (an int64 tensor of
    padded_length() / world_size entries); positions >= seq_len are padding."""
    import torch
    _check(world_size, rank, sharding)
    local_len = padded_length(seq_len, world_size, sharding) // world_size
    geometry = Geometry(world_size, local_len, sharding, seq_len)
    pieces = [torch.arange(start, start + (local_len if sharding == "contiguous" else local_len // 2))
              for start, _, _ in geometry.segments(rank)]
    return torch.cat(pieces)


def shard(x, world_size: int, rank: int, *, sharding: str = "contiguous", dim: int = 2):
    """Rank `rank`'s shard of the whole tensor x, whose sequence runs along `dim` (2 for bhsd, 1 for
    bshd, 0 for packed [total, heads, head_dim]): x padded with zeros to padded_length() along dim,
    then the rows positions() names, in that order (a new tensor, differentiable)."""
    import torch
    _check(world_size, rank, sharding)
    seq_len = x.shape[dim]
    padding = padded_length(seq_len, world_size, sharding) - seq_len
    if padding:
        shape = list(x.shape)
        shape[dim] = padding
        x = torch.cat([x, x.new_zeros(shape)], dim)
    return x.index_select(dim, positions(seq_len, world_size, rank, sharding).to(x.device))


def unshard(shards, *, sharding: str = "contiguous", dim: int = 2, seq_len: int = None):
    """The whole tensor from every rank's shard (a list in rank order, as shard() cut them), in global
    order along dim, cut to seq_len (None: keep the padding)."""
    import torch
    _check(len(shards), None, sharding)
    world = len(shards)
    joined = torch.cat(list(shards), dim)
    total = joined.shape[dim]
    order = torch.cat([positions(total, world, r, sharding) for r in range(world)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(total)  # row `inverse[p]` of the joined shards holds position p
    whole = joined.index_select(dim, inverse.to(joined.device))
    return whole if seq_len is None else whole.narrow(dim, 0, seq_len)


def gather(x, *, group=None, sharding: str = "contiguous", dim: int = 2, seq_len: int = None):
    """The whole tensor on every rank of `group` (None: the default group) from each rank's shard x:
    all_gather, then unshard(). For checks and small tensors (not differentiable)."""
    import torch
    import torch.distributed as dist
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, x.contiguous(), group=group)
    return unshard(pieces, sharding=sharding, dim=dim, seq_len=seq_len)
