"""Cohort inside PyTorch.

``import cohort`` registers the torch.distributed backend "cohort":

    import cohort, torch.distributed as dist
    dist.init_process_group("cohort")   # under torchrun, cohort launch, mpirun or srun

It runs under torchrun, `cohort launch`, mpirun and srun: under the last two, importing cohort
fills in torch's RANK, WORLD_SIZE, MASTER_ADDR, ... from Open MPI's or Slurm's variables.

It covers CPU tensors: allreduce (SUM, AVG, PRODUCT, MIN, MAX), allreduce_coalesced, broadcast,
reduce, all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, all_to_all,
all_to_all_single (with splits), gather, scatter, barrier, send and recv.
"""

import atexit as _atexit
import os as _os

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as _dist

# Cohort's progress thread shares its rank's cores with torch's compute threads, so a waiting
# rank yields at once instead of spinning 2000 polls first. Measured with PyTorch DDP, resnet18,
# 2 ranks on 2 cores (bench/torch_ddp.py, paired runs): the cost of communication fell from
# 210 and 121 ms to 92 and 56 ms; a blocking 4 KiB allreduce stayed at 12-13 us. An explicit
# COHORT_SPIN still wins.
_os.environ.setdefault("COHORT_SPIN", "1")

# `pip install` puts the GDCM helper (cohort-gdcm, docs/data.md) beside this file: cohort_data
# was built naming the helper by its path in the build tree, and pip's temporary tree is gone.
# A build tree's own package (PYTHONPATH=build/python) has none there and keeps that path.
_gdcm_helper = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "cohort-gdcm")
if _os.path.exists(_gdcm_helper):
    _os.environ.setdefault("COHORT_GDCM_HELPER", _gdcm_helper)

from . import _C
from ._C import ProcessGroupCohort

__all__ = ["ProcessGroupCohort"]


def _fill_torch_env():
    """Under mpirun or srun, which set no torchrun variables, torch's env:// rendezvous finds
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from Open MPI's or
    Slurm's, as Cohort's own ranks read them (docs/comm.md); variables already set win."""
    if "RANK" in _os.environ:
        return
    job = _C.job_env()
    if job["launcher"] not in ("mpirun", "slurm"):
        return
    for key, value in (("RANK", job["rank"]), ("WORLD_SIZE", job["world"]),
                       ("LOCAL_RANK", job["local_rank"]),
                       ("LOCAL_WORLD_SIZE", job["local_world"]),
                       ("MASTER_ADDR", job["master_addr"]), ("MASTER_PORT", job["master_port"])):
        _os.environ.setdefault(key, str(value))


_fill_torch_env()


def _create_process_group(store, rank, world_size, timeout):
    return ProcessGroupCohort(store, rank, world_size, timeout)


# Before Python finalizes, let every group's completion thread release the tensors it holds:
# releasing one needs the GIL, and a thread that asks for it during finalization is ended by
# Python, which aborts the process when it happens inside a destructor. Seen about once in 10
# runs that trained with DDP and ZeroRedundancyOptimizer and exited normally.
_atexit.register(_C._drain_groups)

if "COHORT" not in _dist.Backend._plugins:
    _dist.Backend.register_backend("cohort", _create_process_group)
