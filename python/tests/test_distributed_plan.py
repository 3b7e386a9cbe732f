"""The plans of ring attention (selfattn/distributed/_plan.py) against a brute-force mask, and the
sharding helpers, in this process and without kernels: for every rank and ring step of many
layouts, lengths (padded ones too), masks, windows and packed documents, the library calls a step
makes (each read by the library's mask rule, restated in conftest.visible_range) cover exactly the
(query, key) pairs the global mask lets through, each pair once; zigzag gives every rank the same
causal work; a causal window ends the ring early. Skipped without PyTorch (the package needs it)."""
import itertools
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("selfattn.distributed")  # it needs torch.distributed and torch.library.custom_op (2.4)

import selfattn  # noqa: E402
from conftest import visible_range  # noqa: E402
from selfattn.distributed import padded_length, positions, shard, unshard  # noqa: E402
from selfattn.distributed._plan import INF, Geometry, Mask, block_calls, ring_plan  # noqa: E402

MASKS = [(None, None), ("top_left", None), ("bottom_right", (2, -1)), (None, (1, 1)), (None, (0, 3)),
         (None, (4, 0)), ("top_left", (0, 0)), (None, (-1, 2)), (None, (5, -1)), ("top_left", (7, 3))]


def call_pairs(call):
    """The (local row, local key) pairs one call lets through, by the library's rule: a dense call's
    mask on its own block, a varlen call's within each document (its cu)."""
    (r0, r1), (k0, k1) = call.rows, call.keys
    pieces = [(0, r1 - r0, 0, k1 - k0)] if call.cu is None else [(a, b, a, b) for a, b in zip(call.cu, call.cu[1:])]
    pairs = []
    for qa, qb, ka, kb in pieces:
        for i in range(qb - qa):
            begin, end, _ = visible_range(i, qb - qa, kb - ka, call.causal, call.window)
            pairs += [(r0 + qa + i, k0 + ka + j) for j in range(begin, end)]
    return pairs


def real_rows(geometry, rank):
    """(local row, global position) of each of the rank's rows that is not padding."""
    return [(local + t, start + t) for start, local, rows in geometry.segments(rank) for t in range(rows)]


def visible(mask, i, j):
    if not i - mask.left <= j <= i + mask.right:
        return False
    if mask.docs is None:
        return True
    return any(a <= i < b and a <= j < b for a, b in zip(mask.docs, mask.docs[1:]))


def documents(rng, seq_len):
    """Random offsets from 0 to seq_len, empty documents among them."""
    cuts = sorted(rng.choice(range(seq_len + 1)) for _ in range(rng.randint(0, 4)))
    return [0] + cuts + [seq_len]


def test_every_call_lets_through_exactly_the_visible_pairs_once():
    rng = random.Random(7)
    checked = 0
    for world, sharding, half in itertools.product((1, 2, 3, 4), ("contiguous", "zigzag"), (1, 2, 3)):
        local_len = 2 * half
        total = world * local_len
        for seq_len, (causal, window), packed in itertools.product({total, total - 1, max(total - half - 2, 0)},
                                                                    MASKS, (False, True)):
            geometry = Geometry(world, local_len, sharding, seq_len)
            mask = Mask.of(causal, window, documents(rng, seq_len) if packed else None)
            for rank, source in itertools.product(range(world), repeat=2):
                got = [p for call in block_calls(geometry, mask, rank, source) for p in call_pairs(call)]
                want = [(li, lj) for li, gi in real_rows(geometry, rank) for lj, gj in real_rows(geometry, source)
                        if visible(mask, gi, gj)]
                assert len(got) == len(set(got)), (geometry, mask, rank, source, "a pair counted twice")
                assert sorted(got) == sorted(want), (geometry, mask, rank, source)
                checked += 1
    assert checked > 5000


def test_zigzag_gives_every_rank_the_same_causal_work():
    for world in (2, 3, 4, 8):
        geometry, mask = Geometry(world, 8, "zigzag", world * 8), Mask.of("top_left", None)
        work = {sum(len(call_pairs(c)) for step in ring_plan(geometry, mask, r) for c in step) for r in range(world)}
        assert len(work) == 1, work
        contiguous = Geometry(world, 8, "contiguous", world * 8)
        uneven = {sum(len(call_pairs(c)) for step in ring_plan(contiguous, mask, r) for c in step)
                  for r in range(world)}
        assert len(uneven) == world  # rank r sees r + 1 shards' worth: what zigzag evens out


def test_a_causal_window_ends_the_ring_early():
    # 4 ranks of 16 rows: a causal window reaching 16 keys back needs the previous rank only (2
    # steps), 17 keys the one before too; without a window, or with keys on the right, all 4 steps.
    geometry = Geometry(4, 16, "contiguous", 64)
    steps = {window: len(ring_plan(geometry, Mask.of("top_left", window), 0)) for window in ((10, 0), (16, 0), (17, 0))}
    assert steps == {(10, 0): 2, (16, 0): 2, (17, 0): 3}
    assert len(ring_plan(geometry, Mask.of("top_left", None), 0)) == 4
    both_sides = ring_plan(geometry, Mask.of(None, (3, 3)), 0)  # the right neighbour comes at the last step
    assert len(both_sides) == 4 and both_sides[2] == []


def test_own_keys_under_a_causal_mask_are_one_call():
    calls = block_calls(Geometry(4, 8, "zigzag", 30), Mask.of("top_left", None), 0, 0)
    assert [(c.rows, c.keys, c.causal) for c in calls] == [((0, 6), (0, 6), "top_left")]  # rank 0: 4 + 2 real rows
    assert Mask.of("bottom_right", (5, 7)).right == 0 and Mask.of(None, (-1, 2)).left == INF


@pytest.mark.parametrize("sharding", ["contiguous", "zigzag"])
@pytest.mark.parametrize("length,world", [(12, 3), (13, 3), (7, 4), (1, 2)])
def test_shard_and_unshard_are_inverse_with_padding(sharding, length, world):
    x = torch.arange(2 * length * 3, dtype=torch.float32).view(2, length, 3)
    shards = [shard(x, world, r, sharding=sharding, dim=1) for r in range(world)]
    padded = padded_length(length, world, sharding)
    assert padded % (world * (2 if sharding == "zigzag" else 1)) == 0 and padded - length < 2 * world
    for r, piece in enumerate(shards):
        where = positions(length, world, r, sharding)
        assert piece.shape == (2, padded // world, 3)
        for row, position in enumerate(where.tolist()):
            want = x[:, position] if position < length else torch.zeros(2, 3)
            assert torch.equal(piece[:, row], want)
    assert torch.equal(unshard(shards, sharding=sharding, dim=1, seq_len=length), x)
    assert sorted(torch.cat([positions(length, world, r, sharding) for r in range(world)]).tolist()) == \
        list(range(padded))


def test_zigzag_positions_and_bad_arguments():
    assert positions(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
    assert positions(8, 2, 1, "zigzag").tolist() == [2, 3, 4, 5]
    with pytest.raises(selfattn.InvalidArgument, match="sharding expected 'contiguous' or 'zigzag', got 'ring'"):
        shard(torch.zeros(4), 2, 0, sharding="ring", dim=0)
    with pytest.raises(selfattn.InvalidArgument, match=r"rank expected an int in \[0, world_size = 2\), got 2"):
        positions(4, 2, 2)
