"""What the PyTorch peers ran on, recorded in their output: the version, torch.__config__.show()
(build flags, the BLAS and LAPACK it was built against) and the BLAS libraries actually loaded
in the process (Debian picks libblas.so.3 through alternatives: OpenBLAS when
libopenblas0-pthread is installed, the reference BLAS otherwise)."""
import os

import torch


def blas_loaded():
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if "/" in line else ""
            name = os.path.basename(os.path.realpath(path)) if path else ""
            if any(k in name for k in ("blas", "mkl", "lapack")):
                libs.add(os.path.realpath(path))
    return sorted(libs)


def describe():
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "blas_loaded": blas_loaded(), "config": torch.__config__.show()}


def pin(rank, world):
    """Give this rank its own equal share of the cores, as `cohort launch --bind auto` does when
    the ranks do not outnumber the cores; returns the cores."""
    cores = sorted(os.sched_getaffinity(0))
    if world > len(cores):
        return cores
    per = len(cores) // world
    mine = cores[rank * per:(rank + 1) * per]
    os.sched_setaffinity(0, mine)
    return mine
