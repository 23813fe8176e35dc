#!/usr/bin/python3
"""PyTorch DDP peer of `cohort launch ... cohort bench train`: the same torchvision model, batch per
rank, input, threads per rank, optimizer (SGD momentum 0.9, wd 1e-4) and synthetic data, over the
gloo backend (DDP defaults: 25 MiB buckets, first 1 MiB). Starts WORLD processes itself (or joins
a job given RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, as in the emulated cluster) and prints one
JSON line from rank 0 with ms/step, global images/s and the exposed communication per step (the
time from the end of the last backward op until the gradients are ready)."""
import argparse
import json
import os
import resource
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision


def worker(rank, world, port, a):
    if port:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=a.num_classes)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    x = torch.randn(a.batch, 3, a.image_size, a.image_size)
    y = torch.tensor([(i * 7919 + rank) % a.num_classes for i in range(a.batch)])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    # Exposed communication: DDP's reducer waits for its allreduces in a callback queued at the
    # end of backward; the time from the last gradient hook to backward() returning is it.
    last_hook = [0.0]

    def hook(_):
        last_hook[0] = time.perf_counter()

    for p in model.parameters():
        p.register_hook(hook)
    stats = {"ms": [], "comm": []}

    def step(record):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        if record:
            stats["ms"].append(1e3 * (time.perf_counter() - t0))
            stats["comm"].append(1e3 * max(0.0, t1 - last_hook[0]))

    for _ in range(a.warmup):
        step(False)
    dist.barrier()
    for _ in range(a.steps):
        step(True)
    mean = sum(stats["ms"]) / len(stats["ms"])
    t = torch.tensor([mean])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"model": a.model, "batch": a.batch, "world": world,
                          "threads": torch.get_num_threads(), "ms_per_step": mean,
                          "ms_each": stats["ms"],
                          "images_per_s": 1e3 * a.batch * world / t.item(),
                          "comm_wait_ms": sum(stats["comm"]) / len(stats["comm"]),
                          "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                          "torch": torch.__version__}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


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
    a = ap.parse_args()
    if "RANK" in os.environ:
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, a)
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(worker, args=(a.world, port, a), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
