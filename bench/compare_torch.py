#!/usr/bin/env python3
"""Time PyTorch's scaled_dot_product_attention on selfattn-bench's shapes, one SDPA backend at a time
(flash, cuDNN, memory-efficient), and this library through its Python package (`import selfattn`)
in the same process on the same tensors, and write selfattn-bench's JSON schema (bench/README.md)
so bench/plot draws them together. Paths are named torch-flash, torch-cudnn, torch-efficient, and
selfattn-op-<path> for the library called on the same torch tensors through its torch op
(--paths auto,naive,cublas,fused), named apart from selfattn-bench's own rows of that path.

  compare_torch.py --from bench.json --json torch.json     # the shapes a bench run measured
  compare_torch.py --json torch.json                       # the bench's default cuda sweep
  compare_torch.py --seq-q 4096 --heads 16 --head-dim 128 --dtype bf16 --causal top_left --paths fused,auto

Needs PyTorch with a CUDA device; without them it says so and exits 2 (nothing is written). The
selfattn package comes from `pip install .` or the build (PYTHONPATH=build/python); without it the
selfattn rows are skipped with the reason (--paths "" leaves them out).
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import subprocess
import sys

BACKENDS = ("flash", "cudnn", "efficient")
PATHS = ("auto", "naive", "cublas", "fused")  # selfattn's, through its Python package
TOLERANCE = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1e-2}  # as selfattn-bench's --check
# Input copies rotated while timing, as selfattn-bench does: twice L2 between reuses, 2..64 copies.
MIN_COPIES, MAX_COPIES, L2_MULTIPLE = 2, 64, 2.0


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def word_list(text):
    return [x for x in text.split(",") if x]


def default_shapes():
    """selfattn-bench's default cuda sweep: 16k tokens per batch, 16 heads of 128, bf16."""
    cases = []
    for seq in (1024, 2048, 4096, 8192, 16384):
        for causal in ("none", "top_left"):
            cases.append(dict(dtype="bf16", batch=16384 // seq, heads=16, kv_heads=16, seq_q=seq, seq_k=seq,
                              head_dim=128, causal=causal, layout="bhsd"))
    return cases


def shapes_from_args(args):
    cases = []
    seq_q = args.seq_q or args.seq_k or [1024]
    for dtype in args.dtype:
        for layout in args.layout:
            for b in args.batch:
                for h in args.heads:
                    for kvh in args.kv_heads or [h]:
                        for sq in seq_q:
                            for sk in args.seq_k or [sq]:
                                for d in args.head_dim:
                                    for causal in args.causal:
                                        cases.append(dict(dtype=dtype, batch=b, heads=h, kv_heads=kvh, seq_q=sq,
                                                          seq_k=sk, head_dim=d, causal=causal, layout=layout))
    return cases


