"""PyTorch integration: attention(), attention_varlen(), append_kv(), attention_with_kv_cache() and
merge_states() on torch tensors go through torch.library custom ops (``selfattn::attention`` and so on), each with
a fake (meta) implementation, so torch.compile traces them without running them. With out= (a torch
tensor) attention(), attention_varlen(), attention_with_kv_cache() and merge_states() go through
their out variants instead (``selfattn::attention_out``, ``attention_varlen_out``,
``attention_with_kv_cache_out``, ``merge_states_out``): each takes out as an argument it mutates
(mutates_args=("out",)), writes the caller's tensor in place and returns lse (float32; an empty [0]
without return_lse, so the library computes none; merge_states_out always returns it), never out
itself (an op's output may not alias an input): the public functions return the caller's out.

The package imports this module at once (it installs ops() as _calls.torch_ops); torch itself is
imported when ops() first runs: at the first call on torch tensors, or at the package's import
where torch is already imported. A first call inside torch.compile registers them too: Dynamo runs
the registration eagerly instead of tracing it (_registered is marked a constant result).

Autograd: each op's formula (torch.library.register_autograd, the custom-op form of a
torch.autograd.Function) saves the inputs, out and lse and runs the library's backward through a
second custom op (``selfattn::attention_backward``, ``selfattn::attention_varlen_backward``, also
with fake implementations). The masks and score modifiers are the ops' arguments, so the gradients
see them. out and lse are both differentiable (the library's backward takes dlse, the gradient of
lse, through BackwardOptions::dlse). sinks train: when they require grad, the backward op returns
their gradient too (BackwardOptions::dsinks, return_dsinks=True). None flows to alibi_slopes or bias
(the public functions refuse those when they require grad). The forward ops (not their out
variants) take ``deterministic``, which their implementation ignores (the forward is deterministic
already): it is saved with the other options and handed to the backward op, which passes it to the
library's backward (BackwardOptions::deterministic: on the fused path dQ in a second kernel, not
with atomics, so loss.backward() gives bitwise-identical gradients run to run). The out variants
have no autograd formula: the public functions refuse inputs that require grad with out=
(NotAvailable), as they do for the KV-cache ops.

Every op takes the modifiers in one order, the library's: window_left, window_right, softcap,
alibi_slopes, bias, sinks; deterministic comes just before them in the forward and backward ops.
FP8 inputs: the attention and attention_varlen ops take q_descale, k_descale, v_descale (float32
[batch, kv_heads] tensors) and out_dtype (the result's dtype) after dropout's options, their out
variants the descales (out's dtype is the result's), all with defaults (None), so calls written
before them still bind.
FP8 calls record no autograd graph: the public function refuses FP8 tensors that require grad.
The KV-cache ops (append_kv, attention_with_kv_cache and its out variant) take an FP8 cache's
scales last, k_scale and v_scale (float32 tensors, default None, so calls written before them still
bind): the public functions turn a float into a tensor of one entry before the op.
Dropout (dropout_p: float, dropout_seed, dropout_offset: int, each with a default of 0, so calls
written before it still bind) comes last in the attention ops, their out variants and backward ops:
after sinks (whose gradient the autograd formula finds just before them) or return_lse /
return_dsinks. The public functions resolve the seed (a torch.Generator's draw) before the op, so
the op is a pure function of its arguments and the autograd formula hands the forward's seed and
offset to the backward op, which regenerates the forward's mask.

The schemas are an interface that exported programs and cached graphs call by position: an op keeps
its name, arguments (order, types, defaults) and returns; a new argument goes last with a default,
and a new op gets its line in python/tests/op_schemas.txt, which test_op_schemas.py checks."""
from typing import Optional, Tuple

_ops = None
_failed = False


def ops():
    """The registered custom ops by the public function they serve (attention, attention_varlen,
    append_kv, attention_with_kv_cache, merge_states; the out variants as attention_out and so on),
    or None where this PyTorch lacks torch.library.custom_op
    (< 2.4)."""
    _registered()
    return _ops


