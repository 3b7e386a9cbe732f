#!/usr/bin/env python3
"""Time selfattn.distributed.ring_attention (and ulysses_attention) across the ranks of a torchrun
job, against the single-device attention() of the whole sequence, and print what each rank sends.
A user of the public API only (selfattn, selfattn.distributed).

  torchrun --nproc-per-node 8 bench/ring_attention.py --seq 131072 --causal   # 8 GPUs, NCCL
  torchrun --nproc-per-node 2 bench/ring_attention.py --seq 8192              # 1 GPU: the plumbing only
  torchrun --nproc-per-node 2 bench/ring_attention.py --seq 64 --heads 4 --kv-heads 2 --head-dim 32 --iters 1
                                                                               # no GPU: gloo, the sim

Where each rank has its own GPU the group is NCCL's. Where ranks outnumber the GPUs (one GPU: every
rank on it) the group is gloo's, which stages each transfer through the host: the times then say
that the plumbing works, not what the ring costs. Without a GPU the tensors stay on the CPU and run
on the sim (tiny shapes only).

Efficiency = (single-device time of the whole sequence / ranks) / ring time: 1 is a perfect split
(communication hidden, no overhead). The single-device time comes from rank 0 alone, on its device,
while the others wait (--no-single skips it where the whole sequence does not fit one device).
Bytes per rank are counted from the ring's schedule (every step runs without a window): K/V
(q's dtype) W - 1 times forward and again backward, dK/dV in fp32 W - 1 times backward; the ideal
is what any split must move: every rank receives the other ranks' K/V once per pass, and the
reduce-scatter of dK/dV moves (W - 1) / W of them.
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=8192, help="tokens of the whole sequence")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--causal", action="store_true", help="causal mask (zigzag sharding then)")
    parser.add_argument("--strategy", choices=("ring", "ulysses"), default="ring")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations (median reported); one warm-up first")
    parser.add_argument("--no-backward", action="store_true", help="time the forward only")
    parser.add_argument("--no-single", action="store_true", help="skip the single-device time of the whole sequence")
    parser.add_argument("--json", help="write the results here (rank 0)")
    return parser.parse_args()


def setup():
    """(device, group backend): NCCL with a GPU per rank, gloo otherwise (shared GPU, or the CPU)."""
    import torch
    import torch.distributed as dist
    local_rank, world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gpus = torch.cuda.device_count()
    if gpus == 0:
        device, backend = torch.device("cpu"), "gloo"
    else:
        device = torch.device("cuda", local_rank % gpus)
        torch.cuda.set_device(device)
        backend = "nccl" if world <= gpus else "gloo"
    dist.init_process_group(backend)
    return device, backend


def sync(device):
    import torch
    import torch.distributed as dist
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def timed(step, device, iters):
    """Median seconds of step() over iters runs, after one warm-up, every rank in step."""
    step()
    times = []
    for _ in range(iters):
        sync(device)
        started = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bytes_per_rank(args, world, element):
    """(forward sent, backward sent, forward ideal, backward ideal) in bytes, one rank, one layer."""
    local = args.seq // world
    kv = 2 * args.batch * local * args.kv_heads * args.head_dim * element  # this rank's K and V
    if args.strategy == "ulysses":  # q, k, v out and out back; dout out, dq, dk, dv back: (W-1)/W stays away
        q = args.batch * local * args.heads * args.head_dim * element
        moved = (world - 1) * (2 * q + kv) // world
        return moved, moved, moved, moved
    forward = (world - 1) * kv
    backward = forward + (world - 1) * kv * 4 // element  # K/V again, dK/dV in fp32
    return forward, backward, forward, forward + (world - 1) * kv * 4 // element


def main():
    args = parse()
    import torch
    import torch.distributed as dist
    import selfattn
    from selfattn.distributed import ring_attention, shard, ulysses_attention

    device, backend = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    sharding = "zigzag" if args.causal else "contiguous"
    causal = "top_left" if args.causal else None
    g = torch.Generator().manual_seed(0)  # the same whole tensors on every rank, each keeps its shard

    def whole(heads):
        return torch.randn(args.batch, args.seq, heads, args.head_dim, generator=g).to(dtype)

    full = [whole(args.heads), whole(args.kv_heads), whole(args.kv_heads)]
    local = [shard(t, world, rank, sharding=sharding, dim=1).to(device).requires_grad_() for t in full]
    function = ring_attention if args.strategy == "ring" else ulysses_attention

    def step():
        out = function(*local, layout="bshd", sharding=sharding, causal=causal)
        if not args.no_backward:
            out.backward(torch.ones_like(out))

    seconds = timed(step, device, args.iters)
    single = None
    if rank == 0 and not args.no_single:
        inputs = [t.to(device).requires_grad_() for t in full]

        def one():
            out = selfattn.attention(*inputs, layout="bshd", causal=causal)
            if not args.no_backward:
                out.backward(torch.ones_like(out))

        single = timed_alone(one, device, args.iters)
    sync(device)
    if rank == 0:
        sent = bytes_per_rank(args, world, torch.finfo(dtype).bits // 8)
        result = dict(strategy=args.strategy, ranks=world, backend=backend, device=str(device),
                      gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "sim (CPU)",
                      seq=args.seq, batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                      dtype=args.dtype, causal=bool(args.causal), backward=not args.no_backward,
                      seconds=seconds, single_device_seconds=single,
                      efficiency=None if single is None else single / world / seconds,
                      forward_bytes_sent=sent[0], backward_bytes_sent=None if args.no_backward else sent[1],
                      forward_bytes_ideal=sent[2], backward_bytes_ideal=None if args.no_backward else sent[3])
        for key, value in result.items():
            print(f"{key:>22}: {value}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.destroy_process_group()
    return 0


def timed_alone(step, device, iters):
    """timed() for one rank alone (no barrier)."""
    import torch
    step()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
