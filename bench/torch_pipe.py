"""The peer of `cohort bench train --pipeline-stages`: PyTorch 1.13's
torch.distributed.pipeline.sync.Pipe (torchgpipe's GPipe) on the same torchvision model, cut at
the same pieces (the stem, each block, the head), with the same batch, micro-batches, synthetic
data and SGD. Pipe runs every partition in one process, one worker thread per device: on a CPU
every partition shares the device "cpu", so the stages take turns on one worker and the intra-op
threads (--threads) are what runs in parallel. Tuned: checkpoint="never" (no recomputation),
both memory formats (--channels-last), the threads given. Prints one JSON line."""
import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed.rpc as rpc
import torchvision
from torch.distributed.pipeline.sync import Pipe


def pieces(model_name):
    m = getattr(torchvision.models, model_name)()
    stem = torch.nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool)
    blocks = [b for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for b in layer]
    head = torch.nn.Sequential(m.avgpool, torch.nn.Flatten(), m.fc)
    return [stem] + blocks + [head]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--cuts", default="", help="first piece of stages 1.. (comma-separated)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--channels-last", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    tmp = tempfile.NamedTemporaryFile(delete=False)
    rpc.init_rpc("worker", rank=0, world_size=1,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                     init_method=f"file://{tmp.name}"))
    ps = pieces(a.model)
    cuts = [int(c) for c in a.cuts.split(",") if c]
    bounds = [0] + cuts + [len(ps)]
    stages = [torch.nn.Sequential(*ps[bounds[i]:bounds[i + 1]]) for i in range(len(bounds) - 1)]
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = Pipe(torch.nn.Sequential(*stages), chunks=a.micro_batches, checkpoint="never")
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(a.batch, 3, a.image_size, a.image_size).to(memory_format=fmt)
    y = torch.tensor([(i * 7919) % 1000 for i in range(a.batch)])
    ms = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(x).local_value()
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            ms.append(1e3 * (time.perf_counter() - t0))
    rpc.shutdown()
    os.unlink(tmp.name)
    mean = sum(ms) / len(ms)
    print(json.dumps({"peer": "torch.distributed.pipeline.sync.Pipe", "torch": torch.__version__,
                      "model": a.model, "batch": a.batch, "image_size": a.image_size,
                      "micro_batches": a.micro_batches, "cuts": cuts, "stages": len(stages),
                      "threads": a.threads, "channels_last": a.channels_last,
                      "checkpoint": "never", "ms_each": ms, "ms_per_step": mean,
                      "images_per_s": 1e3 * a.batch / mean}))


if __name__ == "__main__":
    main()
