"""selfattn as an attention implementation of Hugging Face transformers. One call registers it::

    import selfattn.integrations.transformers as selfattn_transformers
    selfattn_transformers.register()                      # name="selfattn"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="selfattn")

register(name) adds :func:`attention_forward` to transformers' ``AttentionInterface`` and
:func:`attention_mask` to its ``AttentionMaskInterface`` under the same name. Both are needed:
transformers builds no mask at all (not even for padding) for an implementation without a mask
function. Importing this module imports torch; transformers is imported by register() only.

The mask function decides, once per forward pass and mask type, which of two forms every layer gets:

- None, when the mask is the plain causal one over the keys the layer receives: no padding among
  them, and the last query is the last key (q_offset + q_length == kv_offset + kv_length; so a
  prefill, and decoding with DynamicCache, including its sliding-window layers). attention_forward
  then calls selfattn with ``causal="bottom_right"`` and, for a layer with
  ``sliding_window=W``, ``window=(W - 1, 0)`` (the key W - 1 before the query is the last it sees,
  as transformers' sliding masks have it). No bias is read, so the fused kernel skips the tiles the
  masks hide. That the layer's ``sliding_window`` argument matches the mask type is the model's
  contract, the same one transformers' flash-attention path relies on.
- Otherwise transformers' own boolean mask ``[batch, 1, q_length, kv_length]`` (True where a query
  sees a key), built once (``sdpa_mask``, so
  padding, offsets, packed sequences and or/and mask functions all mean what they mean there) and
  passed to every layer as selfattn's ``bias`` with no causal mask or window on top: the kernels
  read it as bytes (selfattn's boolean bias), no float copy. That covers
  left padding, static caches (q_offset a tensor, kv_length the cache's capacity: the bias hides
  the slots not written yet), a padding mask under torch.compile (its values are not read there)
  and every non-causal (bidirectional) mask. Telling the two apart reads the 2D padding mask, where
  there is one, once per forward pass and mask type (on a GPU that waits for it, as transformers'
  sdpa path does).

A padded batch or a static cache still costs a mask of batch * q_length * kv_length bytes per
forward pass whose tiles are all read (selfattn's key_start and q_offset would let the kernels skip
them, but transformers hands over a mask, not the offsets behind it). A 4D mask the caller passes
in (transformers hands it over unchanged) is used as it is when it is boolean, float32 or q's dtype
(additive), converted once per layer call when it is another float dtype.

What attention_forward maps (the arguments transformers' models pass):

- query [batch, heads, q, head_dim], key and value [batch, kv_heads, k, head_dim] go to selfattn as
  views in layout "bshd" (transposed, not copied); kv_heads dividing heads is selfattn's grouped-
  query attention, so key and value are never repeated. The output comes back [batch, q, heads,
  head_dim], the layout transformers expects, with no copy. Value's head_dim may differ from
  query's and key's (DeepSeek-V3's multi-head latent attention passes values of 128 beside queries
  and keys of 192): the output takes value's, and nothing is padded (selfattn's automatic path runs
  it on a path that takes two head dims).
- scaling: selfattn's scale (None: 1/sqrt(head_dim)). softcap: selfattn's softcap (Gemma 2's
  attn_logit_softcapping). s_aux (gpt-oss's ``module.sinks``): selfattn's sinks, in float32; they
  get their gradient.
- is_causal (else ``module.is_causal``, else True) only matters when the mask is None.
- Gradients: through selfattn's torch custom ops, to query, key, value and sinks.

Where the result differs from eager attention: a query that sees no key at all (under left
padding, the row of a pad token) gives 0, where eager's finite mask value averages it over every
key; no real token sees a pad key, so nothing else changes. The attention weights are never
formed: the second value returned is None, as with sdpa and flash attention.

Dropout: the models pass ``config.attention_dropout`` while training (0 in evaluation); it is
selfattn's attention dropout (``dropout_p``, the seed drawn from torch's default generator, so
torch.manual_seed reproduces a step; the backward regenerates the forward's mask).

Refused, never ignored: position_bias (NotAvailable: T5-style learned biases, and selfattn computes no gradient for a
bias), a mask that is not a tensor (NotAvailable: flex attention's BlockMask), sequence boundaries
``cu_seq_lens_q`` with no mask (NotAvailable: continuous batching and paged caches; packed
sequences work through their mask, built when the call has position_ids and no cache).
"""
from __future__ import annotations

import numbers

import torch

import selfattn
from selfattn import InvalidArgument, NotAvailable

__all__ = ["register", "attention_forward", "attention_mask"]


