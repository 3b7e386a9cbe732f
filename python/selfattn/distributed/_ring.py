"""ring_attention(): the public call over the custom op selfattn::ring_attention (_ops.py)."""
from __future__ import annotations

from typing import Any, Optional

from ._checks import window_sides
from ._comm import group_name
from ._ops import ops


def ring_attention(q: Any, k: Any, v: Any, *, group: Any = None, sharding: str = "contiguous", layout: str = "bhsd",
                   seq_len: Optional[int] = None, cu_seqlens: Any = None, causal: Optional[str] = None,
                   scale: Optional[float] = None, window: Optional[tuple] = None, softcap: Optional[float] = None,
                   sinks: Any = None, path: str = "auto", deterministic: bool = False, return_lse: bool = False) -> Any:
    """Attention over a sequence split across the ranks of `group`: this rank's rows of
    ``softmax(scale * Q K^T + mask) V`` over the whole sequence, K and V passed round the ring.

    - q: this rank's shard of the queries, [batch, heads, rows, head_dim] (layout="bhsd") or
      [batch, rows, heads, head_dim] ("bshd"); k, v: the same rows of the keys and values, with
      kv_heads dividing heads (GQA). Every rank holds the same number of rows (shard() pads).
    - group: a torch.distributed process group (None: the default one); every rank of it calls
      ring_attention with the same shapes and options (checked: an InvalidArgument on every rank
      names what differs).
    - sharding: "contiguous" (rank r holds rows [r L, (r+1) L) of the sequence) or "zigzag" (the
      sequence cut into 2W chunks, rank r holding chunks r and 2W-1-r: under a causal mask every
      rank then does the same work). shard(), unshard() and positions() follow the same rule.
    - seq_len: the sequence's real length when it was padded to fit (shard() pads at its end):
      rows at positions >= seq_len see nothing and are seen by nothing (out 0, lse -inf). None:
      world_size * rows.
    - cu_seqlens: packed documents: q, k, v are [rows, heads, head_dim] shards of one packed
      sequence (layout is not used), cu_seqlens int32 [docs + 1] the documents' offsets in the
      whole packed sequence (from 0; tokens past its last entry belong to no document), the same on
      every rank; a document may span ranks. It is read on the host (a list, or a tensor).
    - causal: None, or "top_left" / "bottom_right" (the same mask here: q and k are one sequence);
      window: (left, right), -1 unbounded, on global positions (attention()'s meaning); softcap,
      scale, path, deterministic: as attention() takes them; the ring skips the steps no rank needs
      (a causal window spanning fewer ranks than the group ends the ring early).
    - sinks: float32 [heads] (a tensor, or numbers), each row's softmax gets exp(sinks[h]) once.
    - returns out (q's shape and dtype), and with return_lse=True lse, float32 [batch, heads, rows]
      (packed: [heads, rows]), both for this rank's rows over the whole sequence.

    Differentiable (loss.backward() runs the ring backward: dK/dV travel back to their owner), and
    torch.compile traces it without a graph break. The gradient of sinks is this rank's rows' part:
    sum it over the ranks as any replicated parameter's (DDP does). alibi_slopes, bias and
    key_lengths are not taken (their positions do not survive the cut into blocks): use
    ulysses_attention, which runs attention() itself.

    A rank that fails mid-ring leaves the others waiting for its transfer: they raise when the
    process group's timeout runs out (init_process_group(timeout=...); NCCL's watchdog then ends
    them), so choose a timeout above one layer's time, not the 10-30 minute default, to fail fast.
    """
    import torch
    name = group_name(group)
    if cu_seqlens is not None and not isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = torch.tensor(list(cu_seqlens), dtype=torch.int32)
    if sinks is not None:
        sinks = torch.as_tensor(sinks, device=q.device).to(torch.float32)  # differentiable where it requires grad
    left, right = window_sides("ring_attention", window)
    out, lse = ops()["ring_attention"](
        q, k, v, cu_seqlens, name, layout, sharding, -1 if seq_len is None else int(seq_len), causal,
        None if scale is None else float(scale), left, right, None if softcap is None else float(softcap), path,
        bool(deterministic), sinks)
    return (out, lse) if return_lse else out
