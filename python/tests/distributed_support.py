"""What the test_distributed_*.py files run in spawned processes: one gloo process group of `world`
ranks (torch.multiprocessing, start method "spawn", a FileStore in the test's tmp_path), in which
each rank runs a list of jobs and saves what it found; the test process then judges it. Spawning
costs seconds, so each test file spawns few groups and gives each many jobs.

A job is a dict with a "kind" (a function below) and its inputs (whole tensors, cut into shards
here). Its result is a dict; an exception becomes {"error": type name, "message": ...}, so one
job's failure is reported by its own test and the others still run (a failure on some ranks only
would leave the others waiting: the group's timeout then ends them)."""
import datetime
import os
import time
import traceback
import zlib

SEED = int(os.environ.get("SELFATTN_SIM_SEED", "0"))
SEQ_DIM = {"bhsd": 2, "bshd": 1, "packed": 0}


def spawn(world, jobs, directory, timeout_s=120):
    """Runs `jobs` on a new group of `world` ranks; returns each rank's results {job name: result}."""
    import torch
    import torch.multiprocessing as mp
    torch.save(jobs, directory / "jobs.pt")
    backend = os.environ.get("SELFATTN_BACKEND", "sim")
    mp.start_processes(_rank_main, args=(world, str(directory), backend, timeout_s), nprocs=world, join=True,
                       start_method="spawn")
    return [torch.load(directory / f"results{rank}.pt", weights_only=False) for rank in range(world)]