def register(name: str = "selfattn") -> str:
    """Registers :func:`attention_forward` with transformers' AttentionInterface and
    :func:`attention_mask` with its AttentionMaskInterface under `name`, for every model of the
    process. Returns `name`, the value for ``attn_implementation=``. Raises NotAvailable without
    transformers."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"register: name expected a non-empty str, got {name!r}")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise NotAvailable(f"register: transformers is not installed, or has no AttentionInterface and "
                           f"masking_utils.AttentionMaskInterface (this adapter is tested with transformers 5): "
                           f"{e}") from e
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask)
    return name


def attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask=None, allow_is_causal_skip=True, local_size=None, config=None, **kwargs):
    """transformers' mask function for this implementation (AttentionMaskInterface's signature):
    None where attention_forward's own causal mask and window give the mask exactly, else the
    boolean mask [batch_size, 1, q_length, kv_length] (True: seen). See the module's doc."""
    if allow_is_causal_skip and _plain_causal(q_length, kv_length, q_offset, kv_offset, attention_mask, local_size,
                                              config):
        return None
    from transformers.masking_utils import causal_mask_function, sdpa_mask
    kwargs.pop("allow_is_bidirectional_skip", None)  # a skipped bidirectional mask would read as causal
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function or causal_mask_function,
                     attention_mask=attention_mask, allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                     local_size=local_size, config=config, **kwargs)


def _plain_causal(q_length, kv_length, q_offset, kv_offset, padding, local_size, config):
    """Whether the mask is causal="bottom_right" (with the layer's sliding window) over the keys
    the layer gets: see the module's doc."""
    if isinstance(q_offset, torch.Tensor):
        return False  # a static cache's: reading it would break a compiled graph, or wait for the GPU
    if q_offset + q_length != kv_offset + kv_length:
        return False  # the queries do not end at the last key (a static cache's capacity, for one)
    if local_size is not None:
        # A sliding window attention_forward applies from its sliding_window argument; another local
        # pattern (chunked attention) only where no key lies outside the first window.
        sliding = config is not None and getattr(config, "sliding_window", None) == local_size and \
            getattr(config, "attention_chunk_size", None) is None
        if not sliding and kv_offset + kv_length > local_size:
            return False
    if padding is None:
        return True
    if torch.compiler.is_compiling():
        return False  # reading the padding mask's values would break the graph
    keys = padding[:, kv_offset:kv_offset + kv_length]
    return keys.shape[-1] == kv_length and bool(keys.all())


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, s_aux=None, position_bias=None, **kwargs):
    """transformers' attention function for this implementation (AttentionInterface's signature):
    query [batch, heads, q, head_dim], key and value [batch, kv_heads, k, head_dim], attention_mask
    from :func:`attention_mask` (None or a bias) or the caller's own 4D mask. Returns (out [batch,
    q, heads, head_dim], None). See the module's doc for each argument."""
    name = "selfattn.integrations.transformers"
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        raise InvalidArgument(f"{name}: dropout expected a probability in [0, 1), got {dropout!r}")
    if position_bias is not None:
        raise NotAvailable(f"{name}: position_bias is not supported: selfattn computes no gradient for a bias")
    options = dict(scale=scaling, softcap=softcap, sinks=None if s_aux is None else s_aux.float(),
                   dropout_p=float(dropout))
    if attention_mask is None and kwargs.get("cu_seq_lens_q") is not None:
        # Sequence boundaries that only flash attention reads (continuous batching, or a flattening
        # collator's kwargs while a cache kept transformers from building the packed mask): the
        # causal mask alone would let the sequences see one another.
        raise NotAvailable(f"{name}: cu_seq_lens_q without a mask is not supported (continuous batching, paged "
                           f"caches); for packed sequences pass position_ids and use_cache=False, and transformers "
                           f"builds their mask")
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        options["causal"] = "bottom_right" if causal else None
        if sliding_window is not None:
            # transformers' sliding mask: key j is seen by query i when i - sliding_window < j. Without
            # the causal mask, W - 1 on both sides, as transformers' flash-attention path passes it.
            options["window"] = (sliding_window - 1, 0 if causal else sliding_window - 1)
    else:
        options["bias"] = _as_bias(name, attention_mask, query.dtype)
    out = selfattn.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), layout="bshd",
                             **options)
    return out, None


def _as_bias(name, mask, dtype):
    """A 4D mask as selfattn's bias: as it is when boolean, float32 or q's dtype, converted otherwise."""
    if not isinstance(mask, torch.Tensor):
        raise NotAvailable(f"{name}: attention_mask of type {type(mask).__name__} is not supported; a 4D torch "
                           f"tensor (boolean, or additive float) or None is")
    if mask.dtype in (torch.bool, torch.float32, dtype):
        return mask
    return mask.float()
