"""selfattn.integrations.transformers (selfattn as an attention implementation of Hugging Face
transformers) inside tiny random models built from configs (no download), on CPU tensors (the sim):
Llama (grouped-query attention), Mistral (a sliding window), Gemma 2 (softcap; sliding and full
layers alternating), gpt-oss (attention sinks; sliding and full layers), Falcon (multi-query;
it adds ALiBi into its mask, which therefore always reaches selfattn as a bias) and DeepSeek-V3
(multi-head latent attention: values of another head dim than queries and keys, passed unpadded).

- Logits and gradients of a float32 model, by the project's rule (conftest's relative_error and
  TOLERANCE, gradients by whole tensors as in the other torch tests), against eager attention in
  float64 on each sequence alone, with and without a left-padded row. (Not on the padded batch:
  eager's softmax runs in float32, where float64's mask value is -inf, so a pad token's row is NaN
  and the next layer carries the NaN into every row.) Sequences packed in one row, likewise.
- Greedy generate() gives eager's tokens: a left-padded batch, a batch without padding (decoding
  past the sliding window), a static cache. torch.compile(fullgraph=True) traces a model whole.
- The two mask forms (None: selfattn's causal mask and window; else a boolean bias equal to
  transformers' own mask) and what each layer's call passes to selfattn.attention.
- Refusals, registration, and that importing the adapter imports no transformers.

Skipped without PyTorch or transformers (scripts/setup-deps installs both; optional)."""
import copy
import os
import subprocess
import sys
import zlib

import pytest

import selfattn
from conftest import TOLERANCE, relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (optional: "
                                                           "scripts/setup-deps installs it)")

from selfattn.integrations import transformers as adapter  # noqa: E402  (needs torch)
from transformers.masking_utils import (bidirectional_mask_function, causal_mask_function,  # noqa: E402
                                        chunked_causal_mask_function, sdpa_mask,
                                        sliding_window_causal_mask_function)

# The models' tensors are tiny: torch's intra-op threads gain nothing on them and, beside other
# tests on a busy machine, wait for one another (this file took 82 s with 2 threads, 15 s with 1).
torch.set_num_threads(1)

NAME = adapter.register()
VOCAB, LENGTH, PADS = 100, 12, (0, 3)  # row 1 of a padded batch has 3 pad tokens on the left
WINDOW = 4