def shapes_from_json(path):
    with open(path) as f:
        doc = json.load(f)
    keys = ("dtype", "batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "causal", "layout")
    seen, cases = set(), []
    for case in doc["cases"]:
        if case["dtype"] not in ("fp32", "fp16", "bf16"):
            continue  # FP8 inputs (--dtype e4m3): SDPA has no FP8 attention to compare with
        shape = tuple(case[k] for k in keys)
        if shape not in seen:
            seen.add(shape)
            cases.append(dict(zip(keys, shape)))
    return cases, doc.get("header", {})


def visible_keys(row, seq_q, seq_k, causal):
    """The library's mask rule (selfattn/types.h): keys [0, n) that query `row` sees."""
    if causal == "none":
        return seq_k
    n = row + 1 if causal == "top_left" else row + 1 + seq_k - seq_q
    return max(0, min(n, seq_k))


def visible_pairs(c):
    if c["causal"] == "none":
        return c["seq_q"] * c["seq_k"]
    return sum(visible_keys(r, c["seq_q"], c["seq_k"], c["causal"]) for r in range(c["seq_q"]))


def git_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        stamp = os.path.join(here, "..", ".deps", "git-commit")
        return open(stamp).read().strip() if os.path.exists(stamp) else "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="from_json", help="take the shapes from a selfattn-bench JSON file")
    parser.add_argument("--backends", type=word_list, default=list(BACKENDS), help="flash,cudnn,efficient")
    parser.add_argument("--paths", type=word_list, default=["auto"],
                        help="selfattn paths to run on the same tensors: auto,naive,cublas,fused (\"\": none)")
    parser.add_argument("--batch", type=int_list, default=[1])
    parser.add_argument("--heads", type=int_list, default=[16])
    parser.add_argument("--kv-heads", type=int_list, default=[])
    parser.add_argument("--seq-q", type=int_list, default=[])
    parser.add_argument("--seq-k", type=int_list, default=[])
    parser.add_argument("--head-dim", type=int_list, default=[128])
    parser.add_argument("--dtype", type=word_list, default=["bf16"])
    parser.add_argument("--causal", type=word_list, default=["none"])
    parser.add_argument("--layout", type=word_list, default=["bhsd"])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--json", help="write the results here (selfattn-bench's schema)")
    args = parser.parse_args()
    for b in args.backends:
        if b not in BACKENDS:
            parser.error(f"unknown backend {b!r}; choose from {','.join(BACKENDS)}")
    for p in args.paths:
        if p not in PATHS:
            parser.error(f"unknown selfattn path {p!r}; choose from {','.join(PATHS)}")

    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"compare_torch.py: PyTorch is not available here ({e}); nothing to compare. "
              "Run it where PyTorch with CUDA is installed.", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"compare_torch.py: PyTorch {torch.__version__} sees no CUDA device; nothing to compare.", file=sys.stderr)
        return 2

    bench_header = {}
    if args.from_json:
        try:
            shapes, bench_header = shapes_from_json(args.from_json)
        except (OSError, ValueError, KeyError) as e:
            print(f"compare_torch.py: cannot read shapes from {args.from_json}: {e}", file=sys.stderr)
            return 2
    elif args.seq_q or args.seq_k:
        shapes = shapes_from_args(args)
    else:
        shapes = default_shapes()

    selfattn, selfattn_missing = None, ""
    if args.paths:
        try:
            import selfattn
        except ImportError as e:
            selfattn_missing = (f"the selfattn Python package is not importable ({e}); pip install . or "
                                "PYTHONPATH=build/python")
            print(f"compare_torch.py: {selfattn_missing}", file=sys.stderr)

    import torch.nn.functional as F
    sdpa_backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION}
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 << 20)
    gpu = torch.cuda.get_device_name(0)
    ceilings = bench_header.get("ceilings") or {}
    gemm_ceiling = ceilings.get("gemm_tflops")

    def make_inputs(c):
        g = torch.Generator(device="cuda").manual_seed(1234)
        dt = torch_dtype[c["dtype"]]

        def tensor(heads, seq):
            if c["layout"] == "bshd":  # [b, s, h, d] viewed as [b, h, s, d]
                return torch.randn(c["batch"], seq, heads, c["head_dim"], device="cuda", dtype=dt,
                                   generator=g).transpose(1, 2)
            return torch.randn(c["batch"], heads, seq, c["head_dim"], device="cuda", dtype=dt, generator=g)

        q, k, v = tensor(c["heads"], c["seq_q"]), tensor(c["kv_heads"], c["seq_k"]), tensor(c["kv_heads"], c["seq_k"])
        set_bytes = 2 * (q.numel() + k.numel()) * q.element_size()
        copies = int(min(MAX_COPIES, max(MIN_COPIES, math.ceil(L2_MULTIPLE * l2_bytes / set_bytes))))
        return [(q, k, v)] + [(q.clone(), k.clone(), v.clone()) for _ in range(copies - 1)]

    def call_selfattn(c, path, q, k, v):
        # q, k, v are [b, h, s, d] (BSHD strides for layout bshd): selfattn takes the strides as they are.
        return selfattn.attention(q, k, v, causal=None if c["causal"] == "none" else c["causal"], path=path)

    def call(c, q, k, v):
        kwargs = {}
        if c["kv_heads"] != c["heads"]:
            kwargs["enable_gqa"] = True
        if c["causal"] == "top_left" or (c["causal"] == "bottom_right" and c["seq_q"] == c["seq_k"]):
            kwargs["is_causal"] = True
        elif c["causal"] == "bottom_right":
            from torch.nn.attention.bias import causal_lower_right
            kwargs["attn_mask"] = causal_lower_right(c["seq_q"], c["seq_k"])
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    def sampled_error(c, q, k, v, out):
        """max abs and relative error on a few rows against a float64 reference (the bench's --check rule)."""
        sq = c["seq_q"]
        gen = torch.Generator().manual_seed(sq)
        rows = sorted(set([0, min(1, sq - 1), sq // 2, sq - 1] + torch.randint(0, sq, (12,), generator=gen).tolist()))
        group = c["heads"] // c["kv_heads"]
        qd = q[:, :, rows].double()
        kd = k.double().repeat_interleave(group, dim=1)
        vd = v.double().repeat_interleave(group, dim=1)
        scores = qd @ kd.transpose(-1, -2) / math.sqrt(c["head_dim"])
        n = torch.tensor([visible_keys(r, sq, c["seq_k"], c["causal"]) for r in rows], device="cuda")
        masked = torch.arange(c["seq_k"], device="cuda")[None, :] >= n[:, None]
        scores = scores.masked_fill(masked, float("-inf"))
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row that sees no key outputs 0
        ref = p @ vd
        diff = out[:, :, rows].double() - ref
        ref_norm = ref.norm().item()
        rel = diff.norm().item() / ref_norm if ref_norm > 0 else out[:, :, rows].double().norm().item()
        return diff.abs().max().item(), rel

    # What runs each case: PyTorch's SDPA once per backend, then selfattn once per path.
    runners = [("torch-" + b, lambda b=b: sdpa_kernel([sdpa_backend[b]]), call) for b in args.backends]
    runners += [("selfattn-op-" + p, contextlib.nullcontext, lambda c, q, k, v, p=p: call_selfattn(c, p, q, k, v))
                for p in args.paths]

    results = []
    total = len(shapes) * len(runners)
    for i, c in enumerate(shapes):
        inputs = make_inputs(c)
        flops = 4.0 * c["batch"] * c["heads"] * c["head_dim"] * visible_pairs(c)
        nbytes = 2.0 * (c["batch"] * c["heads"] * c["seq_q"] + c["batch"] * c["kv_heads"] * c["seq_k"]) * \
            c["head_dim"] * inputs[0][0].element_size()
        for j, (name, scope, run) in enumerate(runners):
            print(f"[{i * len(runners) + j + 1}/{total}] {name} {c}", file=sys.stderr, flush=True)
            r = dict(backend="cuda", gpu=gpu, path=name, resolved_path=None, **c,
                     status="skipped", note="", ms_median=None, ms_min=None, ms_max=None, tflops=None, gbps=None,
                     pct_of_ceiling=None, vs_cublas=None, max_abs_err=None, rel_err=None, check="skipped",
                     check_sampled=None, flops=flops, bytes=nbytes, input_copies=len(inputs))
            if name.startswith("selfattn-op-") and selfattn is None:
                r["note"] = selfattn_missing
                results.append(r)
                continue
            try:
                with scope():
                    out = run(c, *inputs[0])
                    torch.cuda.synchronize()
                    r["max_abs_err"], r["rel_err"] = sampled_error(c, *inputs[0], out)
                    passed = r["rel_err"] <= TOLERANCE[c["dtype"]]
                    r["check"], r["check_sampled"] = ("pass" if passed else "fail"), True
                    for w in range(args.warmup):
                        run(c, *inputs[(w + 1) % len(inputs)])
                    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                              for _ in range(args.iters)]
                    for it, (start, stop) in enumerate(events):
                        start.record()
                        run(c, *inputs[it % len(inputs)])
                        stop.record()
                    torch.cuda.synchronize()
                ms = sorted(start.elapsed_time(stop) for start, stop in events)
                median = ms[len(ms) // 2] if len(ms) % 2 else 0.5 * (ms[len(ms) // 2 - 1] + ms[len(ms) // 2])
                r.update(status="ok" if passed else "FAILED", ms_median=median, ms_min=ms[0], ms_max=ms[-1],
                         tflops=flops / (median * 1e-3) / 1e12, gbps=nbytes / (median * 1e-3) / 1e9)
                if gemm_ceiling:
                    r["pct_of_ceiling"] = 100.0 * r["tflops"] / gemm_ceiling
            except Exception as e:  # "No available kernel", selfattn.NotAvailable and friends: can't run the case
                r["note"] = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                r["check"] = "skipped"
            results.append(r)
        del inputs
        torch.cuda.empty_cache()

    print(f"{'path':16} {'dtype':5} {'b':>3} {'h':>3} {'kvh':>3} {'seq_q':>6} {'seq_k':>6} {'d':>4} {'causal':12} "
          f"{'median_ms':>10} {'TFLOPS':>8} {'rel_err':>9} check")
    for r in results:
        head = (f"{r['path']:16} {r['dtype']:5} {r['batch']:3} {r['heads']:3} {r['kv_heads']:3} {r['seq_q']:6} "
                f"{r['seq_k']:6} {r['head_dim']:4} {r['causal']:12} ")
        if r["ms_median"] is None:
            print(head + f"skipped: {r['note']}")
        else:
            print(head + f"{r['ms_median']:10.4f} {r['tflops']:8.2f} {r['rel_err']:9.2e} {r['check']}")

    if args.json:
        versions = "torch " + torch.__version__ + (f", selfattn {selfattn.__version__}" if selfattn else "")
        header = dict(schema="selfattn-bench/1", backend="cuda", gpu=gpu, library_version=versions,
                      git_commit=git_commit(), command_line=" ".join(sys.argv),
                      date_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                      timing="CUDA events (torch.cuda.Event), after warm-up", warmup=args.warmup, iters=args.iters,
                      check=True, tolerance="per dtype",
                      ceilings=ceilings or dict(gemm_tflops=None, gemm_shape="", copy_gbps=None, copy_bytes=""))
        with open(args.json, "w") as f:
            json.dump(dict(header=header, cases=results), f, indent=2)
    return 1 if any(r["status"] == "FAILED" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
