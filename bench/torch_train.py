#!/usr/bin/python3
"""PyTorch peer of `cohort bench train`: the same torchvision model, batch, input size, threads,
optimizer (SGD, momentum 0.9, weight decay 1e-4) and synthetic data; prints one JSON line with
the memory format, the torch build and the BLAS in use. bench/compare-train runs it in both
memory formats (contiguous and channels-last) and takes the faster."""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import torch_env  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--in-channels", type=int, default=3)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--channels-last", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=a.num_classes)
    if a.in_channels != 3:
        conv = model.conv1
        model.conv1 = torch.nn.Conv2d(a.in_channels, conv.out_channels, conv.kernel_size,
                                      conv.stride, conv.padding, bias=False)
    x = torch.randn(a.batch, a.in_channels, a.image_size, a.image_size)
    y = torch.tensor([(i * 7919) % a.num_classes for i in range(a.batch)])
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        ms.append(1e3 * (time.perf_counter() - t0))
    mean = sum(ms) / len(ms)
    print(json.dumps({"model": a.model, "batch": a.batch, "image_size": a.image_size,
                      "threads": torch.get_num_threads(), "ms_per_step": mean, "ms_min": min(ms),
                      "ms_each": ms, "images_per_s": 1e3 * a.batch / mean,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "memory_format": "channels_last" if a.channels_last else "contiguous",
                      **torch_env.describe()}))


if __name__ == "__main__":
    main()
