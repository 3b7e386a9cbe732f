"""PyTorch integration: attention() on torch tensors goes through a torch.library custom op,
``selfattn::attention``, with a fake (meta) implementation, so torch.compile traces it without
running it. Imported only when a torch tensor reaches selfattn.attention().

There is no autograd formula: the library has no backward pass yet, so the op's outputs carry no
gradient history (torch warns when inputs require grad and backward reaches the op)."""
from __future__ import annotations

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

    return attention