def _rank_main(rank, world, directory, backend, timeout_s):
    os.environ["SELFATTN_BACKEND"] = backend  # the parent's choice, whatever the child's environment says
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)  # several ranks share two cores
    dist.init_process_group("gloo", init_method=f"file://{directory}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    results = {}
    for job in torch.load(f"{directory}/jobs.pt", weights_only=False):
        try:
            results[job["name"]] = KINDS[job["kind"]](rank, world, job)
        except Exception as error:
            results[job["name"]] = {"error": type(error).__name__, "message": str(error),
                                    "traceback": traceback.format_exc()}
    torch.save(results, f"{directory}/results{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def attend(rank, world, job):
    """ring_attention or ulysses_attention on the shards of the job's q, k, v, then the backward for
    the upstream gradients dout and dlse; returns the whole (padded) out, lse, dq, dk, dv, gathered
    on every rank, and dsinks summed over the ranks."""
    import torch
    import torch.distributed as dist
    from selfattn.distributed import gather, ring_attention, shard, ulysses_attention
    function = {"ring": ring_attention, "ulysses": ulysses_attention}[job["function"]]
    layout, sharding = job["layout"], job["sharding"]
    seq_dim, lse_dim = SEQ_DIM[layout], 1 if layout == "packed" else 2

    def cut(name, dim):
        return shard(job[name], world, rank, sharding=sharding, dim=dim)

    q, k, v = (cut(name, seq_dim).requires_grad_() for name in ("q", "k", "v"))
    sinks = None if job.get("sinks") is None else job["sinks"].clone().requires_grad_()
    options = dict(job["options"])
    if layout != "packed":
        options["layout"] = layout
    out, lse = function(q, k, v, sharding=sharding, seq_len=job.get("seq_len"), sinks=sinks, return_lse=True,
                        **options)
    torch.autograd.backward([out, lse], [cut("dout", seq_dim), cut("dlse", lse_dim)])
    found = {"out": gather(out.detach(), sharding=sharding, dim=seq_dim),
             "lse": gather(lse.detach(), sharding=sharding, dim=lse_dim)}
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        found[name] = gather(t.grad, sharding=sharding, dim=seq_dim)
    if sinks is not None:
        dist.all_reduce(sinks.grad)  # each rank's part (its rows, or its heads): the whole gradient summed
        found["dsinks"] = sinks.grad
    return found


def disagree(rank, world, job):
    """Rank 1 passes other arguments than the others (job["rank1"] replaces some): every rank must
    raise, none may wait for the others."""
    import torch
    from selfattn.distributed import ring_attention, ulysses_attention
    function = {"ring": ring_attention, "ulysses": ulysses_attention}[job["function"]]
    arguments = dict(job["arguments"], **(job["rank1"] if rank == 1 else {}))
    q, k, v = (arguments.pop(name) for name in ("q", "k", "v"))
    started = time.monotonic()
    with torch.no_grad():
        function(q, k, v, **arguments)
    return {"error": None, "seconds": time.monotonic() - started}


def fail_mid_ring(rank, world, job):
    """On a group with a short timeout, rank 1 raises in the ring backward's second call (after the
    K/V exchanges, before it sends dK/dV home); the other ranks, waiting for those, must raise when
    the group's timeout runs out. Every rank returns what it raised and how long it took."""
    import torch
    import torch.distributed as dist
    from selfattn.distributed import _ring_steps, ring_attention, shard
    group = dist.new_group(timeout=datetime.timedelta(seconds=job["timeout_s"]))
    if rank == 1:
        calls = []
        real = _ring_steps._attend_backward

        def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("rank 1 fails mid-ring (planted by the test)")
            return real(*args, **kwargs)

        _ring_steps._attend_backward = failing
    q, k, v = (shard(job[name], world, rank).requires_grad_() for name in ("q", "k", "v"))
    started = time.monotonic()
    try:
        ring_attention(q, k, v, group=group, causal="top_left").sum().backward()
        outcome = {"error": None}
    except Exception as error:
        outcome = {"error": type(error).__name__, "message": str(error)}
    outcome["seconds"] = time.monotonic() - started
    dist.barrier()  # the failed rank stays in the default group until the others have seen the timeout
    return outcome


def compiled(rank, world, job):
    """ring_attention and ulysses_attention inside torch.compile(fullgraph=True) (a graph break raises)
    train as they do eagerly: the same loss and gradients, sinks' included."""
    import torch
    from selfattn.distributed import ring_attention, shard, ulysses_attention
    inputs = [shard(job[name], world, rank, sharding="zigzag").requires_grad_() for name in ("q", "k", "v")]
    inputs.append(job["sinks"].clone().requires_grad_())
    found = {}
    for name, function in (("ring", ring_attention), ("ulysses", ulysses_attention)):
        def loss(q, k, v, sinks):
            out, lse = function(q * 1.5, k, v, causal="top_left", sharding="zigzag", sinks=sinks, return_lse=True)
            return (out.float() ** 2).sum() + lse.sum()

        runs = []
        for step in (torch.compile(loss, backend="aot_eager", fullgraph=True), loss):
            value = step(*inputs)
            value.backward()
            runs.append([value.detach()] + [t.grad.clone() for t in inputs])
            for t in inputs:
                t.grad = None
        found[name] = runs
    return found


def model(rank, world, job):
    """A small model (projections, ring attention, output projection) trains across ranks as on one
    device: the loss summed over the ranks and the weights' gradients summed over the ranks, to
    compare with the same model on the whole sequence (selfattn.attention)."""
    import torch
    import torch.distributed as dist
    from selfattn.distributed import ring_attention, shard
    torch.manual_seed(0)
    layer = _Layer(job["d_model"], job["heads"], job["head_dim"])
    x = shard(job["x"], world, rank, sharding="zigzag", dim=1)
    loss = layer(x, lambda q, k, v: ring_attention(q, k, v, layout="bshd", sharding="zigzag", causal="top_left"))
    loss.backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    for g in grads:
        dist.all_reduce(g)
    dist.all_reduce(loss.detach())
    return {"loss": loss.detach(), "grads": grads}


class _Layer:
    """q, k, v projections of x [batch, seq, d_model], attention, an output projection, and a loss of
    the output's squares; the weights from torch.manual_seed(0), so every process makes the same."""

    def __init__(self, d_model, heads, head_dim):
        import torch
        self.heads, self.head_dim = heads, head_dim
        self.qkv = torch.nn.Linear(d_model, 3 * heads * head_dim)
        self.out = torch.nn.Linear(heads * head_dim, d_model)

    def parameters(self):
        return [*self.qkv.parameters(), *self.out.parameters()]

    def __call__(self, x, attend):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, self.head_dim).unbind(2)
        attended = attend(q, k, v).reshape(batch, seq, self.heads * self.head_dim)
        return (self.out(attended) ** 2).sum()


def single_device_model(job):
    """The model of `model` on the whole sequence, on one device: (loss, gradients)."""
    import torch
    import selfattn
    torch.manual_seed(0)
    layer = _Layer(job["d_model"], job["heads"], job["head_dim"])
    loss = layer(job["x"], lambda q, k, v: selfattn.attention(q, k, v, layout="bshd", causal="top_left"))
    loss.backward()
    return loss.detach(), [p.grad for p in layer.parameters()]


KINDS = {"attend": attend, "disagree": disagree, "fail_mid_ring": fail_mid_ring, "compiled": compiled,
         "model": model}


# --- the test process's side: the jobs' inputs ---

def generator(name):
    """A torch generator seeded by `name` and SELFATTN_SIM_SEED (each seeded run its own inputs)."""
    import torch
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) * 16 + SEED)


