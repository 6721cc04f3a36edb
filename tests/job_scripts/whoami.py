"""Prints the Slurm job it runs in and its rank, after a gloo all_reduce (a real 2-task job)."""
import json
import os

import torch
import torch.distributed as dist

from dlokit.in_job import rank

env = rank.detect()
rank.init_process_group()
value = torch.tensor([1.0])
if env.distributed:
    dist.all_reduce(value)
print(json.dumps({"job": os.environ.get("SLURM_JOB_ID"), "rank": env.rank, "world_size": env.world_size,
                  "sum": value.item(), "parent": os.environ.get("PARENT_JOB_ID_SEEN")}), flush=True)
rank.destroy_process_group()
