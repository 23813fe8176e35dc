"""`pip install` of the Python package `cohort` the way a user does it, from a clean copy of the
checkout: a virtual environment that sees Debian's torch (`python3 -m venv
--system-site-packages`), `pip install` of the copy (pyproject.toml, python/build_backend), then,
from another folder and with no PYTHONPATH, `import cohort` from the environment's site-packages,
the extension's libraries found (ldd), cohort.data.Loader over 32-bit DICOM files (decoded by
the GDCM helper the package carries), and a real 2-process all_reduce under the
torch.distributed backend "cohort". Everything is removed after.

The copy holds the checkout's tracked files as they are in the work tree (`git ls-files`, so
uncommitted changes to tracked files are in it, untracked files are not). With COHORT_BUILD_DIR
(ctest passes the suite's build tree, which holds the same work tree's objects) the backend
builds the extension there, which costs nothing once the suite is built; without it pip builds in
a temporary tree from scratch, as a user's `pip install .` does (110 s on 2 cores).

Run: /usr/bin/python3 tests/python/pip_install_test.py [--keep]
     (COHORT_BUILD_DIR=build and COHORT_BIN=build/bin/cohort to reuse scripts/build's tree)
"""

import glob
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backend_test import free_port, shm_segments  # noqa: E402  the same harness helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COHORT = os.environ.get("COHORT_BIN", os.path.join(ROOT, "build", "bin", "cohort"))

# Run by the environment's python from the other folder: where cohort comes from, its
# libraries, the GDCM helper it carries, and the Loader over DICOM files that need that helper.
CHECK = r"""
import os, subprocess, sys, sysconfig
site = os.path.realpath(sysconfig.get_paths()["platlib"])
assert site.startswith(os.path.realpath(sys.prefix)), (site, sys.prefix)
import cohort, cohort.data, torch.distributed as dist
for what, path in (("cohort", cohort.__file__), ("cohort._C", cohort._C.__file__)):
    path = os.path.realpath(path)
    assert path.startswith(site + os.sep), f"{what} imported from {path}, not from {site}"
    print(f"{what}: {path}")
assert "COHORT" in dist.Backend._plugins, "the backend 'cohort' is not registered"
pkg = os.path.dirname(os.path.realpath(cohort.__file__))
helper = os.path.join(pkg, "cohort-gdcm")
assert os.access(helper, os.X_OK), f"{helper}: missing or not executable"
assert os.environ.get("COHORT_GDCM_HELPER") == helper, os.environ.get("COHORT_GDCM_HELPER")
for f in (cohort._C.__file__, helper):
    out = subprocess.run(["ldd", f], capture_output=True, text=True, check=True).stdout
    assert "not found" not in out, f"{f}: libraries not found:\n{out}"
    # Only the system's folders (Open MPI's, which CMake keeps): none of a build tree.
    dyn = subprocess.run(["readelf", "-d", f], capture_output=True, text=True, check=True).stdout
    for line in (l for l in dyn.splitlines() if "RPATH" in l or "RUNPATH" in l):
        for d in line.split("[", 1)[1].rstrip("]").split(":"):
            assert d.startswith("/usr/lib/"), f"{f}: a run path outside the system: {line}"
# 32-bit DICOM, which decodes through the helper: a gradient from dark (left) to bright (right).
loader = cohort.data.Loader(sys.argv[1], batch_size=4, image_size=32, workers=1, seed=1)
images, labels = next(iter(loader))
assert tuple(images.shape) == (4, 1, 32, 32) and labels.shape[0] == 4, (images.shape, labels)
assert loader.stats()["skipped"] == 0, loader.stats()
left, right = float(images[..., 0].mean()), float(images[..., -1].mean())
assert left < -1 and right > 1, f"not the gradient written: left {left}, right {right}"
print(f"Loader: 32-bit DICOM through {helper}: a batch of {tuple(images.shape)}")
"""

# One rank of the all_reduce, run by the environment's python from the other folder.
RANK = r"""
import datetime, os, torch, cohort, torch.distributed as dist
dist.init_process_group("cohort", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((1000,), 3.0)), t[:4]
assert dist.get_backend() == "cohort", dist.get_backend()
dist.destroy_process_group()
print(f"rank {rank}: all_reduce over 'cohort' gave 3.0")
"""


def dicom_element(group, elem, vr, value):
    """One element in explicit VR little endian."""
    if vr in (b"OB", b"OW"):
        return struct.pack("<HH2sHI", group, elem, vr, 0, len(value)) + value
    return struct.pack("<HH2sH", group, elem, vr, len(value)) + value


