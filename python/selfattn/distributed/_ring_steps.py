"""Ring attention's forward and backward on one rank, eagerly: the bodies of the custom ops
selfattn::ring_attention and ring_attention_backward (_ops.py).

Forward. Each step first issues the exchange that brings the next step's K/V (packed as one tensor
[2, *k.shape]: one message per step) and only then attends this rank's queries to the K/V it holds,
so on a GPU the transfer runs beside the attention. Each call of the plan (_plan.py) gives a partial
out (in q's dtype: the library writes out so) and its fp32 lse; they are merged into an fp32
accumulator (out rescaled by exp(lse_part - lse_sum)) and the result is cast to q's dtype once, at
the end. Sinks join afterwards, once per row, through
the lse: lse' = logaddexp(lse, sink), out' = out exp(lse - lse').

Backward. The library's backward of each call, given the final out and final lse (so its P is the
global softmax's, exactly as in the single-device backward), yields dq for this rank's rows
(accumulated here in fp32) and dk, dv for the keys the step brought. Those travel on round the ring
behind the K/V, in fp32: at step s the rank adds its part to the dK/dV it received (the keys'
partial sum so far) and passes them on; at the last step they go straight to the keys' owner, which
adds its own step-0 part. So the owner's own part never travels, and every other part travels once
per step: W - 1 sends of dK/dV per rank for a full ring. dsinks is the gradient of this rank's rows
only (-sum of exp(sink - lse) (D - dlse), D = rowsum(dout * out)): a replicated parameter's gradient
is summed over the ranks by whatever reduces the others (DDP, FSDP, an all_reduce).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ._comm import GRAD_TAG, KV_TAG, Group
from ._plan import Geometry, Mask, ring_plan


@dataclass(frozen=True)
class Options:
    layout: str  # "bhsd", "bshd", or "packed" ([total, heads, head_dim], with documents)
    causal: Optional[str]
    scale: Optional[float]
    window: Optional[Tuple[int, int]]
    softcap: Optional[float]
    path: str
    deterministic: bool

    @property
    def seq_axis(self) -> int:
        return {"bhsd": 2, "bshd": 1, "packed": 0}[self.layout]

    @property
    def lse_seq_axis(self) -> int:
        return 1 if self.layout == "packed" else 2  # lse: [batch, heads, seq] or [heads, total]

    def lse_shape(self, q):
        if self.layout == "packed":
            return q.shape[1], q.shape[0]
        heads = q.shape[2] if self.layout == "bshd" else q.shape[1]
        return q.shape[0], heads, q.shape[self.seq_axis]

    def lse_like_out(self, lse):
        """lse as a view that broadcasts against out (a length-1 head_dim axis)."""
        if self.layout == "bhsd":
            return lse.unsqueeze(-1)
        return (lse.transpose(1, 2) if self.layout == "bshd" else lse.t()).unsqueeze(-1)

    def row_sums(self, x):
        """x summed over head_dim, in lse's shape."""
        summed = x.sum(-1)
        if self.layout == "bhsd":
            return summed
        return summed.transpose(1, 2) if self.layout == "bshd" else summed.t()


def _rows(x, span, axis):
    return x.narrow(axis, span[0], span[1] - span[0])


def _library_options(call, options):
    return dict(causal=call.causal, window=call.window, scale=options.scale, softcap=options.softcap,
                path=options.path)


def _documents(call, device):
    """A varlen call's offsets as the library takes them (int32 where q lives), and the longest."""
    return (torch.tensor(call.cu, dtype=torch.int32, device=device),
            max(b - a for a, b in zip(call.cu, call.cu[1:])))


def _attend(q, k, v, call, options):
    """(out, lse) of one call of the plan, in q's dtype and fp32."""
    import selfattn
    axis = options.seq_axis
    q, k, v = _rows(q, call.rows, axis), _rows(k, call.keys, axis), _rows(v, call.keys, axis)
    mods = _library_options(call, options)
    if options.layout == "packed" and call.cu is not None:
        cu, longest = _documents(call, q.device)
        return selfattn.attention_varlen(q, k, v, cu, cu, max_seqlen_q=longest, max_seqlen_k=longest,
                                         return_lse=True, **mods)
    if options.layout == "packed":  # one document's block: [1, rows, heads, head_dim]
        out, lse = selfattn.attention(q[None], k[None], v[None], layout="bshd", return_lse=True, **mods)
        return out[0], lse[0]
    return selfattn.attention(q, k, v, layout=options.layout, return_lse=True, **mods)


def _attend_backward(q, k, v, out, dout, lse, dlse, call, options):
    """(dq, dk, dv) in fp32 of one call of the plan, from the final out and lse."""
    import selfattn
    axis, lse_axis = options.seq_axis, options.lse_seq_axis
    q, out, dout = (_rows(t, call.rows, axis) for t in (q, out, dout))
    k, v = _rows(k, call.keys, axis), _rows(v, call.keys, axis)
    lse = _rows(lse, call.rows, lse_axis).contiguous()
    dlse = None if dlse is None else _rows(dlse, call.rows, lse_axis).contiguous()
    mods = dict(_library_options(call, options), deterministic=options.deterministic, grad_dtype="float32",
                dlse=dlse)
    if options.layout == "packed" and call.cu is not None:
        cu, longest = _documents(call, q.device)
        return selfattn.attention_varlen_backward(q, k, v, out, dout, lse, cu, cu, max_seqlen_q=longest,
                                                  max_seqlen_k=longest, **mods)
    if options.layout == "packed":
        if dlse is not None:
            mods["dlse"] = dlse[None]
        grads = selfattn.attention_backward(q[None], k[None], v[None], out[None], dout[None], lse[None],
                                            layout="bshd", **mods)
        return tuple(g[0] for g in grads)
    return selfattn.attention_backward(q, k, v, out, dout, lse, layout=options.layout, **mods)


