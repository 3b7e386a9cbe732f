"""selfattn.distributed.ring_attention across processes: groups of 2 and 4 ranks (gloo, spawned
processes, the kernels on the sim), forward and backward, each case against the float64 reference
and against selfattn.attention() and its backward on the unsharded tensors (distributed_support.judge,
same_as_single_device): contiguous and zigzag layouts, causal, GQA, windows (the ring ending early),
sinks, softcap, packed documents split across ranks, bfloat16 and float32, lengths that do not
divide (padded, seq_len=). Then what must fail: ranks that disagree on shapes or options all raise,
and a rank that fails mid-ring brings the others down by the group's timeout, never a hang.
Skipped without PyTorch or its gloo backend."""
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this PyTorch has no torch.distributed with gloo", allow_module_level=True)
pytest.importorskip("selfattn.distributed")  # it needs torch.library.custom_op (PyTorch 2.4)

from distributed_support import attention_job, generator, judge, same_as_single_device, spawn  # noqa: E402

RING_2 = [
    attention_job("contiguous_causal_gqa_f32", "ring", "bhsd", "contiguous", "float32", 64, 4, 2, 32,
                  dict(causal="top_left")),
    attention_job("zigzag_causal_sinks_softcap_bf16_odd", "ring", "bshd", "zigzag", "bfloat16", 61, 4, 1, 16,
                  dict(causal="bottom_right", softcap=5.0, scale=0.3), batch=2, sinks=True, seq_len=61),
    attention_job("contiguous_window_f32", "ring", "bhsd", "contiguous", "float32", 48, 2, 2, 64,
                  dict(window=(5, 3))),
    attention_job("zigzag_causal_window_bf16", "ring", "bhsd", "zigzag", "bfloat16", 64, 4, 2, 32,
                  dict(causal="top_left", window=(9, 0))),
    attention_job("no_mask_odd_f32", "ring", "bshd", "contiguous", "float32", 39, 2, 1, 16, {}, seq_len=39),
    attention_job("varlen_zigzag_causal_sinks_f32", "ring", "packed", "zigzag", "float32", 52, 4, 2, 16,
                  dict(causal="top_left", cu_seqlens=[0, 7, 30, 31, 50]), sinks=True),
    attention_job("varlen_contiguous_window_bf16", "ring", "packed", "contiguous", "bfloat16", 44, 2, 2, 32,
                  dict(window=(6, 2), softcap=3.0, cu_seqlens=[0, 20, 21, 44])),
]
RING_4 = [
    attention_job("zigzag_causal_gqa_bf16", "ring", "bshd", "zigzag", "bfloat16", 64, 4, 2, 32,
                  dict(causal="top_left"), sinks=True),
    attention_job("contiguous_causal_window_ends_early_f32", "ring", "bhsd", "contiguous", "float32", 64, 2, 1, 16,
                  dict(causal="top_left", window=(10, 0))),
    attention_job("varlen_zigzag_window_odd_f32", "ring", "packed", "zigzag", "float32", 45, 2, 1, 16,
                  dict(causal="bottom_right", window=(7, 0), cu_seqlens=[0, 3, 26, 41])),
]


def failure_jobs():
    """The jobs that must fail cleanly (run after RING_2 in its group)."""
    g = generator("failures")
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(3))
    base = dict(q=q, k=k, v=v, causal="top_left")
    longer = {name: torch.randn(1, 2, 9, 16, generator=g) for name in ("q", "k", "v")}
    return [
        dict(name="shapes_disagree", kind="disagree", function="ring", arguments=base, rank1=longer),
        dict(name="options_disagree", kind="disagree", function="ring", arguments=dict(base, window=(3, 0)),
             rank1=dict(window=(4, 0))),
        dict(name="zigzag_needs_even_rows", kind="disagree", function="ring",
             arguments=dict(base, sharding="zigzag", q=q[:, :, :7], k=k[:, :, :7], v=v[:, :, :7]), rank1={}),
        dict(name="rank_fails_mid_ring", kind="fail_mid_ring", timeout_s=5,
             q=torch.randn(1, 2, 16, 16, generator=g), k=torch.randn(1, 2, 16, 16, generator=g),
             v=torch.randn(1, 2, 16, 16, generator=g)),
    ]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return spawn(2, RING_2 + failure_jobs(), tmp_path_factory.mktemp("ring2"))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return spawn(4, RING_4, tmp_path_factory.mktemp("ring4"))


