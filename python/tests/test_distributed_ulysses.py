"""selfattn.distributed.ulysses_attention across processes (2 and 4 ranks, gloo, the sim): every
option of attention() (causal, GQA, key_lengths, window, softcap, ALiBi, bias, sinks; packed
documents; bfloat16 and float32; padded odd lengths; both layouts) against the float64 reference and
selfattn.attention() on the unsharded tensors; head counts that do not divide among the ranks
refused naming both numbers; ranks that disagree all raise. And what both strategies share:
torch.compile(fullgraph=True) traces them (no graph break) and trains as eagerly, and a small model
around ring_attention trains as on one device. Skipped without PyTorch or its gloo backend."""
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this PyTorch has no torch.distributed with gloo", allow_module_level=True)
pytest.importorskip("selfattn.distributed")  # it needs torch.library.custom_op (PyTorch 2.4)

from distributed_support import (attention_job, generator, judge, same_as_single_device,  # noqa: E402
                                  single_device_model, spawn)


def _with(job, **options):
    """job with more options, drawn from its own generator (tensors the reference reads back)."""
    job["options"].update(options)
    return job


def _key_lengths_and_alibi(job):
    g = generator(job["name"] + "/mods")
    return _with(job, key_lengths=torch.tensor([40, 33], dtype=torch.int32),
                 alibi_slopes=torch.rand(4, generator=g) * 0.3)


def _bias(job, heads, seq):
    g = generator(job["name"] + "/bias")
    bias = torch.randn(1, heads, seq, seq, generator=g)
    bias[0, 1, :, 3] = -float("inf")  # a key masked for every row of head 1
    return _with(job, bias=bias)


ULYSSES_2 = [
    _key_lengths_and_alibi(attention_job("causal_gqa_key_lengths_alibi_f32", "ulysses", "bhsd", "contiguous",
                                         "float32", 40, 4, 2, 32, dict(causal="bottom_right"), batch=2)),
    _bias(attention_job("zigzag_window_softcap_sinks_bias_bf16_odd", "ulysses", "bshd", "zigzag", "bfloat16", 61,
                        2, 2, 16, dict(window=(7, 2), softcap=4.0), sinks=True, seq_len=61), 2, 61),
    _with(attention_job("varlen_causal_alibi_per_document_sinks_f32", "ulysses", "packed", "contiguous", "float32",
                        46, 4, 2, 16, dict(causal="top_left", cu_seqlens=[0, 11, 12, 40]), sinks=True),
          alibi_slopes=torch.rand(3, 4, generator=generator("alibi")) * 0.3),
]
ULYSSES_4 = [
    attention_job("zigzag_causal_bf16", "ulysses", "bshd", "zigzag", "bfloat16", 64, 4, 4, 32,
                  dict(causal="top_left"), sinks=True),
    attention_job("varlen_zigzag_window_f32", "ulysses", "packed", "zigzag", "float32", 40, 8, 4, 16,
                  dict(window=(5, 5), cu_seqlens=[0, 17, 37])),
]


def _refused(name, heads, kv_heads):
    g = generator(name)
    q = torch.randn(1, heads, 8, 16, generator=g)
    k, v = (torch.randn(1, kv_heads, 8, 16, generator=g) for _ in range(2))
    return dict(name=name, kind="disagree", function="ulysses", arguments=dict(q=q, k=k, v=v), rank1={})


def _other_jobs():
    g = generator("others")
    q, k, v = (torch.randn(1, 2, 16, 16, generator=g) for _ in range(3))
    sinks = torch.randn(2, generator=g)
    return [
        dict(name="compiled", kind="compiled", q=q, k=k, v=v, sinks=sinks),
        dict(name="model", kind="model", d_model=24, heads=2, head_dim=16, x=torch.randn(2, 24, 24, generator=g)),
        dict(name="options_disagree", kind="disagree", function="ulysses",
             arguments=dict(q=q, k=k, v=v, causal="top_left"), rank1=dict(causal="bottom_right")),
    ]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return spawn(2, ULYSSES_2 + _other_jobs(), tmp_path_factory.mktemp("ulysses2"))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    refused = [_refused("kv_heads_not_divisible", 4, 2), _refused("heads_not_divisible", 6, 6)]
    return spawn(4, ULYSSES_4 + refused, tmp_path_factory.mktemp("ulysses4"))


@pytest.mark.parametrize("job", ULYSSES_2, ids=lambda job: job["name"])
def test_two_ranks_match_one_device(two_ranks, job):
    found = two_ranks[0][job["name"]]
    judge(job, found)
    same_as_single_device(job, found)


@pytest.mark.parametrize("job", ULYSSES_4, ids=lambda job: job["name"])
def test_four_ranks_match_one_device(four_ranks, job):
    found = four_ranks[1][job["name"]]
    judge(job, found)
    same_as_single_device(job, found)


@pytest.mark.parametrize("name,needle", [
    ("kv_heads_not_divisible", "k.shape[1] (kv_heads) = 2 expected a multiple of the group's size (4)"),
    ("heads_not_divisible", "q.shape[1] (heads) = 6 expected a multiple of the group's size (4)"),
])
def test_heads_that_do_not_divide_are_refused_naming_both_numbers(four_ranks, name, needle):
    for results in four_ranks:
        assert results[name]["error"] == "InvalidArgument" and needle in results[name]["message"], results[name]


def test_ranks_that_disagree_all_raise(two_ranks):
    for results in two_ranks:
        found = results["options_disagree"]
        assert found["error"] == "InvalidArgument", found
        assert "disagree on causal (rank 0: 'top_left', rank 1: 'bottom_right')" in found["message"], found


@pytest.mark.parametrize("function", ["ring", "ulysses"])
def test_torch_compile_traces_without_a_graph_break(two_ranks, function):
    # fullgraph=True raises at a graph break; the compiled loss and gradients (q, k, v, sinks) are
    # the eager ones, on every rank.
    for results in two_ranks:
        assert "error" not in results["compiled"], results["compiled"].get("traceback")
        compiled, eager = results["compiled"][function]
        for got, want in zip(compiled, eager):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_model_trains_across_ranks_as_on_one_device(two_ranks):
    from conftest import relative_error
    job = _other_jobs()[1]
    loss, grads = single_device_model(job)
    found = two_ranks[0]["model"]
    assert "error" not in found, found.get("traceback")
    assert abs(found["loss"].item() - loss.item()) <= 1e-5 * abs(loss.item())
    for got, want in zip(found["grads"], grads):
        assert relative_error(got.numpy(), want.numpy(), per_row=False) <= 2e-5
