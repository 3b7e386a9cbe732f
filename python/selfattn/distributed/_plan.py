"""Which attention calls each ring step makes: plain Python, no torch, so that the tests can hold every
plan against a brute-force mask (test_distributed_plan.py).

The sequence (one global sequence of seq_len tokens, padded to world * local_len) is cut into
segments: each rank holds one (sharding="contiguous": rank r the rows [r L, (r+1) L)) or two
(sharding="zigzag": chunks r and 2W-1-r of 2W chunks of L/2 rows, so that under a causal mask every
rank has the same work). Ring step s brings rank r the keys of rank (r - s) mod W. For one pair of
(query rank, key rank) the plan lists the calls of the library that cover exactly the visible
(query, key) pairs, each pair once:

- the global mask: key j is visible to query i iff i - left <= j <= i + right, with right = 0 under a
  causal mask (or the window's right side if smaller) and an unbounded side where there is no limit
  (q and k are one sequence, so causal="top_left" and "bottom_right" are the same mask);
- in a block of n query rows and m keys whose first rows start at global positions gq and gk, that
  is a band: j visible to i iff i + lo <= j <= i + hi (block-local indices), lo = gq - gk - left,
  hi = gq - gk + right;
- the library expresses a band whose diagonal lies inside it: with causal=None its window (wl, wr) is
  aligned to i' = i + m - n (attention()'s docstring), so it gives lo = m - n - wl, hi = m - n + wr
  for wl, wr >= 0. band_call() first drops the rows and keys that see nothing (a slice, never a
  dense mask), which moves the diagonal into the band;
- packed documents (cu_seqlens): a key is visible only within the query's document. In a block of one
  segment with itself, every document meets the block in the same rows and keys, so one varlen call
  with the caller's mask covers it; two different segments share at most one document (a document is
  an interval, and two disjoint intervals cannot both contain the last row of the earlier segment),
  so the plan gives each shared document its own dense band call.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Tuple

INF = math.inf
SHARDINGS = ("contiguous", "zigzag")


@dataclass(frozen=True)
class Call:
    """One call of the library: query rows [rows[0], rows[1]) of this rank's shard against keys
    [keys[0], keys[1]) of the shard the step brought, with causal and window as attention() takes
    them; cu: for packed documents, the offsets of the documents inside the rows (the same for the
    keys: attention_varlen(cu_seqlens_q=cu, cu_seqlens_k=cu)), else None."""
    rows: Tuple[int, int]
    keys: Tuple[int, int]
    causal: Optional[str] = None
    window: Optional[Tuple[int, int]] = None
    cu: Optional[Tuple[int, ...]] = None

    @property
    def full(self) -> bool:
        return self.causal is None and self.window is None and self.cu is None


@dataclass(frozen=True)
class Geometry:
    """How the sequence lies on the ranks: world ranks of local_len rows each, cut by `sharding`;
    rows at global positions >= seq_len are padding (no key, no query)."""
    world: int
    local_len: int
    sharding: str
    seq_len: int

    def segments(self, rank: int):
        """(global start, local start, rows) of each of the rank's segments, rows cut at seq_len."""
        if self.sharding == "contiguous":
            pieces = [(rank * self.local_len, 0, self.local_len)]
        else:
            chunk = self.local_len // 2
            pieces = [(rank * chunk, 0, chunk), ((2 * self.world - 1 - rank) * chunk, chunk, chunk)]
        return [(start, local, max(0, min(rows, self.seq_len - start))) for start, local, rows in pieces]


@dataclass(frozen=True)
class Mask:
    """The global mask: left, right as in i - left <= j <= i + right (INF: unbounded), and the
    documents' offsets (cu_seqlens, starting at 0) or None."""
    left: float
    right: float
    docs: Optional[Tuple[int, ...]] = None
    causal: Optional[str] = None  # as the caller gave it (varlen calls take it so)
    window: Optional[Tuple[int, int]] = None

    @staticmethod
    def of(causal, window, docs=None):
        left, right = window if window is not None else (-1, -1)
        left = INF if left < 0 else left
        right = INF if right < 0 else right
        if causal is not None:
            right = min(right, 0)
        return Mask(left, right, None if docs is None else tuple(docs), causal, window)


def band_call(n, m, lo, hi):
    """The call for a block of n rows and m keys in which key j is visible to row i iff
    i + lo <= j <= i + hi (lo, hi may be -INF, INF): (row start, row end, key start, key end, causal,
    window) inside the block, or None when no pair is visible."""
    if n <= 0 or m <= 0 or lo > hi:
        return None
    r0 = k0 = 0
    if hi < 0:  # rows i < -hi see no key (j <= i + hi < 0)
        r0 = int(-hi)
    elif lo > 0:  # keys j < lo are seen by no row (j >= i + lo >= lo)
        k0 = int(lo)
    lo, hi = lo + r0 - k0, hi + r0 - k0  # now lo <= 0 <= hi
    m = min(m - k0, n - r0 + hi)  # keys past the last row's reach
    n = min(n - r0, m - lo)  # rows whose first visible key is past the last key
    if n <= 0 or m <= 0:
        return None
    m, n = int(m), int(n)
    if lo <= 1 - n and hi >= m - 1:
        return r0, r0 + n, k0, k0 + m, None, None  # every pair
    # The diagonal d = m - n lies in [lo, hi] after the cuts: m <= n + hi, and n <= m - lo.
    d = m - n
    left = -1 if lo == -INF else int(d - lo)
    right = -1 if hi == INF else int(hi - d)
    if right == 0:  # the same mask, said as the causal mask (its tiles skipped as such)
        return r0, r0 + n, k0, k0 + m, "bottom_right", None if left == -1 else (left, -1)
    return r0, r0 + n, k0, k0 + m, None, (left, right)


