"""How a Day 4 script's main() ends: every rank done, then the process group destroyed; or, when a rank raised, its
cause recorded and the exit code of dlokit.in_job.jobenv's table.

    try:
        ...
    except Exception as error:
        leave_on_error(error, recorder, peers, script="train_llm")   # never returns
    peers.stop_watching()
    return ranks_done(0)

    if __name__ == "__main__":
        leave_now(main())    # dlokit.in_job.peers: the one exit path (flushes, then os._exit: no interpreter teardown)
"""
from __future__ import annotations

import sys
import traceback

import torch.distributed as dist

from dlokit.in_job import rank as dlorank
from dlokit.in_job.measure import peak_gpu_memory_mb, peak_rss_mb
from dlokit.in_job.peers import is_out_of_memory, leave_now


def ranks_done(code: int = 0) -> int:
    """Wait for every rank (rank 0 may host the store the others still read), destroy the process group and return
    `code`, main()'s exit status."""
    if dist.is_initialized():
        dist.barrier()
    dlorank.destroy_process_group()
    return code


def leave_on_error(error: BaseException, recorder, peers, *, script: str, what: str = "") -> None:
    """This rank raised `error`: record why and leave. Out of memory: the record's out_of_memory (status "oom"), then
    peers.failed(oom=True), exit 3, as the classifier's Instrument does; a collective that failed because another rank
    stopped first: that rank's cause, its exit code; anything else: status "failed", exit 1."""
    if is_out_of_memory(error):
        text = str(error).strip()
        message = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        print(f"[{script}] rank {peers.rank}: OUT OF MEMORY{what}: {message}", file=sys.stderr, flush=True)
        recorder.out_of_memory(message, gpu_mem_peak_mb=peak_gpu_memory_mb(peers.device),
                               host_rss_peak_mb=peak_rss_mb())
        leave_now(peers.failed(f"ran out of memory: {message}", oom=True))
    code = peers.peer_stop_code()  # this rank's collective may have failed because another one stopped
    if code is not None:
        leave_now(code)
    traceback.print_exc()
    recorder.finish(status="failed", error=f"{type(error).__name__}: {error}")
    leave_now(peers.failed(f"failed: {type(error).__name__}: {error}"))
