#!/usr/bin/python3
"""torchvision's DataLoader on an ImageFolder with the training transforms that
`cohort bench data` runs (random-resized-crop, horizontal flip, normalize), for comparison.
usage: torchvision_loader.py SOURCE BATCH WORKERS SIZE BATCHES JSON"""
import json
import sys
import time

import torch
import torchvision
from torchvision import transforms

source, batch, workers, size, batches, out = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
torch.set_num_threads(1)
tf = transforms.Compose([
    transforms.RandomResizedCrop(size),
    transforms.RandomHorizontalFlip(),
    transforms.ToTensor(),
    transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
])
ds = torchvision.datasets.ImageFolder(source, tf)
loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                     drop_last=False, persistent_workers=True)
warm = 3
seen = 0
t0 = None
done = 0
while done < batches + warm:
    for images, labels in loader:
        done += 1
        if done == warm:
            t0 = time.perf_counter()
        elif done > warm:
            seen += images.shape[0]
        if done >= batches + warm:
            break
secs = time.perf_counter() - t0
print(f"torchvision DataLoader: {seen / secs:.1f} images/s ({seen} images, {workers} workers)")
json.dump({"images_per_s": seen / secs, "images": seen, "workers": workers}, open(out, "w"))