def attention_job(name, function, layout, sharding, dtype, seq, heads, kv_heads, head_dim, options, batch=1,
                  sinks=False, seq_len=None):
    """A job for distributed_support.attend: random q, k, v, dout, dlse of the whole sequence (seq rows;
    packed [seq, heads, head_dim] when layout is "packed"), rounded to dtype."""
    import torch
    g = generator(name)
    shapes = {"bhsd": lambda h: (batch, h, seq, head_dim), "bshd": lambda h: (batch, seq, h, head_dim),
              "packed": lambda h: (seq, h, head_dim)}[layout]

    def draw(shape):
        return torch.randn(shape, generator=g).to(getattr(torch, dtype))

    lse_shape = (heads, seq) if layout == "packed" else (batch, heads, seq)
    return dict(name=name, kind="attend", function=function, layout=layout, sharding=sharding,
                q=draw(shapes(heads)), k=draw(shapes(kv_heads)), v=draw(shapes(kv_heads)), dout=draw(shapes(heads)),
                dlse=torch.randn(lse_shape, generator=g) * 0.5, options=options, seq_len=seq_len,
                sinks=torch.randn(heads, generator=g) if sinks else None)


# --- the test process's side: the expected values, and the judge rule of tests/README.md ---

def real_length(job):
    """The sequence's real length: cu_seqlens[-1] for packed documents, else q's rows."""
    cu = job["options"].get("cu_seqlens")
    return cu[-1] if cu is not None else job["q"].shape[SEQ_DIM[job["layout"]]]


def _bhsd(t, layout):
    """A torch tensor of `layout` as a float64 NumPy array in the reference's [batch, heads, seq, dim]."""
    a = t.detach().double().numpy()
    if layout == "bshd":
        return a.transpose(0, 2, 1, 3)
    return a.transpose(1, 0, 2)[None] if layout == "packed" else a


def _reference_mods(job):
    """The job's options as conftest.reference() takes them (NumPy; the causal mask apart)."""
    mods = {}
    for name, value in job["options"].items():
        if name in ("window", "softcap", "scale"):
            mods[name] = value
        elif name in ("alibi_slopes", "bias", "key_lengths"):
            mods[name] = value.numpy()
    if job.get("sinks") is not None:
        mods["sinks"] = job["sinks"].numpy()
    return mods


def _pieces(job):
    """(rows of the whole sequence, options of the reference) for each piece the reference computes
    alone: the whole sequence, or each packed document."""
    n, mods = real_length(job), _reference_mods(job)
    cu = job["options"].get("cu_seqlens")
    if cu is None:
        return [(slice(0, n), mods)]
    pieces = []
    for d, (a, b) in enumerate(zip(cu, cu[1:])):
        alibi = mods.get("alibi_slopes")
        one = dict(mods, alibi_slopes=alibi[d]) if alibi is not None and alibi.ndim == 2 else mods
        pieces.append((slice(a, b), one))
    return pieces


