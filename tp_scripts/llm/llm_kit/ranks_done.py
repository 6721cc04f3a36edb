"""The end of a Day 4 script's main(): every rank done, then the process group destroyed.

    if __name__ == "__main__":
        leave_now(main())    # dlokit.in_job.peers: the one exit path (flushes, then os._exit: no interpreter teardown)
"""
from __future__ import annotations

import torch.distributed as dist

from dlokit.in_job import rank as dlorank


def ranks_done(code: int = 0) -> int:
    """Wait for every rank (rank 0 may host the store the others still read), destroy the process group and return
    `code`, main()'s exit status."""
    if dist.is_initialized():
        dist.barrier()
    dlorank.destroy_process_group()
    return code
