#!/usr/bin/python3
"""cohort.data.Loader in a PyTorch loop, measured as the torchvision peer is (bench/lib/
loader_rate.py): random-resized-crop SIZE, horizontal flip, normalize, float32 NCHW tensors.
Usage: cohort_loader.py SOURCE BATCH WORKERS SIZE BATCHES SEED   (PYTHONPATH=build/python)
Prints one JSON line."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from loader_rate import loader_rate  # noqa: E402

from cohort.data import Loader  # noqa: E402


def main():
    source, batch, workers, size, batches, seed = sys.argv[1], *map(int, sys.argv[2:7])
    torch.set_num_threads(1)
    loader = Loader(source, batch_size=batch, image_size=size, workers=workers, seed=seed,
                    hflip=True)
    rate, seen = loader_rate(loader, batches)
    print(json.dumps({"mode": "cohort.data.Loader", "images_per_s": rate, "images": seen,
                      "batch": batch, "workers": workers, "size": size,
                      "skipped": loader.skipped}))


if __name__ == "__main__":
    main()