def judge(job, found):
    """The distributed results (found: attend()'s, whole and padded) against the float64 reference
    (conftest.reference and reference_backward on the inputs as rounded): out and lse by
    conftest.check (rows to TOLERANCE[dtype], lse to 1e-5, -inf exactly where a row sees nothing),
    gradients to 2 TOLERANCE[dtype] as a whole; the padding rows: out 0, lse -inf, gradients 0."""
    import numpy as np
    from conftest import TOLERANCE, check, reference, reference_backward, relative_error
    assert "error" not in found, found.get("traceback")
    dtype = str(job["q"].dtype).replace("torch.", "")
    layout, seq_dim = job["layout"], SEQ_DIM[job["layout"]]
    lse_dim, n = (1 if layout == "packed" else 2), real_length(job)
    for name in ("out", "dq", "dk", "dv"):
        padding = found[name].narrow(seq_dim, n, found[name].shape[seq_dim] - n)
        assert bool((padding == 0).all()), f"{name}: the padding rows expected 0"
    assert bool((found["lse"].narrow(lse_dim, n, found["lse"].shape[lse_dim] - n) == -float("inf")).all())
    causal = job["options"].get("causal")
    dsinks = np.zeros(job["q"].shape[seq_dim - 1 if layout == "bhsd" else seq_dim + 1])
    for rows, mods in _pieces(job):
        def part(t, dim=seq_dim):
            return t.narrow(dim, rows.start, rows.stop - rows.start)

        q, k, v, dout = (_bhsd(part(job[name]), layout) for name in ("q", "k", "v", "dout"))
        lse = part(found["lse"], lse_dim).numpy()
        dlse = part(job["dlse"], lse_dim).double().numpy()
        want_out, want_lse = reference(q, k, v, causal, **mods)
        check(_bhsd(part(found["out"]), layout), lse if layout != "packed" else lse[None], want_out,
              want_lse, dtype)
        want = reference_backward(q, k, v, dout, causal, dlse=dlse if layout != "packed" else dlse[None], **mods)
        for name, expected in zip(("dq", "dk", "dv"), want):
            got = _bhsd(part(found[name]), layout)
            assert relative_error(got, expected, per_row=False) <= 2 * TOLERANCE[dtype], (name, rows)
        if "sinks" in mods:
            dsinks += want[3]
    if job.get("sinks") is not None:
        assert relative_error(found["dsinks"].numpy(), dsinks, per_row=False) <= 2 * TOLERANCE[dtype]


def single_device(job):
    """The same attention on one device (selfattn.attention or attention_varlen on the whole real
    sequence, backward through its custom op): out, lse, dq, dk, dv (and dsinks)."""
    import torch
    import selfattn
    layout, seq_dim, n = job["layout"], SEQ_DIM[job["layout"]], real_length(job)
    q, k, v = (job[name].narrow(seq_dim, 0, n).clone().requires_grad_() for name in ("q", "k", "v"))
    sinks = None if job.get("sinks") is None else job["sinks"].clone().requires_grad_()
    options = dict(job["options"])
    if layout == "packed":
        cu = torch.tensor(options.pop("cu_seqlens"), dtype=torch.int32)
        out, lse = selfattn.attention_varlen(q, k, v, cu, cu, sinks=sinks, return_lse=True, **options)
    else:
        out, lse = selfattn.attention(q, k, v, layout=layout, sinks=sinks, return_lse=True, **options)
    lse_dim = 1 if layout == "packed" else 2
    torch.autograd.backward([out, lse], [job["dout"].narrow(seq_dim, 0, n), job["dlse"].narrow(lse_dim, 0, n)])
    found = {"out": out.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    if sinks is not None:
        found["dsinks"] = sinks.grad
    return found


def same_as_single_device(job, found):
    """The distributed results against the single-device call's, to the same tolerances (out per row,
    gradients as a whole; lse where finite to 1e-5)."""
    import torch
    from conftest import TOLERANCE, relative_error
    dtype = str(job["q"].dtype).replace("torch.", "")
    one = single_device(job)
    layout, n = job["layout"], real_length(job)
    for name, bound in (("out", 1), ("dq", 2), ("dk", 2), ("dv", 2), ("dsinks", 2)):
        if name not in one:
            continue
        dim = SEQ_DIM[layout] if name != "dsinks" else 0
        got = found[name] if name == "dsinks" else found[name].narrow(dim, 0, n)
        assert relative_error(_bhsd(got, layout) if name != "dsinks" else got.numpy(),
                              _bhsd(one[name], layout) if name != "dsinks" else one[name].numpy(),
                              per_row=name == "out") <= bound * TOLERANCE[dtype], name
    lse = found["lse"].narrow(1 if layout == "packed" else 2, 0, n)
    assert torch.equal(torch.isfinite(lse), torch.isfinite(one["lse"]))
    finite = torch.isfinite(lse)
    assert torch.allclose(lse[finite], one["lse"][finite], rtol=1e-5, atol=1e-5)
