"""Context parallelism: one attention over a sequence split across the ranks of a torch.distributed
process group (NCCL on GPUs, gloo on CPUs, where the tensors run on the sim), forward and backward.

- :func:`ring_attention`: K and V travel round the ring, one transfer per step issued before the
  step's attention, so it overlaps compute; partial results are merged through their LSE in fp32.
  Any head count; memory per rank falls with the number of ranks.
- :func:`ulysses_attention`: all-to-all from sequence shards to head shards, attention() on the
  whole sequence for heads / W heads, and back: fewer, larger messages, every option of
  attention(), but the heads (and kv heads) must divide among the ranks.
- :func:`shard`, :func:`unshard`, :func:`positions`, :func:`padded_length`, :func:`gather`: the
  sequence shards ("contiguous", or "zigzag" for causal masks) and the padding rule.

Needs PyTorch (2.4 or later: torch.library.custom_op) with torch.distributed; importing selfattn
does not import this package. It uses selfattn's public API only, and selfattn._torch.ops() once,
here (tests/test_import_graph.py): importing this package registers the custom ops, selfattn's own
and its own, so that torch.compile finds them registered (a traced call cannot register an op).
"""
import torch as _torch_module

if not hasattr(_torch_module.library, "custom_op"):
    raise ImportError(f"selfattn.distributed needs PyTorch 2.4 or later (torch.library.custom_op), found "
                      f"{_torch_module.__version__}")

from .. import _torch as _package_ops  # noqa: E402
from ._ops import ops as _ops  # noqa: E402
from ._ring import ring_attention  # noqa: E402
from ._sharding import gather, padded_length, positions, shard, unshard  # noqa: E402
from ._ulysses import ulysses_attention  # noqa: E402

_package_ops.ops()
_ops()

__all__ = ["ring_attention", "ulysses_attention", "shard", "unshard", "positions", "padded_length", "gather"]
