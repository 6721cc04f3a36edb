"""Prints which run of its Slurm job this is (SLURM_RESTART_COUNT: 0, then 1 after a requeue); the first run
waits (a node can be killed under it), a rerun ends at once."""
import os
import time

restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
print(f"run {restarts}", flush=True)
time.sleep(300 if restarts == 0 else 1)
