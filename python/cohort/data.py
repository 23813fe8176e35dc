"""cohort.data: Cohort's input pipeline as a PyTorch loader.

    from cohort.data import Loader
    loader = Loader("scans/train", batch_size=32, image_size=224, workers=2, seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:          # torch tensors, no copy
            loss = loss_fn(model(images), labels)
            ...
    state = loader.state_dict()                  # resume mid-epoch: load_state_dict(state)

It reads what `cohort bench data` and `cohort train` read: an ImageFolder, a CSV list (path,
label[,label...]) or a folder of record shards, with JPEG, PNG and DICOM files. Batches are
decoded, cropped, resized, augmented and normalised by C++ worker threads into preallocated
buffers; `images` is a tensor over such a buffer, which goes back to the pipeline when the
tensor is freed (hold as many batches as you like: the pipeline adds buffers when all are held).
Under torch.distributed it reads this rank's shard (DistributedSampler's order: every rank the
same permutation of (seed, epoch), rank r every world-th sample).
"""

import os

import torch

from . import _C

__all__ = ["Loader"]


def _resolve_device(device):
    """torch.device for the loader's `device`; "cuda" alone is LOCAL_RANK's GPU."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r}: expected 'cpu', 'cuda' or 'cuda:N' ({e})") from None
    if d.type == "cpu":
        return d
    if d.type != "cuda":
        raise ValueError(f"device={device!r}: the loader delivers to 'cpu' or 'cuda' only")
    if not torch.cuda.is_available():
        why = "this PyTorch has no CUDA" if torch.version.cuda is None else \
            "no CUDA device is visible"
        raise ValueError(f"device={device!r}: torch.cuda.is_available() is False ({why})")
    index = d.index if d.index is not None else int(os.environ.get("LOCAL_RANK", "0"))
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ValueError(f"device={device!r}: GPU {index} asked for, and {count} are visible")
    return torch.device("cuda", index)


class Loader(torch.utils.data.IterableDataset):
    """Batches of (images, labels) as torch tensors. An IterableDataset of whole batches: use it
    directly, or inside `torch.utils.data.DataLoader(loader, batch_size=None)` (num_workers=0:
    the decoding already runs in the pipeline's own threads) for DataLoader's extras such as
    pin_memory.

    path: ImageFolder, CSV list or shard folder. train: random-resized-crop and the
    augmentations below; otherwise resize the shorter side to `resize`, then center-crop.
    Augmentations (train only): hflip, vflip (each with probability 0.5 when on), crop_scale
    (smallest area fraction of the random crop), crop_ratio (its aspect ratio range), rotation
    (a random turn within +- degrees, corners black), brightness and contrast (jitter
    amplitudes, 0 = off). Flips are off by default: scans are not mirror-symmetric (a chest X-ray with the
    heart on the right is another finding), and neither are digits.
    window: (center, width) for DICOM, overriding the files' own. channels: 3 repeats gray.
    dtype: torch.float32, torch.bfloat16 or torch.uint8 (uint8 is not normalised).
    channels_last: NHWC memory with the logical NCHW shape. multilabel: labels as a float
    multi-hot [batch, classes] instead of int64 first labels (-1 for a scan with no finding). rank/world: default from
    torch.distributed when it is initialised.
    device: "cpu", or "cuda" (the GPU of LOCAL_RANK, as under torchrun), "cuda:N" or a
    torch.device: batches are copied there on a stream of their own, one batch ahead, and the
    consumer's stream waits for the copy (the host does not).
    """

    def __init__(self, path, batch_size, image_size=224, workers=2, seed=0, train=True, *,
                 prefetch=2, shuffle=None, drop_last=False, resize=None, hflip=False,
                 vflip=False, crop_scale=0.08, crop_ratio=(3 / 4, 4 / 3), rotation=0.0,
                 brightness=0.0, contrast=0.0, window=None,
                 channels=0, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                 dtype=torch.float32, channels_last=False, multilabel=False,
                 fail_on_corrupt=False, accurate_idct=False, rank=None, world=None,
                 device="cpu"):
        super().__init__()
        self.device = _resolve_device(device)
        if rank is None or world is None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
            else:
                rank, world = 0, 1
        o = _C.PipelineOptions()
        o.batch, o.size, o.workers, o.prefetch, o.seed = batch_size, image_size, workers, \
            prefetch, seed
        o.train = train
        o.shuffle = train if shuffle is None else shuffle
        o.drop_last = drop_last
        o.resize = resize if resize is not None else int(image_size * 256 / 224)
        o.hflip, o.vflip, o.crop_scale_min = hflip, vflip, crop_scale
        o.crop_ratio_min, o.crop_ratio_max = float(crop_ratio[0]), float(crop_ratio[1])
        o.rotation = float(rotation)
        o.brightness, o.contrast = brightness, contrast
        o.channels, o.mean, o.std = channels, list(mean), list(std)
        o.fail_on_corrupt = fail_on_corrupt
        o.rank, o.world = rank, world
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.uint8: "uint8"}
        if dtype not in names:
            raise ValueError(f"dtype {dtype}: expected torch.float32, torch.bfloat16 or torch.uint8")
        o.set_output(names[dtype], channels_last)
        o.set_idct(accurate_idct)
        if window is not None:
            o.set_window(float(window[0]), float(window[1]))
        self.batch_size, self.rank, self.world = batch_size, rank, world
        self.multilabel = multilabel
        self._loader = _C.PipelineLoader(str(path), o)
        self._epoch = 0
        self._start = 0        # global position the next iteration starts from
        self._consumed = 0     # batches handed out in the current iteration

    def __len__(self):
        """Batches per epoch on this rank."""
        return self._loader.batches_per_epoch()

    @property
    def num_classes(self):
        return self._loader.num_classes()

    @property
    def class_names(self):
        """The classes' folder names, or a findings table's column names; [] when unnamed."""
        return self._loader.class_names()

    def set_epoch(self, epoch):
        """The epoch the next iteration reads (its permutation and augmentation)."""
        if epoch != self._epoch:
            self._epoch, self._start = epoch, 0

    def __iter__(self):
        start = self._start
        self._loader.start_epoch(self._epoch, start)
        self._consumed = 0
        if self.device.type == "cuda":
            yield from self._on_device()
        else:
            while True:
                got = self._loader.next(self.multilabel)
                if got is None:
                    break
                self._consumed += 1
                images, labels, _ = got
                yield images, labels
        # A finished epoch: the next iteration starts this epoch again unless set_epoch moves on.
        self._start = 0
        self._consumed = 0

    def _on_device(self):
        # The next batch's copy is queued on a copy stream before this one is handed out.
        copy = torch.cuda.Stream(device=self.device)

        def upload():
            got = self._loader.next(self.multilabel)
            if got is None:
                return None
            images, labels, _ = got
            with torch.cuda.stream(copy):
                return (images.to(self.device, non_blocking=True),
                        labels.to(self.device, non_blocking=True))

        ahead = upload()
        while ahead is not None:
            images, labels = ahead
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(copy)
            images.record_stream(consumer)
            labels.record_stream(consumer)
            ahead = upload()
            self._consumed += 1
            yield images, labels

    def state_dict(self):
        """Where this loader is: epoch and global position (samples every rank consumed)."""
        position = self._start + self._consumed * self.batch_size * self.world
        return {"epoch": self._epoch, "position": position}

    def load_state_dict(self, state):
        """The next iteration resumes at that epoch and position (any world size)."""
        self._epoch, self._start = int(state["epoch"]), int(state["position"])

    def stats(self):
        """Counts and times so far: images, skipped (unreadable files), batches, ..."""
        return self._loader.stats()

    @property
    def skipped(self):
        return self._loader.stats()["skipped"]
