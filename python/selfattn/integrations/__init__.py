"""Modules that put selfattn behind another library's Python API: a drop-in for another attention
library's calls (a project switches by changing an import), or an adapter that registers selfattn
with a framework. Each is imported on its own (``import selfattn.integrations.flash_attn``);
importing selfattn imports none of them.

- :mod:`selfattn.integrations.flash_attn`: FlashAttention's ``flash_attn_func``,
  ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` (needs PyTorch).
- :mod:`selfattn.integrations.transformers`: ``register()`` makes selfattn an attention
  implementation of Hugging Face transformers (``attn_implementation="selfattn"``; needs PyTorch,
  and transformers when register() runs).

These modules use the package's public API only (tests/test_import_graph.py checks it).
"""
