"""Course-compatible facade for scripts that `import idr_torch`: module-level rank variables.

    import idr_torch
    if idr_torch.rank == 0: ...
"""
from dlokit.in_job.rank import detect as _detect

_env = _detect()
rank = _env.rank
local_rank = _env.local_rank
size = _env.world_size
cpus_per_task = _env.cpus_per_task
hostnames = list(_env.hostnames)
master_addr = _env.master_addr
master_port = _env.master_port
