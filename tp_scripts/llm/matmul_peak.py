"""The matmul FLOP/s each rank of this job reaches: MFU's peak where no datasheet gives one (a CPU).

    python matmul_peak.py                       # every rank at once, in fp32: each on the cores the job gave it
    python matmul_peak.py --dtype bf16 --sizes 1024 2048

Every rank times square matrix products of each size at the same time as the others (a barrier before each size), so
that a rank's figure is what it gets while the job's other ranks compute too, as in training. torch.utils.benchmark
times each size (blocked_autorange); the peak is the best size's median.

Run record (script `matmul_peak.py`): one `matmul` line per timed block: `n`, `dtype`, `flops_per_s`; summary.json:
`peak_flops` (this rank's best median), `peak_n`, `threads`, `device_type`, `device_name`, `memory_bytes_per_rank`
(the GPU's memory, or on a CPU the host's shared by the job's ranks on it: what the planner may fill).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.utils.benchmark as benchmark

from dlokit.in_job import rank as dlorank
from dlokit.in_job.runrecord import RunRecorder, shared_run_id

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="matmul_peak.py", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--min-run-time", type=float, default=0.3, help="seconds of products per size (blocked_autorange)")
    p.add_argument("--runs-dir", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = dlorank.init_process_group()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    recorder = RunRecorder({**vars(args), "world_size": world}, rank=rank, world_size=world, run_id=shared_run_id(),
                           runs_dir=args.runs_dir, script="matmul_peak.py", device=device)
    best = (0.0, None)
    for n in args.sizes:
        a, b = (torch.randn(n, n, device=device).to(DTYPES[args.dtype]) for _ in range(2))
        if dist.is_initialized():
            dist.barrier()
        timer = benchmark.Timer("a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
        measured = timer.blocked_autorange(min_run_time=args.min_run_time)
        for seconds in measured.times:
            recorder.log("matmul", n=n, dtype=args.dtype, flops_per_s=2 * n**3 / seconds)
        if 2 * n**3 / measured.median > best[0]:
            best = (2 * n**3 / measured.median, n)
    if device.type == "cuda":
        name, memory = torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory
    else:
        local = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
        name, memory = "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, local)
    recorder.finish(peak_flops=best[0], peak_n=best[1], threads=torch.get_num_threads(), device_type=device.type,
                    device_name=name, dtype=args.dtype, memory_bytes_per_rank=memory)
    if rank == 0:
        print(f"[matmul_peak] rank 0: {best[0] / 1e9:.1f} GFLOP/s ({args.dtype}, n = {best[1]}, "
              f"{torch.get_num_threads()} threads)", flush=True)
    if dist.is_initialized():
        dist.barrier()
    dlorank.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
