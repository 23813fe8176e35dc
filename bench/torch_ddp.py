#!/usr/bin/python3
"""PyTorch DDP peer of `cohort launch ... cohort bench train`, at its strongest: the same
torchvision model, batch per rank, input, threads per rank, optimizer (SGD momentum 0.9, wd 1e-4)
and synthetic data, over the gloo backend (--backend cohort: Cohort's torch.distributed backend),
tuned as a reader who knows DDP would tune it:
  - gradient_as_bucket_view=True (no copies into the buckets), broadcast_buffers=False (Cohort
    broadcasts buffers only before evaluation, not every step); DDP's default buckets (25 MiB,
    first 1 MiB), as Cohort's;
  - each rank pinned to its own share of the cores, as `cohort launch --bind auto` pins its ranks;
  - --channels-last for that memory format (bench/compare-ddp runs both and takes the faster);
  - at world 1 no DDP wrapper and no process group, as Cohort runs one rank without DDP, so that
    the scaling efficiency is computed the same way on both sides;
  - nothing in the timed step that Cohort does not pay for: the exposed communication is measured
    apart, as the mean step time minus that of the same steps under no_sync() (no allreduce).
--zero wraps the optimizer in torch.distributed.optim.ZeroRedundancyOptimizer (PyTorch's ZeRO-1:
optimizer state sharded, each rank steps its shard and broadcasts it), tuned with
parameters_as_bucket_view=True (one broadcast per bucket, not per parameter); its
overlap_with_ddp needs NCCL (torch refuses it with gloo: "Gloo may hang"), so it is off. The
model state (parameters, gradients, this rank's optimizer state) is reported in bytes.
--timeline (a diagnostic run, never the measured one: it replaces DDP's built-in allreduce by a
Python comm hook doing the same division and allreduce) records per timed step, in ms from the end
of forward: when backward computed its last gradient, when each bucket was handed to the backend
and when its allreduce completed, and when backward returned (bench/compare-torch-backend turns
these into the link's busy rate and the exposed time that no backend could go below).
Starts WORLD processes itself (or joins a job given RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, as in
the emulated cluster) and prints one JSON line from rank 0."""
import argparse
import json
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import torch_env  # noqa: E402


def worker(rank, world, port, a):
    if port:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    # This host's ranks share its cores (in the emulated cluster each host has one rank).
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cores = torch_env.pin(local_rank, local_world) if a.pin else sorted(os.sched_getaffinity(0))
    torch.set_num_threads(a.threads)
    if world > 1:
        if a.backend == "cohort":
            import cohort  # noqa: F401  registers the backend (PYTHONPATH=build/python)
        dist.init_process_group(a.backend, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=a.num_classes)
    x = torch.randn(a.batch, 3, a.image_size, a.image_size)
    y = torch.tensor([(i * 7919 + rank) % a.num_classes for i in range(a.batch)])
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, gradient_as_bucket_view=True, broadcast_buffers=False,
            bucket_cap_mb=a.bucket_cap_mb)
    if a.optimizer == "adamw":
        cls, kw = torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 1e-4}
    else:
        cls, kw = torch.optim.SGD, {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4}
    if a.zero and world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=cls,
                                      parameters_as_bucket_view=True, **kw)
    else:
        opt = cls(net.parameters(), **kw)
    loss_fn = torch.nn.CrossEntropyLoss()
    timeline, marks = [], {"buckets": [], "last_grad": 0.0}
    if a.timeline and world > 1:
        def hook(_, bucket):  # what DDP's built-in hook does, timed
            ready = time.perf_counter()
            buf = bucket.buffer().div_(world)

            def done(f):
                marks["buckets"].append((bucket.index(), buf.numel() * buf.element_size(), ready,
                                         time.perf_counter()))
                return f.value()[0]
            return dist.all_reduce(buf, async_op=True).get_future().then(done)
        net.register_comm_hook(None, hook)

        def grad_done(g):
            marks["last_grad"] = max(marks["last_grad"], time.perf_counter())
        for p in model.parameters():
            p.register_hook(grad_done)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(net(x), y)
        marks["buckets"].clear()
        marks["last_grad"] = 0.0
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        if marks["buckets"]:  # only --timeline fills it, and never under no_sync()
            def ms(t):
                return round(1e3 * (t - t0), 2)
            timeline.append({"last_grad_ms": ms(marks["last_grad"]), "backward_ms": ms(t1),
                             "buckets": [{"index": i, "bytes": n, "ready_ms": ms(r),
                                          "done_ms": ms(d)}
                                         for i, n, r, d in sorted(marks["buckets"])]})

    def timed(n):
        ms = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            ms.append(1e3 * (time.perf_counter() - t0))
        return ms

    for _ in range(a.warmup):
        step()
    if world > 1:
        dist.barrier()
    timeline.clear()  # the warm-up's steps are not recorded
    ms = timed(a.steps)
    mean = sum(ms) / len(ms)
    comm = 0.0
    if world > 1:
        # The same steps without the allreduce: what the step costs without communication.
        dist.barrier()
        with net.no_sync():
            quiet = timed(a.steps)
        comm = max(0.0, mean - sum(quiet) / len(quiet))
    # Model state on this rank: parameters, gradients and the optimizer state it holds.
    local = opt.optim if a.zero and world > 1 else opt
    state_bytes = sum(v.numel() * v.element_size() for s in local.state.values()
                      for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    psi = sum(p.numel() for p in model.parameters())
    t = torch.tensor([mean, comm])
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"model": a.model, "batch": a.batch, "world": world,
                          "threads": torch.get_num_threads(), "ms_per_step": mean,
                          "ms_each": ms, "images_per_s": 1e3 * a.batch * world / t[0].item(),
                          "comm_wait_ms": t[1].item(), "cores": cores,
                          "optimizer": a.optimizer, "zero": bool(a.zero and world > 1),
                          "parameters": psi,
                          "model_state_bytes": 8 * psi + state_bytes,
                          "optimizer_state_bytes": state_bytes,
                          "memory_format": "channels_last" if a.channels_last else "contiguous",
                          "ddp": {"gradient_as_bucket_view": True, "broadcast_buffers": False,
                                  "bucket_cap_mb": a.bucket_cap_mb,
                                  "backend": a.backend} if world > 1 else None,
                          "timeline": timeline if a.timeline else None,
                          "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                          **torch_env.describe()}), flush=True)
    if world > 1:
        # Leave without tearing the process group down: torch 1.13's ProcessGroupGloo destructor,
        # run from DDP's reducer with the GIL held, can deadlock joining a thread that waits for
        # the GIL (seen here: a rank spinning for minutes after its result was printed).
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--zero", action="store_true")
    ap.add_argument("--bucket-cap-mb", type=float, default=25,
                    help="DDP's bucket size (its default 25)")
    ap.add_argument("--backend", choices=["gloo", "cohort"], default="gloo",
                    help="torch.distributed backend; cohort is Cohort's (python/)")
    ap.add_argument("--timeline", action="store_true",
                    help="record when each bucket is ready and done (a diagnostic run)")
    ap.add_argument("--no-pin", dest="pin", action="store_false")
    a = ap.parse_args()
    if "RANK" in os.environ:
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, a)
        return
    if a.world == 1:
        worker(0, 1, None, a)
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(worker, args=(a.world, port, a), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
