"""cohort.data.Loader, Cohort's input pipeline as a PyTorch loader, in real torch processes:
the same samples as the C++ pipeline's own digest path, determinism, sharding by
torch.distributed's rank (2 real processes), held tensors that keep their bytes, mid-epoch
resume, layouts and dtypes, skipped and refused corrupt files, and a plain training loop.

Run: PYTHONPATH=build/python /usr/bin/python3 tests/python/loader_test.py
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backend_test import run_ranks  # noqa: E402

from cohort.data import Loader  # noqa: E402

COHORT = os.environ.get("COHORT_BIN", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "../../build/bin/cohort"))


def make_set(path, count, fmt="jpeg", size=80):
    subprocess.run([COHORT, "make-dataset", "scans", "--out", path, "--count", str(count),
                    "--format", fmt, "--size", str(size), "--channels", "3"], check=True,
                   stdout=subprocess.DEVNULL)
    return path


def digests(loader):
    """The sorted content hashes of every sample an epoch yields."""
    out = []
    for images, _ in loader:
        for x in images:
            out.append(hashlib.sha1(x.contiguous().numpy().tobytes()).hexdigest())
    return sorted(out)


class LoaderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="cohort-loader-test-")
        cls.ds = make_set(os.path.join(cls.tmp, "ds"), 40)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def loader(self, **kw):
        args = dict(batch_size=8, image_size=32, workers=2, seed=3)
        args.update(kw)
        return Loader(self.ds, **args)

    def test_deterministic_whatever_the_workers_and_epochs_differ(self):
        a, b = self.loader(workers=1), self.loader(workers=3)
        xa = [x.clone() for x, _ in a]
        xb = [x.clone() for x, _ in b]
        self.assertEqual(len(xa), 5)
        self.assertEqual(len(a), 5)
        self.assertTrue(all(torch.equal(p, q) for p, q in zip(xa, xb)))
        a.set_epoch(1)
        self.assertFalse(torch.equal(next(iter(a))[0], xa[0]))

    def test_device_is_cpu_or_a_visible_gpu(self):
        # "cpu" (the default) delivers host tensors; "cuda" needs a GPU torch can see, and is
        # refused with the reason where there is none (Debian's torch has no CUDA). A GPU
        # index beyond the visible ones, and devices the loader does not deliver to, are named.
        x, y = next(iter(self.loader(device="cpu")))
        self.assertEqual((x.device.type, y.device.type), ("cpu", "cpu"))
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            with self.assertRaisesRegex(ValueError, f"GPU {n} asked for, and {n} are visible"):
                self.loader(device=f"cuda:{n}")
            x, y = next(iter(self.loader(device="cuda")))
            self.assertEqual((x.device.type, y.device.type), ("cuda", "cuda"))
        else:
            for d in ("cuda", "cuda:0", torch.device("cuda", 1)):
                with self.assertRaisesRegex(ValueError, r"torch.cuda.is_available\(\) is False"):
                    self.loader(device=d)
        with self.assertRaisesRegex(ValueError, "delivers to 'cpu' or 'cuda' only"):
            self.loader(device="meta")
        with self.assertRaisesRegex(ValueError, "expected 'cpu', 'cuda' or 'cuda:N'"):
            self.loader(device="gpu0")

    def test_ranks_split_the_epoch(self):
        whole = digests(self.loader())
        parts = digests(self.loader(rank=0, world=2)) + digests(self.loader(rank=1, world=2))
        self.assertEqual(whole, sorted(parts))
        self.assertEqual(len(self.loader(rank=1, world=2)), 3)  # 20 samples in batches of 8

    def test_held_batches_keep_their_bytes(self):
        loader = self.loader(prefetch=1)
        held = [(x, x.clone()) for x, _ in loader]  # every batch held: more buffers are added
        loader.set_epoch(1)
        for _ in loader:
            pass
        for x, copy in held:
            self.assertTrue(torch.equal(x, copy))

    def test_resume_mid_epoch(self):
        first = self.loader(seed=7)
        first.set_epoch(2)
        it = iter(first)
        for _ in range(2):
            next(it)
        state = first.state_dict()
        self.assertEqual(state, {"epoch": 2, "position": 16})
        rest = [x.clone() for x, _ in it]
        again = self.loader(seed=7, workers=1)
        again.load_state_dict(state)
        resumed = [x.clone() for x, _ in again]
        self.assertEqual(len(rest), 3)
        self.assertTrue(all(torch.equal(p, q) for p, q in zip(rest, resumed)))

    def test_layouts_and_dtypes(self):
        ref = next(iter(self.loader(train=False)))[0]
        self.assertEqual(ref.shape, (8, 3, 32, 32))
        self.assertTrue(ref.is_contiguous())
        cl = next(iter(self.loader(train=False, channels_last=True)))[0]
        self.assertTrue(cl.is_contiguous(memory_format=torch.channels_last))
        self.assertTrue(torch.equal(cl, ref))
        bf = next(iter(self.loader(train=False, dtype=torch.bfloat16)))[0]
        self.assertEqual(bf.dtype, torch.bfloat16)
        self.assertTrue(torch.allclose(bf.float(), ref, atol=0.02, rtol=0.01))
        u8 = next(iter(self.loader(train=False, dtype=torch.uint8)))[0]
        self.assertEqual(u8.dtype, torch.uint8)
        with self.assertRaisesRegex(ValueError, "float16"):
            self.loader(dtype=torch.float16)

    def test_flips_are_switches(self):
        off = next(iter(self.loader(crop_scale=1.0)))[0]
        on = next(iter(self.loader(crop_scale=1.0, hflip=True)))[0]
        flipped = [torch.equal(on[i], off[i].flip(-1)) for i in range(8)]
        same = [torch.equal(on[i], off[i]) for i in range(8)]
        self.assertTrue(any(flipped) and all(f or s for f, s in zip(flipped, same)))
        turned = next(iter(self.loader(crop_scale=1.0, rotation=20)))[0]
        self.assertFalse(torch.equal(turned, off))
        self.assertEqual(turned.shape, off.shape)

    def test_corrupt_files_are_skipped_and_counted_or_refused(self):
        ds = os.path.join(self.tmp, "corrupt")
        shutil.copytree(self.ds, ds)
        victim = sorted(os.listdir(os.path.join(ds, "lesion")))[0]
        with open(os.path.join(ds, "lesion", victim), "wb") as f:
            f.write(b"\xff\xd8 this is not a JPEG")
        loader = Loader(ds, batch_size=8, image_size=32, workers=2, train=False)
        n = sum(len(y) for _, y in loader)
        self.assertEqual(n, 39)
        self.assertEqual(loader.skipped, 1)
        with self.assertRaisesRegex(RuntimeError, victim):  # at the shape probe, or in a batch
            for _ in Loader(ds, batch_size=8, image_size=32, workers=2, train=False,
                            fail_on_corrupt=True):
                pass

    def test_inside_torch_dataloader(self):
        direct = [x.clone() for x, _ in self.loader()]
        wrapped = [x.clone() for x, _ in torch.utils.data.DataLoader(self.loader(),
                                                                      batch_size=None)]
        self.assertEqual(len(direct), len(wrapped))
        self.assertTrue(all(torch.equal(p, q) for p, q in zip(direct, wrapped)))

    def test_a_plain_training_loop(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                    torch.nn.Flatten(), torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = self.loader(channels_last=True)
        losses = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            for images, labels in loader:
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        self.assertEqual(len(losses), 10)
        self.assertTrue(all(l == l for l in losses))  # finite, no NaN

    def test_shards_by_torch_distributed_rank(self):
        results = run_ranks("loader_shards", 2, env={"COHORT_TEST_DS": self.ds})
        seen = []
        for code, out in results:
            self.assertEqual(code, 0, out)
            seen += [line.split()[1] for line in out.splitlines() if line.startswith("sample ")]
        self.assertEqual(sorted(seen), digests(self.loader()))


if __name__ == "__main__":
    unittest.main(verbosity=2)
