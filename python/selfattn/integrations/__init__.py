"""Drop-in modules that give another attention library's Python API over selfattn's calls, so a
project switches by changing an import. Each is imported on its own (``import
selfattn.integrations.flash_attn``); importing selfattn imports none of them.

- :mod:`selfattn.integrations.flash_attn`: FlashAttention's ``flash_attn_func``,
  ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` (needs PyTorch).

These modules use the package's public API only (tests/test_import_graph.py checks it).
"""
