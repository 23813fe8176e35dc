"""A torch script on the backend "cohort" started by each launcher the README names: torchrun,
cohort launch and mpirun (srun: tests/cluster/slurm_test.sh), 2 ranks each, from the environment
alone (tests/python/launchers_rank.py). Bounded in time; no shared-memory segment left behind.

Debian's torchrun (torch 1.13 on Python 3.11) fails at its default --redirects/--tee of "0"
(Python 3.11 no longer iterates IntFlag's zero member); it runs with --redirects 1 --tee 1.
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backend_test import free_port, shm_segments  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "launchers_rank.py")
COHORT = os.environ.get("COHORT_BIN", os.path.join(HERE, "../../build/bin/cohort"))
PY = "/usr/bin/python3"


class Launchers(unittest.TestCase):
    def launch(self, cmd):
        before = shm_segments()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)  # the launcher and every rank it started
            out, _ = p.communicate()
            self.fail(f"{cmd[:3]} did not finish within 120 s:\n{out}")
        self.assertEqual(p.returncode, 0, out)
        for r in (0, 1):
            self.assertIn(f"launched rank {r} of 2: allreduce 3", out)
        self.assertEqual(shm_segments() - before, set())

    def test_cohort_launch(self):
        self.launch([COHORT, "launch", "--nproc-per-node", "2", "--", PY, RANK])

    def test_torchrun(self):
        self.launch([PY, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1",
                     "--nproc_per_node", "2", "--master_port", str(free_port()), RANK])

    def test_mpirun(self):
        self.launch(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                     "-x", "PYTHONPATH", PY, RANK])


if __name__ == "__main__":
    unittest.main(verbosity=2)