def configs():
    """A tiny config per model family: 2 layers, 4 query heads of 8 over 2 kv heads (Falcon: 1),
    weights large enough (initializer_range) that attention is far from uniform, so a wrong mask
    shows; untied embeddings, so greedy decoding does not just repeat the last token."""
    small = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 initializer_range=0.2, tie_word_embeddings=False)
    llama_like = dict(small, intermediate_size=64, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    return {
        "llama": transformers.LlamaConfig(**llama_like),
        "mistral": transformers.MistralConfig(**llama_like, sliding_window=WINDOW),
        "gemma2": transformers.Gemma2Config(**llama_like, sliding_window=WINDOW, attn_logit_softcapping=2.0,
                                            query_pre_attn_scalar=8),
        "gpt_oss": transformers.GptOssConfig(**llama_like, sliding_window=WINDOW, num_local_experts=4,
                                             num_experts_per_tok=2),
        "falcon": transformers.FalconConfig(**small, multi_query=True, new_decoder_architecture=False, alibi=True),
        # MLA: queries and keys of 8 + 4 rotary columns expanded from a 16-wide latent, values of 8
        # (head_dim_v != head_dim_qk, unpadded); a dense first layer, a mixture of experts after it.
        "deepseek_v3": transformers.DeepseekV3Config(
            **small, intermediate_size=64, num_key_value_heads=4, max_position_embeddings=64, q_lora_rank=16,
            kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4,
            num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=16, first_k_dense_replace=1),
    }


MODELS = list(configs())


@pytest.fixture
def seed(request):
    # A seed per test (its name) and per registration (SELFATTN_SIM_SEED), as conftest's rng.
    value = zlib.crc32(request.node.name.encode()) + 1000 * int(os.environ.get("SELFATTN_SIM_SEED", "0"))
    torch.manual_seed(value)
    return value


def build(family):
    """(eager float32 model, the same weights with selfattn, the same weights in float64 with eager)."""
    # grouped_mm has no float64
    extra = dict(experts_implementation="eager") if family in ("gpt_oss", "deepseek_v3") else {}
    eager = transformers.AutoModelForCausalLM.from_config(configs()[family], attn_implementation="eager",
                                                          **extra).eval()
    ours = copy.deepcopy(eager)
    ours.set_attn_implementation(NAME)
    return eager, ours, copy.deepcopy(eager).double()


def batch(pads):
    ids = torch.randint(0, VOCAB, (len(pads), LENGTH))
    mask = torch.ones(len(pads), LENGTH, dtype=torch.long)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return ids, mask


@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "left_padded"])
@pytest.mark.parametrize("family", MODELS)
def test_logits_and_gradients_match_eager_in_float64(family, padded, seed):
    # Without padding every layer gets mask None (selfattn's causal mask and window); with a padded
    # row, the bias. The reference runs each sequence alone, its pad tokens cut off and its tokens
    # at the positions they had in the batch.
    _, ours, reference = build(family)
    pads = PADS if padded else (0, 0)
    ids, mask = batch(pads)
    logits = ours(ids, attention_mask=mask if padded else None).logits
    weights = torch.randn(logits.shape)
    loss = sum((logits[b, pad:] * weights[b, pad:]).sum() for b, pad in enumerate(pads))
    params = [p for p in ours.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)

    want_loss = 0
    for b, pad in enumerate(pads):
        positions = torch.arange(pad, LENGTH)[None]
        want = reference(ids[b:b + 1, pad:], position_ids=positions).logits[0]
        got = logits[b, pad:].detach()
        assert relative_error(got.double().numpy(), want.detach().numpy()) <= TOLERANCE["float32"], b
        want_loss = want_loss + (want * weights[b, pad:].double()).sum()
    want_grads = torch.autograd.grad(want_loss, [p for p in reference.parameters() if p.requires_grad])
    names = [n for n, p in ours.named_parameters() if p.requires_grad]
    assert any("sinks" in n for n in names) == (family == "gpt_oss")
    for name, got, want in zip(names, grads, want_grads):
        assert relative_error(got.double().numpy(), want.numpy(), per_row=False) <= 2 * TOLERANCE["float32"], name


def test_packed_sequences_match_each_sequence_alone(seed):
    # Sequences packed in one row (position_ids restarting at 0, no cache: how flattening collators
    # train) reach selfattn as transformers' packed mask, a bias.
    _, ours, reference = build("mistral")
    ids, _ = batch((0,))
    starts = (0, 5, LENGTH)
    positions = torch.cat([torch.arange(end - start) for start, end in zip(starts, starts[1:])])[None]
    with torch.no_grad():
        logits = ours(ids, position_ids=positions, use_cache=False).logits[0]
        for start, end in zip(starts, starts[1:]):
            want = reference(ids[:, start:end], use_cache=False).logits[0]
            assert relative_error(logits[start:end].double().numpy(), want.numpy()) <= TOLERANCE["float32"]


@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "left_padded"])
@pytest.mark.parametrize("family", MODELS)
def test_greedy_generation_matches_eager(family, padded, seed):
    # 10 prompt tokens and 6 new ones: decoding with DynamicCache runs past the sliding window (its
    # layers then hold the last WINDOW - 1 keys and kv_offset > 0).
    eager, ours, _ = build(family)
    ids, mask = batch(PADS if padded else (0, 0))
    ids, mask = ids[:, :10], mask[:, :10]
    options = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    want = eager.generate(ids, **options)
    got = ours.generate(ids, **options)
    assert torch.equal(got, want)
    assert len(set(want[:, 10:].flatten().tolist())) > 2  # not a degenerate model repeating one token


