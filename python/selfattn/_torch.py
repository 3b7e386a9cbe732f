"""PyTorch integration: attention() on torch tensors goes through a torch.library custom op,
``selfattn::attention``, with a fake (meta) implementation, so torch.compile traces it without
running it. Imported only when a torch tensor reaches selfattn.attention().

Autograd: the op's formula (torch.library.register_autograd, the custom-op form of a
torch.autograd.Function) saves q, k, v, out and lse and runs the library's backward through a
second custom op, ``selfattn::attention_backward`` (also with a fake implementation). Only out is
differentiable: a gradient flowing into the returned lse raises NotImplementedError (the library's
backward takes no dlse)."""

from typing import Optional, Tuple

_op = None
_failed = False


def attention_op():
    """The registered custom op, or None where this PyTorch lacks torch.library.custom_op (< 2.4)."""
    global _op, _failed
    if _op is None and not _failed:
        try:
            _op = _register()
        except (ImportError, AttributeError):
            _failed = True
    return _op


def _register():
    import torch
    from torch import Tensor

    @torch.library.custom_op("selfattn::attention", mutates_args=())
    def attention(q: Tensor, k: Tensor, v: Tensor, causal: Optional[str], scale: Optional[float], path: str,
                  key_lengths: Optional[Tensor], layout: str) -> Tuple[Tensor, Tensor]:
        from . import _attention
        return _attention(q, k, v, causal=causal, scale=scale, path=path, key_lengths=key_lengths, return_lse=True,
                          out=None, layout=layout, context=None)

    @attention.register_fake
    def _(q, k, v, causal, scale, path, key_lengths, layout):
        # out has q's shape in either layout; lse is [batch, heads, seq_q].
        heads, seq_q = (q.shape[1], q.shape[2]) if layout == "bhsd" else (q.shape[2], q.shape[1])
        return torch.empty_like(q), q.new_empty((q.shape[0], heads, seq_q), dtype=torch.float32)

    @torch.library.custom_op("selfattn::attention_backward", mutates_args=())
    def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor,
                           causal: Optional[str], scale: Optional[float], path: str, key_lengths: Optional[Tensor],
                           layout: str) -> Tuple[Tensor, Tensor, Tensor]:
        from . import attention_backward as library_backward
        return library_backward(q, k, v, out, dout.contiguous(), lse, causal=causal, scale=scale, path=path,
                                key_lengths=key_lengths, layout=layout)

    @attention_backward.register_fake
    def _(q, k, v, out, dout, lse, causal, scale, path, key_lengths, layout):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx, inputs, output):
        q, k, v, causal, scale, path, key_lengths, layout = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, key_lengths)
        ctx.options = (causal, scale, path, layout)
        ctx.set_materialize_grads(False)

    def backward(ctx, dout, dlse):
        if dlse is not None:
            raise NotImplementedError("selfattn: the gradient of lse is not supported (the backward takes none); "
                                      "use only out in the loss")
        q, k, v, out, lse, key_lengths = ctx.saved_tensors
        causal, scale, path, layout = ctx.options
        if dout is None:
            return None, None, None, None, None, None, None, None
        dq, dk, dv = attention_backward(q, k, v, out, dout, lse, causal, scale, path, key_lengths, layout)
        return dq, dk, dv, None, None, None, None, None

    attention.register_autograd(backward, setup_context=setup_context)
    return attention
