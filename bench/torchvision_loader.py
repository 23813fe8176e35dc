#!/usr/bin/python3
"""torchvision's DataLoader on an ImageFolder with the training transforms that `cohort bench data`
runs (random-resized-crop, horizontal flip, normalize), at its fastest decode path here; one JSON
line per mode with images/s, and each mode's decode accuracy (PSNR of a centre crop resized to
SIZE against the same crop of an exact, full-resolution, accurate-IDCT decode):
  pil        PIL decodes the whole image (torchvision's default loader);
  pil-draft  PIL's draft(): the JPEG is decoded already downscaled in the DCT domain (by 1/2,
             1/4 or 1/8) as far as the random crop still has SIZE pixels, as Cohort does;
  tvio       torchvision.io.decode_jpeg on the file's bytes, then the tensor transforms.
usage: torchvision_loader.py SOURCE BATCH WORKERS SIZE BATCHES MODES(comma-separated)"""
import json
import math
import os
import sys

import numpy as np
import torch
import torchvision
import torchvision.transforms.functional as F
from PIL import Image
from torchvision import transforms

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from loader_rate import loader_rate  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def draft_crop(path, size, crop):
    """PIL with draft(): choose the crop on the full size, let libjpeg scale down as far as the
    crop keeps `size` pixels, then crop and resize in the scaled image."""
    img = Image.open(path)
    w, h = img.size
    top, left, ch, cw = crop.get_params(img, crop.scale, crop.ratio)
    scale = max(1, min(cw // size, ch // size))
    img.draft("RGB", (max(1, w // scale), max(1, h // scale)))
    sx, sy = img.size[0] / w, img.size[1] / h
    box = (left * sx, top * sy, (left + cw) * sx, (top + ch) * sy)
    return img.convert("RGB").resize((size, size), Image.BILINEAR, box=box)


class DraftFolder(torchvision.datasets.ImageFolder):
    def __init__(self, root, size):
        super().__init__(root)
        self.size = size
        self.crop = transforms.RandomResizedCrop(size)
        self.after = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                                         transforms.Normalize(MEAN, STD)])

    def __getitem__(self, i):
        path, label = self.samples[i]
        return self.after(draft_crop(path, self.size, self.crop)), label


class TvioFolder(torchvision.datasets.ImageFolder):
    def __init__(self, root, size):
        super().__init__(root)
        self.tf = transforms.Compose([transforms.RandomResizedCrop(size),
                                      transforms.RandomHorizontalFlip()])

    def __getitem__(self, i):
        path, label = self.samples[i]
        img = torchvision.io.decode_jpeg(torchvision.io.read_file(path))
        img = self.tf(img).float().div_(255)
        return F.normalize(img, MEAN, STD), label


def dataset(mode, source, size):
    if mode == "pil":
        return torchvision.datasets.ImageFolder(source, transforms.Compose([
            transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
            transforms.ToTensor(), transforms.Normalize(MEAN, STD)]))
    if mode == "pil-draft":
        return DraftFolder(source, size)
    return TvioFolder(source, size)


def rate(mode, source, batch, workers, size, batches):
    loader = torch.utils.data.DataLoader(dataset(mode, source, size), batch_size=batch,
                                         shuffle=True, num_workers=workers, drop_last=False,
                                         persistent_workers=True,
                                         worker_init_fn=lambda _: torch.set_num_threads(1))
    return loader_rate(loader, batches)[0]


def psnr(a, b):
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def accuracy(mode, source, size, files=24):
    """Mean PSNR over `files` images of the mode's decode of the whole image resized to size,
    against the exact decode resized the same way (None where identical)."""
    paths = [p for p, _ in torchvision.datasets.ImageFolder(source).samples[:files]]
    out = []
    for p in paths:
        exact = Image.open(p).convert("RGB")  # PIL's full decode: libjpeg's accurate IDCT
        w, h = exact.size
        cw, ch = w, h
        left, top = (w - cw) // 2, (h - ch) // 2
        box = (left, top, left + cw, top + ch)
        ref = np.asarray(exact.resize((size, size), Image.BILINEAR, box=box))
        if mode == "pil":
            got = ref
        elif mode == "pil-draft":
            img = Image.open(p)
            scale = max(1, min(cw // size, ch // size))
            img.draft("RGB", (max(1, w // scale), max(1, h // scale)))
            sx, sy = img.size[0] / w, img.size[1] / h
            got = np.asarray(img.convert("RGB").resize(
                (size, size), Image.BILINEAR, box=(left * sx, top * sy, (left + cw) * sx, (top + ch) * sy)))
        else:
            t = torchvision.io.decode_jpeg(torchvision.io.read_file(p))
            t = F.resized_crop(t, top, left, ch, cw, [size, size], antialias=True)
            got = t.permute(1, 2, 0).numpy()
            ref_t = F.resized_crop(F.pil_to_tensor(exact), top, left, ch, cw, [size, size],
                                   antialias=True)
            ref = ref_t.permute(1, 2, 0).numpy()
        out.append(psnr(got, ref))
    finite = [x for x in out if x != float("inf")]
    return None if not finite else sum(finite) / len(finite)


def main():
    source, batch, workers, size, batches = sys.argv[1], *map(int, sys.argv[2:6])
    modes = sys.argv[6].split(",") if len(sys.argv) > 6 else ["pil", "pil-draft", "tvio"]
    torch.set_num_threads(1)
    for mode in modes:
        ips = rate(mode, source, batch, workers, size, batches)
        print(json.dumps({"mode": mode, "images_per_s": ips, "workers": workers,
                          "psnr_db": accuracy(mode, source, size),
                          "torchvision": torchvision.__version__}), flush=True)


if __name__ == "__main__":
    main()
