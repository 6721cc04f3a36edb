"""Every rank adds its rank+1 with a gloo/nccl all_reduce; prints its view and its argv."""
import json
import sys
import time

import torch
import torch.distributed as dist

from dlokit.in_job import rank

env = rank.detect()
device = rank.init_process_group()
value = torch.tensor([env.rank + 1.0], device=device)
if env.distributed:
    dist.all_reduce(value)
print(json.dumps({"rank": env.rank, "world_size": env.world_size, "source": env.source,
                  "sum": value.item(), "argv": sys.argv[1:],
                  "master_port": env.master_port, "at_unix": time.time()}), flush=True)
rank.destroy_process_group()
