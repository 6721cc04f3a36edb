"""Run a Python script with this rank pinned to its own cores: one rank = one device = its share of the cores.

    python bench/pin_rank.py SCRIPT [ARGS...]                            # one process: cores [0, c)
    torchrun --nproc_per_node=2 bench/pin_rank.py SCRIPT [ARGS...]       # rank r: cores [r*c, (r+1)*c)

c is $OMP_NUM_THREADS (default 1). The affinity is set before the script (and torch) starts, so every
thread the rank creates later (OpenMP pool, gloo's threads) stays on its cores. Where the machine has
fewer cores than ranks x c, the slices wrap around.
"""
from __future__ import annotations

import os
import runpy
import sys

from dlokit.in_job.rank import detect


def pin(local_rank: int, cores_per_rank: int) -> list[int]:
    cores = sorted(os.sched_getaffinity(0))
    start = (local_rank * cores_per_rank) % len(cores)
    mine = [cores[(start + i) % len(cores)] for i in range(min(cores_per_rank, len(cores)))]
    os.sched_setaffinity(0, mine)
    return mine


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if hasattr(os, "sched_setaffinity"):  # by the rank's place on its node: LOCAL_RANK is 0 in a kit task (its one GPU)
        pin(detect().task_on_node, max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)  # as if the script had been started directly
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
