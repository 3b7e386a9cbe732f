"""The library's messages speak of the arrays as the Python caller passed them: axis numbers of the
caller's layout and rank, Python argument names (selfattn/_messages.py translates them). Each test
makes an entry point refuse a call over an axis whose number differs between the library's
[batch, heads, seq, head_dim] views and the caller's arrays, in each layout the entry point takes."""
import re

import numpy as np
import pytest

import selfattn
from selfattn import _messages

LAYOUTS = ["bhsd", "bshd"]
HEADS = {"bhsd": 1, "bshd": 2}  # the heads axis of a 4-D array in each layout
SEQ = {"bhsd": 2, "bshd": 1}


def zeros(shape, layout="bhsd"):
    """float32 zeros of the [batch, heads, seq, head_dim] `shape`, in `layout`'s axis order."""
    batch, heads, seq, dim = shape
    return np.zeros((batch, seq, heads, dim) if layout == "bshd" else shape, np.float32)


def message_of(error, call, *args, **kwargs):
    with pytest.raises(error) as raised:
        call(*args, **kwargs)
    return str(raised.value)


def refused(expected, call, *args, **kwargs):
    """`call` raises InvalidArgument whose message holds `expected` word for word, and none of the
    C++ library's own names for the Python arguments."""
    message = message_of(selfattn.InvalidArgument, call, *args, **kwargs)
    assert expected in message, message
    assert not re.search(r"(?<!\w)(options|backward|cache)\.|\.(rows|cols)\b|::", message), message


@pytest.mark.parametrize("layout", LAYOUTS)
def test_attention(layout):
    h, s = HEADS[layout], SEQ[layout]
    q = zeros((2, 4, 6, 16), layout)
    kv = zeros((2, 3, 6, 16), layout)
    refused(f"attention: k.shape[{h}] (kv_heads) expected a divisor of q.shape[{h}] (heads) = 4, got 3",
            selfattn.attention, q, kv, kv, layout=layout)
    k, v = zeros((2, 2, 6, 16), layout), zeros((2, 2, 5, 16), layout)
    refused(f"v.shape[{s}] (seq) expected 6 (k.shape[{s}] (seq)), got 5", selfattn.attention, q, k, v, layout=layout)
    refused("k.shape[3] (head_dim) expected 16 (q.shape[3] (head_dim)), got 8", selfattn.attention, q,
            zeros((2, 2, 6, 8), layout), zeros((2, 2, 6, 8), layout), layout=layout)
    refused(f"out.shape[{s}] (seq) expected 6 (q.shape[{s}] (seq)), got 5", selfattn.attention, q, k, k,
            layout=layout, out=zeros((2, 4, 5, 16), layout))
    # bias is [batch, heads, seq_q, seq_k] in every layout: its axes keep their numbers.
    refused("bias.shape[3] (seq_k) expected 6 or 1 (broadcast), got 5", selfattn.attention, q, k, k, layout=layout,
            bias=np.zeros((2, 4, 6, 5), np.float32))
    refused("window[0] expected -1 (unbounded) or >= 0, got -2", selfattn.attention, q, k, k, layout=layout,
            window=(-2, 0))


def test_attention_varlen():
    q = np.zeros((8, 4, 16), np.float32)  # [total_q, heads, head_dim]
    k = v = np.zeros((7, 2, 16), np.float32)
    cu_q, cu_k = [0, 4, 8], [0, 3, 7]
    narrow = np.zeros((7, 2, 8), np.float32)
    refused("attention_varlen: k.shape[2] (head_dim) expected 16 (q.shape[2] (head_dim)), got 8",
            selfattn.attention_varlen, q, narrow, narrow, cu_q, cu_k)
    three_heads = np.zeros((7, 3, 16), np.float32)
    refused("k.shape[1] (kv_heads) expected a divisor of q.shape[1] (heads) = 4, got 3", selfattn.attention_varlen,
            q, three_heads, three_heads, cu_q, cu_k)
    refused("v.shape[0] (seq) expected 7 (k.shape[0] (seq)), got 6", selfattn.attention_varlen, q, k,
            np.zeros((6, 2, 16), np.float32), cu_q, [0, 3, 6])
    refused("max_seqlen_q expected <= q.shape[0] (total_q) = 8, got 9", selfattn.attention_varlen, q, k, v, cu_q, cu_k,
            max_seqlen_q=9)