@pytest.mark.parametrize("prompt,pads", [(3, (0, 0)), (10, PADS)], ids=["short_prompt", "left_padded"])
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_greedy_generation_with_a_static_cache_matches_eager(family, prompt, pads, seed):
    # A static cache hands its full layers all of its capacity (kv_length > q_offset + q_length),
    # and its sliding layers all WINDOW slots until the window fills (the 3-token prompt): the mask
    # function returns the bias there, which hides the slots not written yet.
    eager, ours, _ = build(family)
    ids, mask = batch(pads)
    options = dict(attention_mask=mask[:, :prompt], max_new_tokens=5, do_sample=False, pad_token_id=0,
                   cache_implementation="static")
    assert torch.equal(ours.generate(ids[:, :prompt], **options), eager.generate(ids[:, :prompt], **options))


def test_the_model_compiles_into_one_graph_with_either_mask_form(calls, seed):
    # torch.compile(fullgraph=True) traces the mask function and both forms of the layers' calls
    # (backend="eager": the graph is traced and run as it is, no code generated, to stay quick).
    _, ours, _ = build("mistral")
    ids, mask = batch(PADS)
    compiled = torch.compile(ours, fullgraph=True, backend="eager")
    with torch.no_grad():
        for padding in (None, mask):
            want = ours(ids, attention_mask=padding).logits
            calls.clear()
            got = compiled(ids, attention_mask=padding).logits
            assert torch.equal(got, want)
            assert all(("bias" in call) == (padding is not None) for call in calls) and calls


# --- the mask function ---


def transformers_bias(**sizes):
    """transformers' own boolean mask for these sizes (True: seen), what selfattn takes as a bias."""
    return sdpa_mask(allow_is_causal_skip=False, **sizes)


@pytest.mark.parametrize("sizes", [
    dict(q_length=6, kv_length=6),                                             # a prefill
    dict(q_length=1, kv_length=9, q_offset=8),                                 # decoding, DynamicCache
    dict(q_length=2, kv_length=5, q_offset=7, kv_offset=4, local_size=WINDOW),  # a full sliding layer
], ids=["prefill", "decode", "sliding_window_cache"])
def test_mask_is_none_where_selfattns_causal_mask_is_exact(sizes):
    # Padding the layer's keys do not reach (tokens that left a sliding window) changes nothing.
    config = transformers.MistralConfig(sliding_window=WINDOW)
    padding = torch.ones(2, sizes.get("q_offset", 0) + sizes["q_length"], dtype=torch.bool)
    padding[1, :sizes.get("kv_offset", 0)] = False
    for attention_mask in (None, padding):
        assert adapter.attention_mask(batch_size=2, attention_mask=attention_mask, config=config, **sizes) is None


@pytest.mark.parametrize("case", ["left_padding", "static_cache", "not_aligned", "chunked", "no_skip",
                                  "bidirectional"])
def test_mask_is_transformers_own_as_a_bias_elsewhere(case):
    padding = torch.ones(2, 7, dtype=torch.bool)
    padding[1, :2] = False
    sizes = dict(batch_size=2, q_length=7, kv_length=7, mask_function=causal_mask_function)
    extra = {}
    if case == "left_padding":
        sizes["attention_mask"] = padding
    elif case == "static_cache":  # a tensor q_offset (StaticLayer's), the cache's capacity as kv_length
        sizes.update(q_length=1, kv_length=16, q_offset=torch.tensor(6), attention_mask=padding)
    elif case == "not_aligned":  # the queries end before the last key
        sizes.update(q_length=3, kv_length=9, q_offset=2)
    elif case == "chunked":  # a local pattern that is not the config's sliding window
        sizes.update(local_size=3, mask_function=chunked_causal_mask_function(3, torch.zeros(2, dtype=torch.long)))
        extra["config"] = transformers.Llama4TextConfig(attention_chunk_size=3)
    elif case == "no_skip":  # the model asked for a materialized mask (or/and mask functions, Falcon)
        extra["allow_is_causal_skip"] = False
    else:
        sizes.update(mask_function=bidirectional_mask_function)
        extra.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=True)
    bias = adapter.attention_mask(**sizes, **extra)
    assert bias.dtype == torch.bool  # read by the kernels as bytes, no float copy
    assert torch.equal(bias, transformers_bias(**sizes))
    assert case == "bidirectional" or not bool(bias.all())


