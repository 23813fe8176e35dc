"""One rank of a torch script started by a launcher (torchrun, cohort launch, mpirun, srun):
init_process_group("cohort") from the environment alone, one allreduce, the result printed."""
import torch
import torch.distributed as dist

import cohort  # noqa: F401

dist.init_process_group("cohort")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t
print(f"launched rank {rank} of {world}: allreduce {t.item():g}", flush=True)
dist.barrier()
dist.destroy_process_group()