def _weight(part, total):
    """exp(part - total), 0 where total is -inf (no key on either side: nothing to weigh)."""
    return torch.where(total == -torch.inf, torch.zeros_like(total), torch.exp(part - total))


def _merge(out, lse, out_part, lse_part, options):
    """Merges a partial result into the fp32 accumulators out, lse (views: written in place)."""
    total = torch.logaddexp(lse, lse_part)
    out.mul_(options.lse_like_out(_weight(lse, total)))
    out.add_(out_part.float() * options.lse_like_out(_weight(lse_part, total)))
    lse.copy_(total)


def _real_rows(geometry, rank, options, lse):
    """A mask shaped like lse: True for this rank's rows at global positions < seq_len."""
    real = torch.zeros(geometry.local_len, dtype=torch.bool)
    for _, local, rows in geometry.segments(rank):
        real[local:local + rows] = True
    shape = [1] * lse.dim()
    shape[options.lse_seq_axis] = geometry.local_len
    return real.to(lse.device).view(shape)


def _sinks_like_lse(sinks, options, lse):
    """sinks [heads] as a view that broadcasts against lse."""
    return sinks.view(-1, 1) if options.layout == "packed" else sinks.view(1, -1, 1)


def forward(group: Group, geometry: Geometry, mask: Mask, options: Options, q, k, v, sinks):
    """This rank's (out, lse) of the attention over the whole sequence."""
    steps = ring_plan(geometry, mask, group.rank)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(options.lse_shape(q), -torch.inf, dtype=torch.float32, device=q.device)
    kv = torch.stack((k, v))
    for step, calls in enumerate(steps):
        incoming = group.exchange(kv, 1, -1, KV_TAG) if step + 1 < len(steps) else None
        for call in calls:
            out_part, lse_part = _attend(q, kv[0], kv[1], call, options)
            _merge(_rows(out, call.rows, options.seq_axis), _rows(lse, call.rows, options.lse_seq_axis),
                   out_part, lse_part, options)
        if incoming is not None:
            kv = incoming.wait()
    if sinks is not None:
        with_sink = torch.logaddexp(lse, _sinks_like_lse(sinks, options, lse))
        with_sink = torch.where(_real_rows(geometry, group.rank, options, lse), with_sink, lse)
        out.mul_(options.lse_like_out(_weight(lse, with_sink)))
        lse = with_sink
    return out.to(q.dtype), lse


def backward(group: Group, geometry: Geometry, mask: Mask, options: Options, q, k, v, out, dout, lse, dlse,
             sinks, return_dsinks: bool):
    """This rank's (dq, dk, dv, dsinks or None) for the upstream gradients dout and dlse (or None)."""
    steps = ring_plan(geometry, mask, group.rank)
    dout = dout.contiguous()
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = torch.stack((k, v))
    own = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)  # this rank's keys, its own part
    passing = None  # the dK/dV exchange in flight
    for step, calls in enumerate(steps):
        last = step + 1 == len(steps)
        incoming = None if last else group.exchange(kv, 1, -1, KV_TAG)
        grads = own if step == 0 else torch.zeros_like(own)
        for call in calls:
            dq_part, dk_part, dv_part = _attend_backward(q, kv[0], kv[1], out, dout, lse, dlse, call, options)
            _rows(dq, call.rows, options.seq_axis).add_(dq_part)
            _rows(grads[0], call.keys, options.seq_axis).add_(dk_part)
            _rows(grads[1], call.keys, options.seq_axis).add_(dv_part)
        if step >= 1:
            if passing is not None:
                grads.add_(passing.wait())  # the keys' partial sum from the ranks before
            # On round the ring, or at the last step home to the keys' owner, `step` ranks back.
            passing = group.exchange(grads, 1 if not last else -step, -1 if not last else step, GRAD_TAG)
        if incoming is not None:
            kv = incoming.wait()
    if passing is not None:
        own.add_(passing.wait())
    dsinks = None
    if return_dsinks:
        d = options.row_sums(dout.float() * out.float())
        d = d - dlse if dlse is not None else d
        real = _real_rows(geometry, group.rank, options, lse) & (lse > -torch.inf)
        p_sink = torch.where(real, torch.exp(_sinks_like_lse(sinks, options, lse) - lse), torch.zeros_like(lse))
        per_head = -(p_sink * d)
        dsinks = per_head.sum(1) if options.layout == "packed" else per_head.sum((0, 2))
    # dk and dv are copies: views of one tensor would alias each other (custom ops may not return that).
    return dq.to(q.dtype), own[0].to(k.dtype, copy=True), own[1].to(v.dtype, copy=True), dsinks
