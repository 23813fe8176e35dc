#!/usr/bin/python3
"""torch.distributed.all_reduce (f32, sum, in place) through one backend, "gloo" or "cohort",
the way a PyTorch script calls it: WORLD processes on this host, each pinned to its own core as
`cohort launch --bind auto` pins ranks, one thread each. Per size: the median time of one
blocking call over ITERS calls (after warm-up), and the bus bandwidth 2(n-1)/n x bytes / time.
Gloo has no other knob that matters here (its transport is TCP; GLOO_SOCKET_IFNAME=lo).
Starts WORLD processes itself, or is one rank of a job given RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT (as in the emulated cluster). Prints one JSON line from rank 0."""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import torch_env  # noqa: E402


def iters_for(nbytes, budget):
    return max(5, min(2000, int(budget / nbytes)))


def worker(rank, world, port, a):
    if port:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
        torch_env.pin(rank, world)
    torch.set_num_threads(1)
    if a.backend == "cohort":
        import cohort  # noqa: F401
    dist.init_process_group(a.backend, rank=rank, world_size=world)
    rows = []
    for nbytes in a.sizes:
        t = torch.ones(nbytes // 4)
        n = iters_for(nbytes, a.budget)
        for _ in range(max(3, n // 10)):
            dist.all_reduce(t)
        dist.barrier()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        rows.append({"bytes": nbytes, "iters": n, "median_us": med * 1e6,
                     "min_us": min(times) * 1e6,
                     "busbw_gbs": 2 * (world - 1) / world * nbytes / med / 1e9})
    assert t[0].item() > 0
    if rank == 0:
        print(json.dumps({"backend": a.backend, "world": world, "rows": rows,
                          **torch_env.describe()}), flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["gloo", "cohort"], required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes", default="4096,67108864",
                    type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--budget", type=float, default=640 << 20,
                    help="bytes per size to move in the timed loop (sets the iteration count)")
    a = ap.parse_args()
    if "RANK" in os.environ:  # one rank of a job started elsewhere (the emulated cluster)
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), 0, a)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(a.world, port, a), nprocs=a.world, start_method="fork")


if __name__ == "__main__":
    main()
