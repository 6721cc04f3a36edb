"""Prints, as one JSON line, what this task may use: GPUs, threads, cores, its rank."""
import json
import os

print(json.dumps({"rank": int(os.environ.get("RANK", "0")), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                  "task_on_node": int(os.environ.get("DLOKIT_TASK_ON_NODE", "0")),
                  "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "omp": os.environ.get("OMP_NUM_THREADS"),
                  "cpus": sorted(os.sched_getaffinity(0)), "devices": os.environ.get("DLOKIT_DEVICES")}), flush=True)
