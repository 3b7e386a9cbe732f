"""The custom ops of context parallelism, registered on first use (ops()):

- ``selfattn::ring_attention`` and ``selfattn::ring_attention_backward``: the ring's forward and
  backward on one rank (_ring_steps.py), the second the autograd formula of the first, as the
  package's own attention ops are (selfattn/_torch.py);
- ``selfattn::ulysses_all_to_all``: a list of tensors of one dtype from sequence shards to head
  shards (to_heads=True) or back, in one all_to_all_single; its own gradient is the opposite move.
  names: the tensors' names for messages, comma-separated; check: the options the ranks must agree
  on, one "name=value" a line (op arguments cannot be lists of strings).

Each has a fake implementation, so torch.compile traces a model through them without a graph break
(the collectives run inside the ops, at run time). The process group travels as its name. (No
``from __future__ import annotations`` here: the ops' signatures must be real types.)"""

from typing import List, Optional, Tuple

_ops = None


def ops():
    """The registered ops by name: ring_attention, ring_attention_backward, ulysses_all_to_all."""
    global _ops
    if _ops is None:
        _ops = _register()
    return _ops


def _register():
    import torch
    from torch import Tensor

    from . import _checks, _ring_steps
    from ._comm import Group, resolve
    from ._ulysses_moves import all_to_all, moved_shape

    def setting(group, q, k, v, cu_seqlens, layout, sharding, seq_len, causal, scale, window_left, window_right,
                softcap, path, deterministic, sinks, check):
        """(Group, Geometry, Mask, Options) of one call; with check, the ranks' agreement first."""
        ring = Group(group)
        offsets = None if cu_seqlens is None else _checks.host_offsets("ring_attention", cu_seqlens)
        window = (window_left, window_right)
        seq_len = None if seq_len < 0 else seq_len
        if check:
            options = dict(layout=layout, sharding=sharding, seq_len=seq_len, causal=causal, scale=scale,
                           window=window, softcap=softcap, path=path, deterministic=deterministic)
            ring.check_agreement("ring_attention", _checks.agreement_items(q, k, v, sinks, offsets, options),
                                 q.device)
        geometry, mask, steps_layout = _checks.ring_setting(
            "ring_attention", ring.size, q, k, v, sinks, offsets, layout, sharding, seq_len, causal, window, softcap)
        options = _ring_steps.Options(steps_layout, causal, scale, mask.window, softcap, path, deterministic)
        return ring, geometry, mask, options

    @torch.library.custom_op("selfattn::ring_attention", mutates_args=())
    def ring_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Optional[Tensor], group: str, layout: str,
                       sharding: str, seq_len: int, causal: Optional[str], scale: Optional[float], window_left: int,
                       window_right: int, softcap: Optional[float], path: str, deterministic: bool,
                       sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        ring, geometry, mask, options = setting(group, q, k, v, cu_seqlens, layout, sharding, seq_len, causal, scale,
                                                window_left, window_right, softcap, path, deterministic, sinks, True)
        return _ring_steps.forward(ring, geometry, mask, options, q, k, v, sinks)

    @ring_attention.register_fake
    def _(q, k, v, cu_seqlens, group, layout, *options):
        if cu_seqlens is not None:  # packed [total, heads, head_dim]; lse [heads, total]
            return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
        heads, seq = (q.shape[2], q.shape[1]) if layout == "bshd" else (q.shape[1], q.shape[2])
        return q.new_empty(q.shape), q.new_empty((q.shape[0], heads, seq), dtype=torch.float32)

    @torch.library.custom_op("selfattn::ring_attention_backward", mutates_args=())
    def ring_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor,
                                dlse: Optional[Tensor], cu_seqlens: Optional[Tensor], group: str, layout: str,
                                sharding: str, seq_len: int, causal: Optional[str], scale: Optional[float],
                                window_left: int, window_right: int, softcap: Optional[float], path: str,
                                deterministic: bool, sinks: Optional[Tensor],
                                return_dsinks: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        # The forward checked the ranks' agreement on these very arguments.
        ring, geometry, mask, options = setting(group, q, k, v, cu_seqlens, layout, sharding, seq_len, causal, scale,
                                                window_left, window_right, softcap, path, deterministic, sinks, False)
        dq, dk, dv, dsinks = _ring_steps.backward(ring, geometry, mask, options, q, k, v, out, dout, lse, dlse, sinks,
                                                  return_dsinks)
        return dq, dk, dv, dsinks if return_dsinks else q.new_empty((0,), dtype=torch.float32)

    @ring_attention_backward.register_fake
    def _(q, k, v, out, dout, lse, dlse, *options):
        sinks, return_dsinks = options[-2:]
        dsinks = sinks.new_empty(sinks.shape) if return_dsinks else q.new_empty((0,), dtype=torch.float32)
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks

    def save_ring(ctx, inputs, output):
        q, k, v, cu_seqlens, *options = inputs
        ctx.save_for_backward(q, k, v, *output, cu_seqlens, options[-1])
        ctx.options = options[:-1]  # all but sinks, saved above
        ctx.set_materialize_grads(False)

    def ring_gradients(ctx, dout, dlse):
        nothing = [None] * (len(ctx.options) + 1)  # cu_seqlens and the options
        if dout is None and dlse is None:
            return (None, None, None, *nothing, None)
        q, k, v, out, lse, cu_seqlens, sinks = ctx.saved_tensors
        if dout is None:  # a loss of lse alone
            dout = torch.zeros_like(out)
        return_dsinks = ctx.needs_input_grad[-1]
        dq, dk, dv, dsinks = ring_attention_backward(q, k, v, out, dout, lse, dlse, cu_seqlens, *ctx.options, sinks,
                                                     return_dsinks)
        return (dq, dk, dv, *nothing, dsinks if return_dsinks else None)

    ring_attention.register_autograd(ring_gradients, setup_context=save_ring)

    @torch.library.custom_op("selfattn::ulysses_all_to_all", mutates_args=())
    def ulysses_all_to_all(xs: List[Tensor], group: str, seq_dims: List[int], head_dims: List[int], to_heads: bool,
                           names: str, check: str) -> List[Tensor]:
        return all_to_all(Group(group), xs, seq_dims, head_dims, to_heads, names, check)

    @ulysses_all_to_all.register_fake
    def _(xs, group, seq_dims, head_dims, to_heads, names, check):
        world = torch.distributed.get_world_size(resolve(group))
        return [x.new_empty(moved_shape(x.shape, s, h, world, to_heads)) for x, s, h in zip(xs, seq_dims, head_dims)]

    def save_moves(ctx, inputs, output):
        _, ctx.group, ctx.seq_dims, ctx.head_dims, ctx.to_heads, ctx.names, _ = inputs
        ctx.moved = [(o.shape, o.dtype, o.device) for o in output]

    def move_gradients(ctx, grads):
        grads = [torch.zeros(shape, dtype=dtype, device=device) if g is None else g.contiguous()
                 for g, (shape, dtype, device) in zip(grads, ctx.moved)]
        back = ulysses_all_to_all(grads, ctx.group, ctx.seq_dims, ctx.head_dims, not ctx.to_heads, ctx.names, "")
        return back, None, None, None, None, None, None

    ulysses_all_to_all.register_autograd(move_gradients, setup_context=save_moves)

    return dict(ring_attention=ring_attention, ring_attention_backward=ring_attention_backward,
                ulysses_all_to_all=ulysses_all_to_all)
