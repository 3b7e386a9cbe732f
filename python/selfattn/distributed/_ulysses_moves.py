"""The all-to-all of Ulysses attention: the body of the custom op selfattn::ulysses_all_to_all.

to_heads: each rank holds its rows of the sequence for every head and gets every row of the sequence
for its heads / W heads (rank r the heads [r H/W, (r+1) H/W)), the rows in rank order; the opposite
move gives them back. Several tensors of one dtype go in one all_to_all_single (fewer, larger
messages): each is cut into W slices along the axis it hands out, the slices for one rank laid side
by side."""
from __future__ import annotations

import torch

from ._checks import heads_divisible
from ._comm import Shown


def moved_shape(shape, seq_dim, head_dim, world, to_heads):
    shape = list(shape)
    if to_heads:
        shape[seq_dim], shape[head_dim] = shape[seq_dim] * world, shape[head_dim] // world
    else:
        shape[seq_dim], shape[head_dim] = shape[seq_dim] // world, shape[head_dim] * world
    return shape


def _slices_for_each_rank(x, seq_dim, head_dim, world, to_heads):
    """x cut along the axis it hands out (heads to_heads, else the sequence) into world slices, as a
    contiguous [world, ...] tensor: slice r goes to rank r."""
    cut = head_dim if to_heads else seq_dim
    return x.unflatten(cut, (world, x.shape[cut] // world)).movedim(cut, 0).contiguous()


def _joined(received, seq_dim, head_dim, to_heads):
    """The received [world, ...] slices (slice r from rank r) joined along the axis they fill (the
    sequence to_heads, else the heads): axis 0 moves in front of it and the two become one."""
    fill = seq_dim if to_heads else head_dim
    return received.movedim(0, fill).flatten(fill, fill + 1)


def all_to_all(group, xs, seq_dims, head_dims, to_heads, names, check):
    """The moved tensors (see the module's doc). names: theirs, comma-separated. With check (the
    caller's options, one "name=value" a line), the ranks' agreement on them and on the shapes is
    checked first, then the head counts."""
    function = "ulysses_attention"
    names = names.split(",")
    if check:
        items = [(f"{n}.shape", tuple(x.shape)) for n, x in zip(names, xs)] + [("dtype", xs[0].dtype)]
        items += [(name, Shown(shown)) for name, shown in (line.split("=", 1) for line in check.split("\n"))]
        group.check_agreement(function, items, xs[0].device)
    world = group.size
    if to_heads:
        heads_divisible(function, names, xs, head_dims, world)
    if world == 1:
        return [x.clone() for x in xs]
    slices = [_slices_for_each_rank(x, s, h, world, to_heads) for x, s, h in zip(xs, seq_dims, head_dims)]
    sizes = [s[0].numel() for s in slices]
    received = group.all_to_all(torch.cat([s.reshape(world, -1) for s in slices], 1))
    moved = []
    for part, sliced, s, h in zip(received.split(sizes, 1), slices, seq_dims, head_dims):
        moved.append(_joined(part.reshape(sliced.shape), s, h, to_heads).contiguous())
    return moved