def _dense(rows0, keys0, n, m, shift, mask):
    """The call (or None) for a block of n rows at local row rows0 against m keys at local key keys0,
    the rows starting `shift` global positions after the keys."""
    found = band_call(n, m, shift - mask.left, shift + mask.right)
    if found is None:
        return None
    r0, r1, k0, k1, causal, window = found
    return Call((rows0 + r0, rows0 + r1), (keys0 + k0, keys0 + k1), causal, window)


def _documents_between(docs, begin, end):
    """(start, end) of each non-empty document that meets the global rows [begin, end)."""
    first = max(bisect.bisect_right(docs, begin) - 1, 0)
    found = []
    for d in range(first, len(docs) - 1):
        if docs[d] >= end:
            break
        if docs[d + 1] > max(docs[d], begin):
            found.append((docs[d], docs[d + 1]))
    return found


def _segment_pair(query, key, mask):
    """The calls for one query segment against one key segment."""
    (gq, lq, n), (gk, lk, m) = query, key
    if n == 0 or m == 0:
        return []
    if mask.docs is None:
        call = _dense(lq, lk, n, m, gq - gk, mask)
        return [] if call is None else [call]
    if gq == gk:  # the segment with itself: each document in the same rows and keys
        inside = _documents_between(mask.docs, gq, gq + n)
        if not inside:
            return []
        cu = [max(a, gq) - gq for a, _ in inside] + [min(inside[-1][1], gq + n) - gq]
        first, last = cu[0], cu[-1]
        return [Call((lq + first, lq + last), (lk + first, lk + last), mask.causal, mask.window,
                     tuple(c - first for c in cu))]
    calls = []
    for a, b in _documents_between(mask.docs, gq, gq + n):
        qa, qb, ka, kb = max(a, gq), min(b, gq + n), max(a, gk), min(b, gk + m)
        if ka < kb:
            call = _dense(lq + qa - gq, lk + ka - gk, qb - qa, kb - ka, qa - ka, mask)
            calls += [] if call is None else [call]
    return calls


def _coalesced(calls):
    """The calls with pairs of unmasked ones over adjacent rows (the same keys), or adjacent keys (the
    same rows), made one: fewer, larger calls for the same pairs."""
    calls = list(calls)
    merged = True
    while merged:
        merged = False
        for a in range(len(calls)):
            for b in range(len(calls)):
                x, y = calls[a], calls[b]
                if a == b or not (x.full and y.full):
                    continue
                if x.keys == y.keys and x.rows[1] == y.rows[0]:
                    joined = Call((x.rows[0], y.rows[1]), x.keys)
                elif x.rows == y.rows and x.keys[1] == y.keys[0]:
                    joined = Call(x.rows, (x.keys[0], y.keys[1]))
                else:
                    continue
                calls = [c for i, c in enumerate(calls) if i not in (a, b)] + [joined]
                merged = True
                break
            if merged:
                break
    return sorted(calls, key=lambda c: (c.rows, c.keys))


def block_calls(geometry: Geometry, mask: Mask, rank: int, source: int):
    """The calls that attend rank `rank`'s queries to rank `source`'s keys."""
    if (rank == source and mask.docs is None and mask.left == INF and mask.right == 0
            and geometry.seq_len > 0):
        # Own keys under the plain causal mask: the shard's real rows are a prefix of it, in the
        # global order (segments ascend; padding only ever cuts the last real one), so the causal
        # mask on the local order is the global one: one call instead of one per segment pair.
        real = sum(rows for _, _, rows in geometry.segments(rank))
        return [Call((0, real), (0, real), "top_left")] if real else []
    calls = []
    for query in geometry.segments(rank):
        for key in geometry.segments(source):
            calls += _segment_pair(query, key, mask)
    return _coalesced(calls)


@lru_cache(maxsize=64)
def ring_plan(geometry: Geometry, mask: Mask, rank: int):
    """This rank's calls at each ring step (a list per step, steps 0 .. last), where last is the last
    step at which any rank has a call: the ring stops there on every rank (a sliding window that
    spans few ranks needs few steps)."""
    world = geometry.world
    last = 0
    for step in range(world):
        if any(block_calls(geometry, mask, r, (r - step) % world) for r in range(world)):
            last = step
    return [block_calls(geometry, mask, rank, (rank - step) % world) for step in range(last + 1)]