def test_sliding_window_mask_is_none_only_for_the_configs_window():
    sizes = dict(batch_size=1, q_length=6, kv_length=6, local_size=WINDOW,
                 mask_function=sliding_window_causal_mask_function(WINDOW))
    assert adapter.attention_mask(**sizes, config=transformers.MistralConfig(sliding_window=WINDOW)) is None
    bias = adapter.attention_mask(**sizes, config=transformers.MistralConfig(sliding_window=WINDOW + 1))
    assert torch.equal(bias, transformers_bias(**sizes))


# --- what the layers pass to selfattn ---


@pytest.fixture
def calls(monkeypatch):
    """The keyword arguments and shapes of every selfattn.attention call the adapter makes."""
    seen = []
    attention = selfattn.attention

    def spy(q, k, v, **options):
        seen.append(dict(options, q=q, k=k, v=v))
        return attention(q, k, v, **options)

    monkeypatch.setattr(adapter.selfattn, "attention", spy)
    return seen


@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "left_padded"])
def test_each_layer_passes_its_window_softcap_and_kv_heads(calls, padded, seed):
    _, ours, _ = build("gemma2")  # layer 0 sliding, layer 1 full
    ids, mask = batch(PADS if padded else (0, 0))
    with torch.no_grad():
        ours(ids, attention_mask=mask)
    assert len(calls) == 2
    for layer, call in enumerate(calls):
        assert call["layout"] == "bshd" and call["softcap"] == 2.0 and call["scale"] == 8 ** -0.5
        assert call["q"].shape == (2, LENGTH, 4, 8) and call["k"].shape == call["v"].shape == (2, LENGTH, 2, 8)
        if padded:  # everything in the bias (one per mask type, built once per forward pass)
            assert "causal" not in call and "window" not in call
            assert call["bias"].shape == (2, 1, LENGTH, LENGTH) and call["bias"].dtype == torch.bool
        else:
            assert "bias" not in call and call["causal"] == "bottom_right"
            assert call.get("window") == ((WINDOW - 1, 0) if layer == 0 else None)
    if padded:  # the sliding layer's bias hides more keys than the full layer's
        assert (~calls[0]["bias"]).sum() > (~calls[1]["bias"]).sum()


