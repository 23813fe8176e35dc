#!/usr/bin/python3
"""torchvision's GPU input path, at its strongest, as the peer of `cohort bench data --decode gpu
--augment-on gpu` (issue 37's JPEG target): a DataLoader whose workers only read the files'
bytes, then torchvision.io.decode_jpeg on the whole batch at once on the GPU (nvJPEG), then
transforms v2 on the device per image (RandomResizedCrop with antialias, horizontal flip), the
batch stacked, normalised and made channels-last bf16, the model's input. Prints one JSON line:
images/s over BATCHES batches after 3 warm-up ones, synchronised on the device before the clock
reads.
usage: torchvision_gpu_loader.py SOURCE BATCH WORKERS SIZE BATCHES"""
import json
import sys
import time

import torch
import torchvision
from torchvision.transforms import v2

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class Bytes(torchvision.datasets.ImageFolder):
    """The files' bytes as uint8 tensors: the workers read, the GPU decodes."""

    def __init__(self, root):
        super().__init__(root, loader=lambda p: p)

    def __getitem__(self, i):
        path, label = self.samples[i]
        return torchvision.io.read_file(path), label


def collate(items):
    return [x for x, _ in items], torch.tensor([y for _, y in items])


def main():
    source, batch, workers, size, batches = sys.argv[1], *map(int, sys.argv[2:6])
    if not torch.cuda.is_available():
        sys.exit("torchvision_gpu_loader: torch.cuda.is_available() is False")
    dev = torch.device("cuda", 0)
    loader = torch.utils.data.DataLoader(Bytes(source), batch_size=batch, shuffle=True,
                                         num_workers=workers, collate_fn=collate,
                                         persistent_workers=True, pin_memory=False, drop_last=True)
    per_image = v2.Compose([v2.RandomResizedCrop(size, antialias=True),
                            v2.RandomHorizontalFlip()])
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1) * 255

    def step(files):
        images = torchvision.io.decode_jpeg(files, device=dev)  # one call for the batch
        x = torch.stack([per_image(im) for im in images]).float()
        x = ((x - mean) / std).to(torch.bfloat16)
        return x.contiguous(memory_format=torch.channels_last)

    done, seen, t0 = 0, 0, None
    while done < batches + 3:
        for files, _ in loader:
            step(files)
            done += 1
            if done == 3:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            elif done > 3:
                seen += len(files)
            if done >= batches + 3:
                break
    torch.cuda.synchronize()
    ips = seen / (time.perf_counter() - t0)
    print(json.dumps({"mode": "tvio-cuda", "images_per_s": ips, "workers": workers,
                      "batch": batch, "torchvision": torchvision.__version__,
                      "torch": torch.__version__, "device": torch.cuda.get_device_name(0)}),
          flush=True)


if __name__ == "__main__":
    main()