def dicom_32bit(rows, cols, values):
    """A grayscale DICOM file of 32-bit unsigned pixels: Cohort's own reader leaves those to
    GDCM, in the helper process (cohort-gdcm)."""
    def uid(s):
        return s.encode() + (b"\0" if len(s) % 2 else b"")

    def us(v):
        return struct.pack("<H", v)

    sop_class, instance = "1.2.840.10008.5.1.4.1.1.7", "1.2.826.0.1.3680043.2.1143.1"
    meta = (dicom_element(2, 1, b"OB", b"\0\1") + dicom_element(2, 2, b"UI", uid(sop_class)) +
            dicom_element(2, 3, b"UI", uid(instance)) +
            dicom_element(2, 0x10, b"UI", uid("1.2.840.10008.1.2.1")))
    data = (dicom_element(8, 0x16, b"UI", uid(sop_class)) +
            dicom_element(8, 0x18, b"UI", uid(instance)) +
            dicom_element(0x28, 2, b"US", us(1)) +
            dicom_element(0x28, 4, b"CS", b"MONOCHROME2 ") +
            dicom_element(0x28, 0x10, b"US", us(rows)) +
            dicom_element(0x28, 0x11, b"US", us(cols)) +
            dicom_element(0x28, 0x100, b"US", us(32)) +
            dicom_element(0x28, 0x101, b"US", us(32)) +
            dicom_element(0x28, 0x102, b"US", us(31)) +
            dicom_element(0x28, 0x103, b"US", us(0)) +
            dicom_element(0x7fe0, 0x10, b"OW", struct.pack(f"<{rows * cols}I", *values)))
    return (b"\0" * 128 + b"DICM" +
            dicom_element(2, 0, b"UL", struct.pack("<I", len(meta))) + meta + data)


def make_dicom_set(path):
    """cohort make-dataset's folders and labels, each scan rewritten as 32-bit DICOM."""
    subprocess.run([COHORT, "make-dataset", "scans", "--out", path, "--count", "8", "--format",
                    "dicom", "--size", "48", "--channels", "1"], check=True,
                   stdout=subprocess.DEVNULL, timeout=60)
    files = sorted(glob.glob(os.path.join(path, "*", "*.dcm")))
    assert len(files) == 8, files
    for i, f in enumerate(files):
        with open(f, "wb") as out:
            out.write(dicom_32bit(48, 48, [x * 100000 + y * 7 + i
                                           for y in range(48) for x in range(48)]))


def run(cmd, what, timeout, **kw):
    start = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, **kw)
    took = time.monotonic() - start
    if r.returncode != 0:
        sys.exit(f"FAIL: {what} exited {r.returncode} after {took:.1f} s:\n{r.stdout}")
    print(f"{what}: {took:.1f} s")
    return r.stdout


def copy_checkout(dest):
    """The tracked files of the checkout as they are in the work tree."""
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True,
                            check=True).stdout.decode().split("\0")
    copied = 0
    for rel in listed:
        src = os.path.join(ROOT, rel)
        if not rel or not os.path.isfile(src):  # deleted in the work tree, or a submodule
            continue
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel))
        copied += 1
    print(f"copied {copied} tracked files of {ROOT}")


def two_ranks(python, cwd, env):
    port = free_port()
    before = shm_segments()
    procs = [subprocess.Popen([python, "-c", RANK], cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True,
                              env=dict(env, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in range(2)]
    deadline = time.monotonic() + 90
    failed = []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            out, _ = p.communicate()
            out += "\n[killed at the test's timeout]"
        print(out.strip())
        if p.returncode != 0:
            failed.append(f"rank {r} exited {p.returncode}")
    left = shm_segments() - before
    for n in left:
        os.unlink("/dev/shm/" + n)
    if left:
        failed.append(f"left behind in /dev/shm: {sorted(left)}")
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))


def main():
    keep = "--keep" in sys.argv
    tmp = tempfile.mkdtemp(prefix="cohort-pip-test-")
    try:
        src, venv, elsewhere = (os.path.join(tmp, d) for d in ("cohort", "venv", "elsewhere"))
        os.makedirs(elsewhere)
        copy_checkout(src)
        run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], "venv", 120)
        # A user's environment: no PYTHONPATH, and pip's own index settings left alone
        # (the build needs none: pyproject.toml's requires is empty).
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        pip_env = dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
        if os.environ.get("COHORT_BUILD_DIR"):
            print(f"the extension is built in COHORT_BUILD_DIR={os.environ['COHORT_BUILD_DIR']}")
        out = run([os.path.join(venv, "bin", "pip"), "install", src], "pip install", 900,
                  cwd=elsewhere, env=pip_env)
        print(out.strip().splitlines()[-1])
        python = os.path.join(venv, "bin", "python")
        env.pop("COHORT_BUILD_DIR", None)
        make_dicom_set(os.path.join(tmp, "ds"))
        print(run([python, "-c", CHECK, os.path.join(tmp, "ds")], "import cohort", 120,
                  cwd=elsewhere, env=env).strip())
        two_ranks(python, elsewhere, env)
        print("PASS")
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