def test_sinks_and_decoding_without_a_bias(calls, seed):
    # gpt-oss: the sinks go in float32 in every call; decoding with DynamicCache (no padding) reads
    # no bias, past the window too.
    _, ours, _ = build("gpt_oss")
    ids, _ = batch((0,))
    with torch.no_grad():
        ours.generate(ids[:, :6], max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert len(calls) == 2 * 3
    for call in calls:
        assert call["sinks"].dtype == torch.float32 and call["sinks"].shape == (4,)
        assert "bias" not in call and call["causal"] == "bottom_right"
    decode = calls[-2]  # the last step's sliding layer: WINDOW - 1 cached keys and the new one
    assert decode["q"].shape[1] == 1 and decode["k"].shape[1] == WINDOW and decode["window"] == (WINDOW - 1, 0)


def test_mla_values_go_unpadded(calls, seed):
    # DeepSeek-V3: the values reach selfattn with their own head dim (8, the queries' and keys' 12),
    # not padded to the queries' (as flash-attention implementations need), and so does the output.
    _, ours, _ = build("deepseek_v3")
    ids, _ = batch((0,))
    with torch.no_grad():
        ours(ids)
    assert len(calls) == 2
    for call in calls:
        assert call["q"].shape == (1, LENGTH, 4, 12) and call["k"].shape == (1, LENGTH, 4, 12)
        assert call["v"].shape == (1, LENGTH, 4, 8) and call["scale"] == 12 ** -0.5


# --- attention_forward on its own ---


class Layer(torch.nn.Module):
    is_causal = True


def qkv(batch_size=2, seq=5):
    q = torch.randn(batch_size, 4, seq, 8)
    k, v = torch.randn(batch_size, 2, seq, 8), torch.randn(batch_size, 2, seq, 8)
    return q, k, v


def test_query_key_and_value_go_as_views(calls, seed):
    # No copies: selfattn gets the tensors transformers passed, transposed to bshd, and the kv heads
    # as they are (grouped-query attention); the output is [batch, q, heads, head_dim], contiguous.
    q, k, v = qkv()
    out, _ = adapter.attention_forward(Layer(), q, k, v, None)
    (call,) = calls
    for got, passed in ((call["q"], q), (call["k"], k), (call["v"], v)):
        assert got.data_ptr() == passed.data_ptr() and torch.equal(got, passed.transpose(1, 2))
    assert out.shape == (2, 5, 4, 8) and out.is_contiguous()


def test_a_callers_boolean_or_other_float_mask_is_converted(seed):
    q, k, v = qkv()
    seen = torch.rand(2, 1, 5, 5) > 0.3
    seen[..., 0] = True
    bias = torch.where(seen, 0.0, float("-inf"))
    want, none = adapter.attention_forward(Layer(), q, k, v, bias)
    assert none is None and want.shape == (2, 5, 4, 8)
    for mask in (seen, bias.to(torch.float16), bias.double()):
        got, _ = adapter.attention_forward(Layer(), q, k, v, mask)
        assert torch.equal(got, want), mask.dtype


def test_refusals(seed):
    q, k, v = qkv()
    with pytest.raises(selfattn.NotAvailable, match="position_bias"):
        adapter.attention_forward(Layer(), q, k, v, None, position_bias=torch.zeros(1, 4, 5, 5))
    with pytest.raises(selfattn.NotAvailable, match="attention_mask of type object"):
        adapter.attention_forward(Layer(), q, k, v, object())
    with pytest.raises(selfattn.NotAvailable, match="cu_seq_lens_q without a mask"):
        adapter.attention_forward(Layer(), q, k, v, None, cu_seq_lens_q=torch.tensor([0, 2, 5], dtype=torch.int32))
    with pytest.raises(selfattn.InvalidArgument, match="name expected a non-empty str"):
        adapter.register("")


def test_dropout_passes_through(seed):
    # The dropout the models pass while training is selfattn's dropout_p (its seed from torch's
    # default generator): the same as selfattn.attention's from the same generator state.
    q, k, v = qkv()
    torch.manual_seed(1)
    got, _ = adapter.attention_forward(Layer(), q, k, v, None, dropout=0.25)
    torch.manual_seed(1)
    want = selfattn.attention(q, k, v, causal="bottom_right", dropout_p=0.25)
    assert torch.equal(got, want.transpose(1, 2))
    assert not torch.equal(got, adapter.attention_forward(Layer(), q, k, v, None)[0])
    with pytest.raises(selfattn.InvalidArgument, match="dropout expected a probability"):
        adapter.attention_forward(Layer(), q, k, v, None, dropout=1.0)


def test_training_with_attention_dropout(seed):
    # config.attention_dropout trains: train() passes it (a step reproducible with torch.manual_seed,
    # gradients reach the weights), eval() passes 0 (the same logits as with dropout off).
    config = configs()["llama"]
    config.attention_dropout = 0.3
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=NAME).train()
    ids = batch((0,))[0]
    torch.manual_seed(2)
    first = model(ids).logits
    torch.manual_seed(2)
    assert torch.equal(model(ids).logits, first)
    assert not torch.equal(model(ids).logits, first)
    first.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    evaluated = model.eval()(ids).logits
    config.attention_dropout = 0.0
    plain = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=NAME).eval()
    plain.load_state_dict(model.state_dict())
    assert torch.equal(plain(ids).logits, evaluated)


def test_registered_under_its_name_in_both_interfaces():
    assert adapter.register("selfattn_other") == "selfattn_other"
    for interface in (transformers.AttentionInterface(), transformers.masking_utils.AttentionMaskInterface()):
        assert NAME in interface and "selfattn_other" in interface
    assert transformers.AttentionInterface()[NAME] is adapter.attention_forward
    assert transformers.masking_utils.AttentionMaskInterface()[NAME] is adapter.attention_mask


def test_importing_the_adapter_imports_no_transformers():
    code = ("import sys, selfattn, selfattn.integrations.transformers; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