@pytest.mark.parametrize("path", ["auto", "naive"])
def test_derived_max_seqlen_names_cu_seqlens(path):
    """max_seqlen_k left to the wrapper: a cu_seqlens_k no packed k can hold is what the message names."""
    q = np.zeros((8, 4, 16), np.float32)
    k = v = np.zeros((7, 2, 16), np.float32)
    refused("attention_varlen: cu_seqlens_k expected non-decreasing entries in [0, k.shape[0] (total_k) = 7], got "
            "cu_seqlens_k[2] = 12", selfattn.attention_varlen, q, k, v, [0, 4, 8], [0, 3, 12], path=path)
    refused("cu_seqlens_k expected non-decreasing entries in [0, k.shape[0] (total_k) = 7], got cu_seqlens_k[1] = -3",
            selfattn.attention_varlen, q, k, v, [0, 4, 8], [0, -3, 7], path=path)
    refused("cu_seqlens_q expected non-decreasing entries in [0, q.shape[0] (total_q) = 8], got cu_seqlens_q[1] = 9",
            selfattn.attention_varlen, q, k, v, [0, 9, 8], [0, 3, 7], path=path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_attention_backward(layout):
    h, s = HEADS[layout], SEQ[layout]
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(a.shape).astype(np.float32) for a in [zeros((1, 2, 5, 8), layout)] * 3)
    out, lse = selfattn.attention(q, k, v, layout=layout, return_lse=True)
    refused(f"attention_backward: dout.shape[{s}] (seq) expected 5 (q.shape[{s}]), got 4", selfattn.attention_backward,
            q, k, v, out, zeros((1, 2, 4, 8), layout), lse, layout=layout)
    kv = zeros((1, 3, 5, 8), layout)
    refused(f"k.shape[{h}] (kv_heads) expected a divisor of q.shape[{h}] (heads) = 2, got 3",
            selfattn.attention_backward, q, kv, kv, out, out, lse, layout=layout)


def test_attention_varlen_backward():
    q, out = np.zeros((8, 2, 8), np.float32), np.zeros((8, 2, 8), np.float32)
    k = v = np.zeros((7, 2, 8), np.float32)
    lse = np.zeros((2, 8), np.float32)
    refused("attention_varlen_backward: dout.shape[0] (seq) expected 8 (q.shape[0]), got 7",
            selfattn.attention_varlen_backward, q, k, v, out, np.zeros((7, 2, 8), np.float32), lse, [0, 4, 8],
            [0, 3, 7])
    refused("attention_varlen_backward: cu_seqlens_k expected non-decreasing entries in [0, k.shape[0] (total_k) = 7], "
            "got cu_seqlens_k[2] = 12", selfattn.attention_varlen_backward, q, k, v, out, out, lse, [0, 4, 8],
            [0, 3, 12])