@pytest.mark.parametrize("job", RING_2, ids=lambda job: job["name"])
def test_two_ranks_match_one_device(two_ranks, job):
    found = two_ranks[0][job["name"]]
    judge(job, found)
    same_as_single_device(job, found)
    assert all(torch.equal(found["out"], ranks[job["name"]]["out"]) for ranks in two_ranks)  # gathered alike


@pytest.mark.parametrize("job", RING_4, ids=lambda job: job["name"])
def test_four_ranks_match_one_device(four_ranks, job):
    found = four_ranks[0][job["name"]]
    judge(job, found)
    same_as_single_device(job, found)


@pytest.mark.parametrize("name,needle", [
    ("shapes_disagree", "disagree on q.shape (rank 0: (1, 2, 8, 16), rank 1: (1, 2, 9, 16))"),
    ("options_disagree", "disagree on window (rank 0: (3, 0), rank 1: (4, 0))"),
    ("zigzag_needs_even_rows", "q.shape[2] (this rank's rows) expected an even number under sharding='zigzag'"),
])
def test_bad_input_raises_on_every_rank(two_ranks, name, needle):
    for rank, results in enumerate(two_ranks):
        found = results[name]
        assert found["error"] == "InvalidArgument", (rank, found)
        assert needle in found["message"] and found["message"].startswith("ring_attention: "), found["message"]


def test_a_rank_failing_mid_ring_ends_the_others_by_the_timeout(two_ranks):
    # Rank 1 raises its own error; rank 0, waiting for its dK/dV, raises gloo's timeout after the
    # group's 5 s (not a hang), and no sooner than that.
    failed, waiting = two_ranks[1]["rank_fails_mid_ring"], two_ranks[0]["rank_fails_mid_ring"]
    assert failed["error"] == "RuntimeError" and "planted by the test" in failed["message"]
    assert waiting["error"] is not None, waiting
    assert "Timed out" in waiting["message"] or "timeout" in waiting["message"].lower(), waiting["message"]
    assert 4 <= waiting["seconds"] <= 60, waiting


@pytest.fixture
def group_of_one(tmp_path):
    """A gloo group of this process alone (world size 1), its name as the ops take it."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


def test_the_ops_pass_opcheck(group_of_one):
    # Registered at the import of selfattn.distributed (where torch.compile finds them); their schemas,
    # fake implementations and autograd registrations as torch.library.opcheck checks them, on a
    # group of one rank (dense bhsd under zigzag with padding, packed documents; with sinks).
    import selfattn.distributed  # noqa: F401
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("this PyTorch has no torch.library.opcheck")
    g = generator("opcheck")
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(3))
    sinks = torch.tensor([0.5, -float("inf")])
    utils = ("test_schema", "test_faketensor", "test_autograd_registration")
    ring, backward = torch.ops.selfattn.ring_attention.default, torch.ops.selfattn.ring_attention_backward.default
    options = (group_of_one, "bhsd", "zigzag", 7, "top_left", None, 3, 0, None, "auto", False)
    torch.library.opcheck(ring, (q, k, v, None, *options, sinks), test_utils=utils)
    out, lse = ring(q, k, v, None, *options, sinks)
    torch.library.opcheck(backward, (q, k, v, out, torch.randn_like(out), lse, torch.randn_like(lse), None, *options,
                                     sinks, True), test_utils=utils[:2])
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]  # [total, heads, dim], strided
    torch.library.opcheck(ring, (*packed, cu, group_of_one, "bhsd", "contiguous", -1, None, 0.5, -1, -1, 2.0, "auto",
                                 True, None), test_utils=utils)
    moves = torch.ops.selfattn.ulysses_all_to_all.default
    torch.library.opcheck(moves, ([q, k], group_of_one, [2, 2], [1, 1], True, "q,k", "causal=None"),
                          test_utils=utils)
