"""Cohort inside PyTorch.

``import cohort`` registers the torch.distributed backend "cohort":

    import cohort, torch.distributed as dist
    dist.init_process_group("cohort")   # under torchrun, cohort launch, mpirun or srun

It covers CPU tensors: allreduce (SUM, AVG, PRODUCT, MIN, MAX), allreduce_coalesced, broadcast,
reduce, all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, all_to_all,
all_to_all_single (with splits), gather, scatter, barrier, send and recv.
"""

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as _dist

from ._C import ProcessGroupCohort

__all__ = ["ProcessGroupCohort"]


def _create_process_group(store, rank, world_size, timeout):
    return ProcessGroupCohort(store, rank, world_size, timeout)


if "COHORT" not in _dist.Backend._plugins:
    _dist.Backend.register_backend("cohort", _create_process_group)
