"""Prints where this task runs: its place in the job as dlokit.in_job.rank reads it, its node (as Slurm names it and as
the task's own hostname says), its GPUs, and the rendezvous address as it resolves here. No torch: cheap at 8 tasks."""
import json
import os
import socket

from dlokit.in_job import rank

env = rank.detect()
print(json.dumps({"rank": env.rank, "local_rank": env.local_rank, "world_size": env.world_size,
                  "local_world_size": env.local_world_size, "task_on_node": env.task_on_node,
                  "tasks_on_node": env.tasks_on_node, "source": env.source,
                  "master_addr": env.master_addr, "master_ip": socket.gethostbyname(env.master_addr),
                  "hostname": socket.gethostname(), "host_ip": socket.gethostbyname(socket.gethostname()),
                  "node_id": int(os.environ["SLURM_NODEID"]), "slurm_node": os.environ.get("SLURMD_NODENAME"),
                  "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