def _registered():
    """Registers the ops once (or notes that this PyTorch cannot); True when done."""
    global _ops, _failed
    if _ops is None and not _failed:
        try:
            _ops = _register()
        except (ImportError, AttributeError):
            _failed = True
    return True


# What torch.compiler.assume_constant_result sets (without importing torch here): Dynamo calls the
# function as it is instead of tracing it, which it could not (torch.library's registration is not
# traceable), so a program whose first call on torch tensors is compiled (fullgraph too) works.
_registered._dynamo_marked_constant = True


def _register():
    import torch
    from torch import Tensor

    # The op bodies import the call modules' functions (_forward, _backward, _kv_cache; never the
    # package's root, which imports this module) when they run: a reference held from here would
    # keep the package (and its default contexts) alive in torch's op registry at interpreter exit,
    # which nanobind reports as leaks.

    def op_argument_names(op):
        """The names of a custom op's arguments, in its schema's order (fakes find options by name)."""
        return [argument.name for argument in op._opoverload._schema.arguments]

    # The ops take dropout's seed and offset as int64 (a schema's int): _calls._op_dropout maps
    # [0, 2^64) onto it and this maps it back.
    def dropout_of(dropout_p, dropout_seed, dropout_offset):
        from ._calls import _op_dropout_back
        return (float(dropout_p), *_op_dropout_back(dropout_seed, dropout_offset))

    # --- attention: q, k, v [batch, heads, seq, head_dim] (or bshd) ---

    @torch.library.custom_op("selfattn::attention", mutates_args=())
    def attention(q: Tensor, k: Tensor, v: Tensor, causal: Optional[str], scale: Optional[float], path: str,
                  key_lengths: Optional[Tensor], layout: str, deterministic: bool, window_left: int,
                  window_right: int, softcap: Optional[float], alibi_slopes: Optional[Tensor], bias: Optional[Tensor],
                  key_start: Optional[Tensor], q_offset: Optional[Tensor],
                  sinks: Optional[Tensor], dropout_p: float = 0.0, dropout_seed: int = 0,
                  dropout_offset: int = 0, q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                  v_descale: Optional[Tensor] = None,
                  out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
        from ._forward import _attention  # deterministic is the backward's (the forward is deterministic already)
        return _attention(q, k, v, causal=causal, scale=scale, path=path, key_lengths=key_lengths, return_lse=True,
                          out=None, layout=layout, context=None, window=(window_left, window_right),
                          softcap=softcap, alibi_slopes=alibi_slopes, bias=bias, sinks=sinks, key_start=key_start,
                          q_offset=q_offset, dropout=dropout_of(dropout_p, dropout_seed, dropout_offset),
                          q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype)

    @attention.register_fake
    def _(q, k, v, causal, scale, path, key_lengths, layout, deterministic, window_left, window_right, softcap,
          alibi_slopes, bias, key_start, q_offset, sinks, dropout_p=0.0, dropout_seed=0, dropout_offset=0,
          q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
        # out has q's shape with v's head dim in either layout (FP8 q: out_dtype, which the public
        # function always sets then); lse is [batch, heads, seq_q].
        heads, seq_q = (q.shape[1], q.shape[2]) if layout == "bhsd" else (q.shape[2], q.shape[1])
        return (q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=out_dtype or q.dtype),
                q.new_empty((q.shape[0], heads, seq_q), dtype=torch.float32))

    # The out variants (see the module's doc): the caller's out is written in place and the op
    # returns lse only (an op's output may not alias an input), or an empty float32 [0] without
    # return_lse, so the library computes no lse (as the direct call did).
    def lse_or_nothing(return_lse, like, shape):
        return like.new_empty(shape if return_lse else (0,), dtype=torch.float32)

    @torch.library.custom_op("selfattn::attention_out", mutates_args=("out",))
    def attention_out(q: Tensor, k: Tensor, v: Tensor, out: Tensor, causal: Optional[str], scale: Optional[float],
                      path: str, key_lengths: Optional[Tensor], layout: str, window_left: int, window_right: int,
                      softcap: Optional[float], alibi_slopes: Optional[Tensor], bias: Optional[Tensor],
                      key_start: Optional[Tensor], q_offset: Optional[Tensor],
                      sinks: Optional[Tensor], return_lse: bool, dropout_p: float = 0.0, dropout_seed: int = 0,
                      dropout_offset: int = 0, q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                      v_descale: Optional[Tensor] = None) -> Tensor:
        from ._forward import _attention
        result = _attention(q, k, v, causal=causal, scale=scale, path=path, key_lengths=key_lengths,
                            return_lse=return_lse, out=out, layout=layout, context=None,
                            window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes, bias=bias,
                            sinks=sinks, key_start=key_start, q_offset=q_offset,
                            dropout=dropout_of(dropout_p, dropout_seed, dropout_offset), q_descale=q_descale,
                            k_descale=k_descale, v_descale=v_descale)
        return result[1] if return_lse else lse_or_nothing(False, q, None)

    @attention_out.register_fake
    def _(q, k, v, out, causal, scale, path, key_lengths, layout, window_left, window_right, softcap, alibi_slopes,
          bias, key_start, q_offset, sinks, return_lse, dropout_p=0.0, dropout_seed=0, dropout_offset=0,
          q_descale=None, k_descale=None, v_descale=None):
        heads, seq_q = (q.shape[1], q.shape[2]) if layout == "bhsd" else (q.shape[2], q.shape[1])
        return lse_or_nothing(return_lse, q, (q.shape[0], heads, seq_q))

    # The backward ops return (dq, dk, dv, dsinks): dsinks float32 [heads] with return_dsinks (their
    # last argument, after sinks), else an empty [0] (an op's outputs are tensors, never None).
    def without_dsinks(q):
        return q.new_empty((0,), dtype=torch.float32)

    def with_dsinks(grads, return_dsinks, q):
        return tuple(grads) if return_dsinks else (*grads, without_dsinks(q))

    def fake_gradients(q, k, v, sinks, return_dsinks):
        wanted = return_dsinks and sinks is not None  # without sinks the real op raises InvalidArgument
        dsinks = sinks.new_empty(sinks.shape, dtype=torch.float32) if wanted else without_dsinks(q)
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks

    @torch.library.custom_op("selfattn::attention_backward", mutates_args=())
    def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor,
                           dlse: Optional[Tensor], causal: Optional[str], scale: Optional[float], path: str,
                           key_lengths: Optional[Tensor], layout: str, deterministic: bool, window_left: int,
                           window_right: int, softcap: Optional[float], alibi_slopes: Optional[Tensor],
                           bias: Optional[Tensor], key_start: Optional[Tensor], q_offset: Optional[Tensor],
                           sinks: Optional[Tensor], return_dsinks: bool, dropout_p: float = 0.0,
                           dropout_seed: int = 0, dropout_offset: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        from ._backward import attention_backward as library_backward
        p, seed, offset = dropout_of(dropout_p, dropout_seed, dropout_offset)
        grads = library_backward(q, k, v, out, dout.contiguous(), lse, causal=causal, scale=scale, path=path,
                                 key_lengths=key_lengths, layout=layout, deterministic=deterministic,
                                 window=(window_left, window_right),
                                 softcap=softcap, alibi_slopes=alibi_slopes, bias=bias, sinks=sinks,
                                 key_start=key_start, q_offset=q_offset,
                                 dlse=None if dlse is None else dlse.contiguous(), return_dsinks=return_dsinks,
                                 dropout_p=p, dropout_seed=seed, dropout_offset=offset)
        return with_dsinks(grads, return_dsinks, q)

    @attention_backward.register_fake
    def _(q, k, v, out, dout, lse, dlse, causal, scale, path, key_lengths, layout, deterministic, window_left,
          window_right, softcap, alibi_slopes, bias, key_start, q_offset, sinks, return_dsinks, dropout_p=0.0,
          dropout_seed=0, dropout_offset=0):
        return fake_gradients(q, k, v, sinks, return_dsinks)

    # Both ops save the same: q, k, v, out, lse, and the other inputs as options for the backward.
    # The tensors among the options (key_lengths, cu_seqlens, alibi_slopes, bias, key_start,
    # q_offset, sinks) are saved
    # too, so changing one in place before backward() raises as torch does.
    def setup_context(ctx, inputs, output):
        q, k, v, *options = inputs
        out, lse = output
        tensor_options = [i for i, o in enumerate(options) if isinstance(o, torch.Tensor)]
        ctx.save_for_backward(q, k, v, out, lse, *(options[i] for i in tensor_options))
        ctx.options, ctx.tensor_options = options, tensor_options
        ctx.set_materialize_grads(False)

    # Gradients for q, k, v and each option: None but for sinks, the last option of both ops before
    # dropout's (dropout_p, dropout_seed, dropout_offset), which takes the library's dsinks when it
    # requires grad. The backward op gets the forward's dropout options after return_dsinks, so it
    # regenerates the forward's mask. Found by position: torch leaves trailing arguments that equal
    # their defaults out of the inputs an autograd formula sees, so the dropout options may be absent.
    def gradients_through(backward_op, forward_op):
        names = [argument.name for argument in forward_op._opoverload._schema.arguments]
        sinks_at = names.index("sinks") - 3  # among the options (after q, k, v)

        def gradients(ctx, dout, dlse):
            option_gradients = [None] * len(ctx.options)
            if dout is None and dlse is None:
                return (None, None, None, *option_gradients)
            q, k, v, out, lse, *saved_options = ctx.saved_tensors
            if dout is None:  # a loss of lse alone
                dout = torch.zeros_like(out)
            options = list(ctx.options)
            for i, saved in zip(ctx.tensor_options, saved_options):
                options[i] = saved
            return_dsinks = ctx.needs_input_grad[3 + sinks_at]
            # After sinks: dropout's three options (the FP8 arguments past them never come here: FP8
            # inputs that require grad are refused before the op).
            dq, dk, dv, dsinks = backward_op(q, k, v, out, dout, lse, dlse, *options[:sinks_at + 1], return_dsinks,
                                             *options[sinks_at + 1:sinks_at + 4])
            option_gradients[sinks_at] = dsinks if return_dsinks else None
            return (dq, dk, dv, *option_gradients)
        return gradients

    attention.register_autograd(gradients_through(attention_backward, attention), setup_context=setup_context)

    # --- attention_varlen: q [total_q, heads, head_dim], k, v [total_k, kv_heads, head_dim] ---

    @torch.library.custom_op("selfattn::attention_varlen", mutates_args=())
    def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         max_seqlen_q: int, max_seqlen_k: int, causal: Optional[str], scale: Optional[float],
                         path: str, key_lengths: Optional[Tensor], deterministic: bool, window_left: int,
                         window_right: int,
                         softcap: Optional[float], alibi_slopes: Optional[Tensor], bias: Optional[Tensor],
                         key_start: Optional[Tensor], q_offset: Optional[Tensor],
                         sinks: Optional[Tensor], dropout_p: float = 0.0, dropout_seed: int = 0,
                         dropout_offset: int = 0, q_descale: Optional[Tensor] = None,
                         k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None,
                         out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
        from ._forward import _attention_varlen  # deterministic: as for attention, the backward's
        return _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                 max_seqlen_k=max_seqlen_k, causal=causal, scale=scale, path=path,
                                 key_lengths=key_lengths, return_lse=True,
                                 out=None, window=(window_left, window_right), softcap=softcap,
                                 alibi_slopes=alibi_slopes, bias=bias, sinks=sinks, key_start=key_start,
                                 q_offset=q_offset, context=None,
                                 dropout=dropout_of(dropout_p, dropout_seed, dropout_offset), q_descale=q_descale,
                                 k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype)

    @attention_varlen.register_fake
    def _(q, k, v, *options, **keywords):
        named = {**dict(zip(op_argument_names(attention_varlen)[3:], options)), **keywords}
        out_dtype = named.get("out_dtype") or q.dtype  # FP8 q: out_dtype, which the public function sets then
        return (q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=out_dtype),  # q's rows, v's head dim
                q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))

    @torch.library.custom_op("selfattn::attention_varlen_out", mutates_args=("out",))
    def attention_varlen_out(q: Tensor, k: Tensor, v: Tensor, out: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                             max_seqlen_q: int, max_seqlen_k: int, causal: Optional[str], scale: Optional[float],
                             path: str, key_lengths: Optional[Tensor], window_left: int, window_right: int,
                             softcap: Optional[float],
                             alibi_slopes: Optional[Tensor], bias: Optional[Tensor], key_start: Optional[Tensor],
                             q_offset: Optional[Tensor], sinks: Optional[Tensor],
                             return_lse: bool, dropout_p: float = 0.0, dropout_seed: int = 0,
                             dropout_offset: int = 0, q_descale: Optional[Tensor] = None,
                             k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None) -> Tensor:
        from ._forward import _attention_varlen
        result = _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                   max_seqlen_k=max_seqlen_k, causal=causal, scale=scale, path=path,
                                   key_lengths=key_lengths,
                                   return_lse=return_lse, out=out, window=(window_left, window_right),
                                   softcap=softcap, alibi_slopes=alibi_slopes, bias=bias, sinks=sinks,
                                   key_start=key_start, q_offset=q_offset, context=None,
                                   dropout=dropout_of(dropout_p, dropout_seed, dropout_offset), q_descale=q_descale,
                                   k_descale=k_descale, v_descale=v_descale)
        return result[1] if return_lse else lse_or_nothing(False, q, None)

    @attention_varlen_out.register_fake
    def _(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, path, key_lengths,
          window_left, window_right, softcap, alibi_slopes, bias, key_start, q_offset, sinks, return_lse,
          dropout_p=0.0, dropout_seed=0, dropout_offset=0, q_descale=None, k_descale=None, v_descale=None):
        return lse_or_nothing(return_lse, q, (q.shape[1], q.shape[0]))

    @torch.library.custom_op("selfattn::attention_varlen_backward", mutates_args=())
    def attention_varlen_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor,
                                  dlse: Optional[Tensor], cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                  max_seqlen_q: int, max_seqlen_k: int, causal: Optional[str],
                                  scale: Optional[float], path: str, key_lengths: Optional[Tensor],
                                  deterministic: bool, window_left: int,
                                  window_right: int, softcap: Optional[float], alibi_slopes: Optional[Tensor],
                                  bias: Optional[Tensor], key_start: Optional[Tensor], q_offset: Optional[Tensor],
                                  sinks: Optional[Tensor], return_dsinks: bool, dropout_p: float = 0.0,
                                  dropout_seed: int = 0,
                                  dropout_offset: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        from ._backward import attention_varlen_backward as library_varlen_backward
        p, seed, offset = dropout_of(dropout_p, dropout_seed, dropout_offset)
        grads = library_varlen_backward(q, k, v, out, dout.contiguous(), lse, cu_seqlens_q, cu_seqlens_k,
                                        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal,
                                        scale=scale, path=path, key_lengths=key_lengths, deterministic=deterministic,
                                        window=(window_left, window_right), softcap=softcap,
                                        alibi_slopes=alibi_slopes, bias=bias, sinks=sinks, key_start=key_start,
                                        q_offset=q_offset,
                                        dlse=None if dlse is None else dlse.contiguous(), return_dsinks=return_dsinks,
                                        dropout_p=p, dropout_seed=seed, dropout_offset=offset)
        return with_dsinks(grads, return_dsinks, q)

    @attention_varlen_backward.register_fake
    def _(q, k, v, out, dout, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, path,
          key_lengths, deterministic, window_left, window_right, softcap, alibi_slopes, bias, key_start, q_offset,
          sinks, return_dsinks, dropout_p=0.0, dropout_seed=0, dropout_offset=0):
        return fake_gradients(q, k, v, sinks, return_dsinks)

    attention_varlen.register_autograd(gradients_through(attention_varlen_backward, attention_varlen),
                                       setup_context=setup_context)

    # --- the KV cache: no autograd (the public functions refuse tensors that require grad) ---

    @torch.library.custom_op("selfattn::append_kv", mutates_args=("k_cache", "v_cache"))
    def append_kv(k_cache: Tensor, v_cache: Tensor, lengths: Tensor, block_table: Optional[Tensor],
                  batch_index: Optional[Tensor], k_new: Tensor, v_new: Tensor, layout: str,
                  rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor], rotary_interleaved: bool,
                  rotary_positions: Optional[Tensor], rotary_position_step: int, validate_metadata: bool,
                  cu_seqlens_new: Optional[Tensor], max_seqlen_new: int, k_scale: Optional[Tensor] = None,
                  v_scale: Optional[Tensor] = None, rotary_first_dim: int = 0) -> Tensor:
        from ._kv_cache import _append_kv
        return _append_kv(k_cache, v_cache, lengths, k_new, v_new, block_table=block_table, layout=layout,
                          rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
                          return_lengths=True, validate_metadata=validate_metadata, context=None,
                          batch_index=batch_index, rotary_positions=rotary_positions,
                          rotary_position_step=rotary_position_step, cu_seqlens_new=cu_seqlens_new,
                          max_seqlen_new=None if cu_seqlens_new is None else max_seqlen_new, k_scale=k_scale,
                          v_scale=v_scale, rotary_first_dim=rotary_first_dim)

    @append_kv.register_fake
    def _(k_cache, v_cache, lengths, *options, **keywords):
        return lengths.new_empty(lengths.shape, dtype=torch.int32)  # the updated lengths

    @torch.library.custom_op("selfattn::attention_with_kv_cache", mutates_args=())
    def attention_with_kv_cache(q: Tensor, k_cache: Tensor, v_cache: Tensor, lengths: Tensor,
                                block_table: Optional[Tensor], batch_index: Optional[Tensor], layout: str,
                                causal: Optional[str], scale: Optional[float], path: str,
                                rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor], rotary_interleaved: bool,
                                rotary_positions: Optional[Tensor], rotary_position_step: int, num_splits: int,
                                window_left: int, window_right: int, softcap: Optional[float],
                                alibi_slopes: Optional[Tensor], bias: Optional[Tensor], key_start: Optional[Tensor],
                                q_offset: Optional[Tensor], sinks: Optional[Tensor],
                                validate_metadata: bool, cu_seqlens_q: Optional[Tensor],
                                max_seqlen_q: int, k_scale: Optional[Tensor] = None,
                                v_scale: Optional[Tensor] = None, rotary_first_dim: int = 0) -> Tuple[Tensor, Tensor]:
        from ._kv_cache import _attention_with_kv_cache
        return _attention_with_kv_cache(q, k_cache, v_cache, lengths, block_table=block_table, layout=layout,
                                        causal=causal, scale=scale, path=path, return_lse=True, out=None,
                                        rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                        rotary_interleaved=rotary_interleaved, rotary_positions=rotary_positions,
                                        rotary_position_step=rotary_position_step, num_splits=num_splits,
                                        window=(window_left, window_right), softcap=softcap,
                                        alibi_slopes=alibi_slopes, bias=bias, sinks=sinks, key_start=key_start,
                                        q_offset=q_offset, validate_metadata=validate_metadata, context=None,
                                        batch_index=batch_index, cu_seqlens_q=cu_seqlens_q,
                                        max_seqlen_q=None if cu_seqlens_q is None else max_seqlen_q,
                                        k_scale=k_scale, v_scale=v_scale, rotary_first_dim=rotary_first_dim)

    def kv_lse_shape(q, layout, packed):
        """The lse of a KV-cache attention: [batch, heads, seq_q], or [heads, total_q] when packed."""
        if packed:
            return (q.shape[1], q.shape[0])
        heads, seq_q = (q.shape[1], q.shape[2]) if layout == "bhsd" else (q.shape[2], q.shape[1])
        return (q.shape[0], heads, seq_q)

    # The fakes find the options they need by name: the FP8 scales (k_scale, v_scale) came last,
    # with defaults, so calls written before them still bind, and positions from the end would move.
    def kv_options(op, args, first):
        return dict(zip(op_argument_names(op)[first:], args))

    @attention_with_kv_cache.register_fake
    def _(q, k_cache, v_cache, lengths, block_table, batch_index, layout, *options, **keywords):
        named = {**kv_options(attention_with_kv_cache, options, 7), **keywords}
        packed = named["cu_seqlens_q"] is not None
        return (q.new_empty((*q.shape[:-1], v_cache.shape[-1])),  # q's rows, V's head dim
                q.new_empty(kv_lse_shape(q, layout, packed), dtype=torch.float32))

    @torch.library.custom_op("selfattn::attention_with_kv_cache_out", mutates_args=("out",))
    def attention_with_kv_cache_out(q: Tensor, k_cache: Tensor, v_cache: Tensor, lengths: Tensor,
                                    block_table: Optional[Tensor], batch_index: Optional[Tensor], out: Tensor,
                                    layout: str, causal: Optional[str], scale: Optional[float], path: str,
                                    rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                                    rotary_interleaved: bool, rotary_positions: Optional[Tensor],
                                    rotary_position_step: int, num_splits: int,
                                    window_left: int, window_right: int, softcap: Optional[float],
                                    alibi_slopes: Optional[Tensor], bias: Optional[Tensor],
                                    key_start: Optional[Tensor], q_offset: Optional[Tensor], sinks: Optional[Tensor],
                                    validate_metadata: bool, cu_seqlens_q: Optional[Tensor], max_seqlen_q: int,
                                    return_lse: bool, k_scale: Optional[Tensor] = None,
                                    v_scale: Optional[Tensor] = None, rotary_first_dim: int = 0) -> Tensor:
        from ._kv_cache import _attention_with_kv_cache
        result = _attention_with_kv_cache(q, k_cache, v_cache, lengths, block_table=block_table, layout=layout,
                                          causal=causal, scale=scale, path=path, return_lse=return_lse, out=out,
                                          rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                          rotary_interleaved=rotary_interleaved, rotary_positions=rotary_positions,
                                          rotary_position_step=rotary_position_step, num_splits=num_splits,
                                          window=(window_left, window_right), softcap=softcap,
                                          alibi_slopes=alibi_slopes, bias=bias, sinks=sinks, key_start=key_start,
                                          q_offset=q_offset, validate_metadata=validate_metadata, context=None,
                                          batch_index=batch_index, cu_seqlens_q=cu_seqlens_q,
                                          max_seqlen_q=None if cu_seqlens_q is None else max_seqlen_q,
                                          k_scale=k_scale, v_scale=v_scale, rotary_first_dim=rotary_first_dim)
        return result[1] if return_lse else lse_or_nothing(False, q, None)

    @attention_with_kv_cache_out.register_fake
    def _(q, k_cache, v_cache, lengths, block_table, batch_index, out, layout, *options, **keywords):
        named = {**kv_options(attention_with_kv_cache_out, options, 8), **keywords}
        packed = named["cu_seqlens_q"] is not None
        return lse_or_nothing(named["return_lse"], q, kv_lse_shape(q, layout, packed))

    @torch.library.custom_op("selfattn::merge_states", mutates_args=())
    def merge_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, layout: str) -> Tuple[Tensor, Tensor]:
        from ._kv_cache import _merge_states
        return _merge_states(out_a, lse_a, out_b, lse_b, out=None, layout=layout, context=None)

    @merge_states.register_fake
    def _(out_a, lse_a, out_b, lse_b, layout):
        return out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape, dtype=torch.float32)

    # merge_states always returns lse. out may be out_a (the merge in place that merge_states()
    # documents); only out is declared mutated.
    @torch.library.custom_op("selfattn::merge_states_out", mutates_args=("out",))
    def merge_states_out(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, out: Tensor,
                         layout: str) -> Tensor:
        from ._kv_cache import _merge_states
        return _merge_states(out_a, lse_a, out_b, lse_b, out=out, layout=layout, context=None)[1]

    @merge_states_out.register_fake
    def _(out_a, lse_a, out_b, lse_b, out, layout):
        return lse_a.new_empty(lse_a.shape, dtype=torch.float32)

    return dict(attention=attention, attention_varlen=attention_varlen, append_kv=append_kv,
                attention_with_kv_cache=attention_with_kv_cache, merge_states=merge_states,
                attention_out=attention_out, attention_varlen_out=attention_varlen_out,
                attention_with_kv_cache_out=attention_with_kv_cache_out, merge_states_out=merge_states_out)