class Cache:
    """k_cache, v_cache [2 sequences, 2 kv heads, 8 tokens, head_dim 8] in `layout`: contiguous, or a
    pool of 4 pages of 4 tokens with its block_table."""

    def __init__(self, layout, paged):
        extent = (4, 2, 4, 8) if paged else (2, 2, 8, 8)
        self.k, self.v = zeros(extent, layout), zeros(extent, layout)
        self.table = np.array([[0, 1], [2, 3]], np.int32) if paged else None
        self.batch_source = "block_table.shape[0]" if paged else "k_cache.shape[0]"
        self.layout = layout


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("paged", [False, True])
def test_append_kv(layout, paged):
    h, s = HEADS[layout], SEQ[layout]
    cache = Cache(layout, paged)
    lengths = np.zeros(2, np.int32)

    def append(k_new, v_new, **kwargs):
        selfattn.append_kv(cache.k, cache.v, lengths, k_new, v_new, block_table=cache.table, layout=layout, **kwargs)

    one_head = zeros((2, 1, 1, 8), layout)
    refused(f"append_kv: k_new.shape[{h}] (kv_heads) expected 2 (k_cache.shape[{h}]), got 1", append, one_head,
            one_head)
    three_rows = zeros((3, 2, 1, 8), layout)
    refused(f"k_new.shape[0] (batch) expected 2 ({cache.batch_source}), got 3", append, three_rows, three_rows)
    refused(f"v_new.shape[{s}] expected 2 (k_new.shape[{s}]), got 1", append, zeros((2, 2, 2, 8), layout),
            zeros((2, 2, 1, 8), layout))
    token = zeros((2, 2, 1, 8), layout)
    if paged:
        table = cache.table.copy()
        table[1, 0] = 99
        refused("append_kv: block_table[1][0] expected a page in [0, 4) (k_cache.shape[0]), got 99",
                selfattn.append_kv, cache.k, cache.v, lengths, token, token, block_table=table, layout=layout,
                validate_metadata=True)
        empty_pages = zeros((4, 2, 0, 8), layout)
        refused(f"k_cache.shape[{s}] (page_size) expected >= 1, got 0", selfattn.append_kv, empty_pages,
                empty_pages.copy(), lengths, token, token, block_table=cache.table, layout=layout)
    else:
        refused("append_kv: lengths[0] expected <= 7 (capacity 8 - seq_new 1), got 9", selfattn.append_kv, cache.k,
                cache.v, np.array([9, 0], np.int32), token, token, layout=layout, validate_metadata=True)
        refused(f"v_cache.shape[{s}] expected 8 (k_cache.shape[{s}]), got 4", selfattn.append_kv, cache.k,
                zeros((2, 2, 4, 8), layout), lengths, token, token, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("paged", [False, True])
def test_attention_with_kv_cache(layout, paged):
    h, s = HEADS[layout], SEQ[layout]
    cache = Cache(layout, paged)
    lengths = np.array([3, 5], np.int32)

    def attend(q, **kwargs):
        selfattn.attention_with_kv_cache(q, cache.k, cache.v, lengths, block_table=cache.table, layout=layout,
                                         **kwargs)

    refused(f"attention_with_kv_cache: q.shape[{h}] (heads) expected a multiple of k_cache.shape[{h}] (kv_heads) = 2, "
            "got 3", attend, zeros((2, 3, 1, 8), layout))
    refused(f"q.shape[0] (batch) expected 2 ({cache.batch_source}), got 3", attend, zeros((3, 4, 1, 8), layout))
    q = zeros((2, 4, 1, 8), layout)
    refused(f"out.shape[{s}] expected 1 (q.shape[{s}]), got 2", attend, q, out=zeros((2, 4, 2, 8), layout))
    cos = sin = np.ones((4, 8), np.float32)
    refused("2 * rotary_cos.shape[1] (rotary_dim) expected an even number in [2, head_dim = 8], got 16", attend, q,
            rotary_cos=cos, rotary_sin=sin)
    refused("bias.shape[3] (capacity) expected 8 or 1 (broadcast), got 5", attend, q,
            bias=np.zeros((2, 4, 1, 5), np.float32))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_merge_states(layout):
    h, s = HEADS[layout], SEQ[layout]
    out_a, lse_a = zeros((2, 4, 3, 8), layout), np.zeros((2, 4, 3), np.float32)
    refused(f"merge_states: out_b.shape[{h}] expected 4 (out_a.shape[{h}]), got 3", selfattn.merge_states, out_a,
            lse_a, zeros((2, 3, 3, 8), layout), lse_a, layout=layout)
    refused(f"out.shape[{s}] expected 3 (out_a.shape[{s}]), got 2", selfattn.merge_states, out_a, lse_a,
            zeros((2, 4, 3, 8), layout), lse_a, layout=layout, out=zeros((2, 4, 2, 8), layout))


@pytest.mark.parametrize("with_wo", [False, True])
def test_self_attention(with_wo):
    x = np.zeros((1, 3, 8), np.float32)  # [batch, seq, d_model]
    w = np.zeros((8, 12), np.float32)
    wo = np.zeros((12, 5), np.float32) if with_wo else None
    refused("self_attention: wq.shape[0] expected 8 (x.shape[2], d_model), got 6", selfattn.self_attention, x,
            np.zeros((6, 12), np.float32), w, w, 2, wo=wo)
    refused("wq.shape[1] expected a positive multiple of heads = 5, got 12", selfattn.self_attention, x, w, w, w, 5,
            wo=wo)
    overlapping_rows = np.lib.stride_tricks.as_strided(np.zeros(16, np.float32), (1, 3, 8), (64, 16, 4))
    refused("x.strides[1] (seq) expected in [8, 2147483647] (a GEMM's leading dimension), got 4",
            selfattn.self_attention, overlapping_rows, w, w, w, 2, wo=wo)
    if with_wo:
        refused("out.shape expected [1, 3, 5] ([batch, seq, wo.shape[1]]), got [1, 3, 4]", selfattn.self_attention,
                x, w, w, w, 2, wo=wo, out=np.zeros((1, 3, 4), np.float32))
    else:
        refused("out.shape expected [1, 2, 3, 6] ([batch, heads, seq, head_dim]), got [1, 2, 3, 5]",
                selfattn.self_attention, x, w, w, w, 2, out=np.zeros((1, 2, 3, 5), np.float32))


def test_workspace_too_small_names_the_python_setting():
    q = np.zeros((1, 1, 64, 8), np.float32)
    message = message_of(selfattn.WorkspaceTooSmall, selfattn.attention, q, q, q, path="naive",
                         context=selfattn.Context("sim", workspace_limit=16))
    assert "workspace_limit=" in message and "::" not in message, message


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_custom_ops(layout):
    """Torch tensors reach the library through the custom ops; their errors are translated the same."""
    torch = pytest.importorskip("torch")
    h = HEADS[layout]
    q, kv = torch.from_numpy(zeros((2, 4, 6, 16), layout)), torch.from_numpy(zeros((2, 3, 6, 16), layout))
    refused(f"attention: k.shape[{h}] (kv_heads) expected a divisor of q.shape[{h}] (heads) = 4, got 3",
            selfattn.attention, q, kv, kv, layout=layout)
    q, k = torch.zeros(8, 4, 16), torch.zeros(7, 2, 16)
    cu_q, cu_k = torch.tensor([0, 4, 8], dtype=torch.int32), torch.tensor([0, 3, 12], dtype=torch.int32)
    refused("cu_seqlens_k expected non-decreasing entries in [0, k.shape[0] (total_k) = 7], got cu_seqlens_k[2] = 12",
            selfattn.attention_varlen, q, k, k, cu_q, cu_k)


def test_self_attention_autograd_path_speaks_alike():
    """Weights that require grad are projected by torch, whose checks are the wrapper's own: the same
    names as the library's translated messages."""
    torch = pytest.importorskip("torch")
    x, w = torch.zeros(1, 3, 8), torch.zeros(8, 12, requires_grad=True)
    refused("self_attention: wq.shape[1] expected a positive multiple of heads (5), got 12", selfattn.self_attention,
            x, w, w, w, 5)
    refused("self_attention: wk.shape[0] expected x's d_model (8), got 6", selfattn.self_attention, x, w,
            torch.zeros(6, 12), w, 2)


def test_translation_keeps_names_apart():
    """A name inside a longer one (k in cache.k and k_new, out in out_a) is left alone, and the
    library's own q of self_attention (its projections) keeps its numbers."""
    bshd = _messages.BSHD
    assert _messages.translate("k_new.shape[1] (kv_heads) expected 2 (cache.k.shape[1]), got 1",
                               {"k_new": bshd, "cache.k": bshd}, {}) == \
        "k_new.shape[2] (kv_heads) expected 2 (k_cache.shape[2]), got 1"
    assert _messages.translate("out_a.shape[1] expected 2 (out.shape[1]), got 3", {"out": bshd}, {}) == \
        "out_a.shape[1] expected 2 (out.shape[2]), got 3"
    assert _messages.translate("q.shape[1] (heads) expected 1, got 2", {"x": _messages.ROWS}, {}) == \
        "q.shape[1] (heads) expected 1, got 2"
