"""cohort.checkpoint: safetensors weights and checkpoint indexes written by `cohort train`, read
from Python; damaged files raise naming the file."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

from cohort.checkpoint import inspect, load_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))
COHORT = os.environ.get("COHORT_BIN", os.path.join(HERE, "../../build/bin/cohort"))


class CheckpointTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="cohort-checkpoint-test-")
        t = cls.tmp
        subprocess.run([COHORT, "make-dataset", "scans", "--out", f"{t}/ds", "--count", "32",
                        "--size", "24"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([COHORT, "train", "--model", "smallcnn", "--data", f"{t}/ds", "--epochs",
                        "1", "--batch", "8", "--image-size", "24", "--save", f"{t}/out",
                        "--checkpoint-dir", f"{t}/ckpt", "--log-every", "100"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([COHORT, "checkpoint", "consolidate", f"{t}/ckpt", "--out",
                        f"{t}/consolidated.safetensors"], check=True, stdout=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_weights_read_back_as_the_checkpoint_holds_them(self):
        saved = load_safetensors(f"{self.tmp}/out/model.safetensors")
        consolidated = load_safetensors(f"{self.tmp}/consolidated.safetensors")
        self.assertGreater(len(saved), 4)
        self.assertEqual(set(saved), set(consolidated))
        for name, t in saved.items():
            self.assertTrue(torch.equal(t, consolidated[name]), name)
        self.assertTrue(any(t.dtype == torch.float32 and t.dim() == 4 for t in saved.values()))

    def test_checkpoint_index(self):
        info = inspect(f"{self.tmp}/ckpt")
        self.assertEqual(info["step"], 4)
        self.assertEqual(info["model"], "smallcnn")
        self.assertEqual(len(info["files"]), 1)
        self.assertGreater(info["files"][0]["bytes"], 0)
        with self.assertRaisesRegex(FileNotFoundError, "no checkpoint index"):
            inspect(f"{self.tmp}/out")

    def test_damaged_files_name_themselves(self):
        bad = f"{self.tmp}/bad.safetensors"
        with open(f"{self.tmp}/out/model.safetensors", "rb") as f:
            raw = f.read()
        for damage in (raw[:5], raw[:100], b"\xff" * 8 + raw[8:]):
            with open(bad, "wb") as f:
                f.write(damage)
            with self.assertRaisesRegex(ValueError, "bad.safetensors"):
                load_safetensors(bad)


if __name__ == "__main__":
    unittest.main(verbosity=2)
