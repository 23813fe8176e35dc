#!/usr/bin/python3
"""The plain PyTorch way to load DICOM scans, at its strongest, for bench/compare-dicom: pydicom
reads each file, the random-resized crop is chosen first and only the crop is rescaled and
windowed (vectorised numpy, as the file's window and rescale say), then torchvision resizes the
tensor (bilinear), flips and normalizes; a DataLoader with WORKERS persistent workers, one torch
thread each. Prints one JSON line: images/s over BATCHES batches after 2 warm-up batches.
usage: pydicom_loader.py FOLDER BATCH WORKERS SIZE BATCHES"""
import glob
import json
import os
import sys

import numpy as np
import pydicom
import torch
import torchvision.transforms.functional as F
from torchvision import transforms

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from loader_rate import loader_rate  # noqa: E402


def first(v, fallback):
    if v is None:
        return fallback
    try:
        return float(v[0]) if isinstance(v, pydicom.multival.MultiValue) else float(v)
    except (TypeError, ValueError):
        return fallback


class Scans(torch.utils.data.Dataset):
    def __init__(self, folder, size):
        self.files = sorted(glob.glob(os.path.join(folder, "**", "*.dcm"), recursive=True))
        self.size = size
        self.crop = transforms.RandomResizedCrop(size)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        ds = pydicom.dcmread(self.files[i])
        px = ds.pixel_array  # numpy, stored values (pydicom masks and sign-extends)
        h, w = px.shape
        top, left, ch, cw = self.crop.get_params(torch.empty(1, h, w), self.crop.scale,
                                                 self.crop.ratio)
        region = px[top:top + ch, left:left + cw].astype(np.float32)
        slope, intercept = first(ds.get("RescaleSlope"), 1.0), first(ds.get("RescaleIntercept"), 0.0)
        c, wd = first(ds.get("WindowCenter"), None), first(ds.get("WindowWidth"), None)
        v = region * slope + intercept
        if c is None or wd is None:
            lo, hi = float(v.min()), float(v.max())
            c, wd = (lo + hi + 1) / 2, max(1.0, hi - lo + 1)
        y = np.clip((v - (c - 0.5)) / max(wd - 1, 1.0) + 0.5, 0.0, 1.0)
        if ds.get("PhotometricInterpretation", "") == "MONOCHROME1":
            y = 1.0 - y
        t = torch.from_numpy(y).unsqueeze(0)
        t = F.resize(t, [self.size, self.size])
        if torch.rand(1).item() < 0.5:
            t = F.hflip(t)
        t = F.normalize(t, [0.5], [0.25])
        label = 1 if os.sep + "lesion" + os.sep in self.files[i] else 0
        return t, label


def init_worker(_):
    torch.set_num_threads(1)


def main():
    folder, batch, workers, size, batches = sys.argv[1], *map(int, sys.argv[2:6])
    torch.set_num_threads(1)
    ds = Scans(folder, size)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                         persistent_workers=True, worker_init_fn=init_worker)
    ips, seen = loader_rate(loader, batches, warm=2)
    print(json.dumps({"images_per_s": ips, "images": seen, "workers": workers,
                      "pydicom": pydicom.__version__, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
