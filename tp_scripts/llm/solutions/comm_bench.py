"""What this cluster gives a job: each rank's matmul FLOP/s, and the collectives' bus bandwidth.

All-reduce, all-gather and reduce-scatter across message sizes and group sizes: the numbers the layout planner's step-time model uses
(dlokit.layout_planner), measured on your own cluster, and MFU's peak where no datasheet gives one (a CPU).

    python comm_bench.py                              # the collectives on every rank: gloo on CPUs, NCCL on GPUs
    python comm_bench.py --max-mib 256 --repeats 20   # a GPU node
    python comm_bench.py --measure peak --dtype bf16  # the matmul peak, every rank at once

The peak: every rank times square matrix products of each --matmul-sizes at the same time as the others (a barrier
before each size), so that a rank's figure is what it gets while the job's other ranks compute too, as in training;
torch.utils.benchmark times them (blocked_autorange), the best size's median is the rank's peak. One `matmul` line per
timed block (`n`, `dtype`, `flops_per_s`); summary.json: `peak_flops`, `peak_n`, `threads`, `device_type`,
`device_name`, `memory_bytes_per_rank` (the GPU's memory, or on a CPU the host's share of each rank on it).

Each size is what nccl-tests calls the size of the collective: all-reduce's buffer, all-gather's whole output (each
rank sends 1/n of it), reduce-scatter's whole input (each rank keeps 1/n). Groups of 2, 4, 8 ... ranks and the whole
world (the first ranks of the job: on a node, the GPUs its scheduler placed together). Each repeat starts after a
barrier and lasts until the slowest rank is done (the maximum over the group's ranks): TP4.9's TODO.

Run record (script `comm_bench.py`): one `collective` line per repeat: `op`, `ranks`, `bytes`, `repeat`, `time_s` (the
slowest rank's), `own_s` (this rank's);
summary.json: `backend`, `device_type`, `sizes`, `groups`. Bus bandwidth (dlokit.analysis.bus_bandwidth) follows
nccl-tests: algbw = bytes / time, busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and
reduce-scatter.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.utils.benchmark as benchmark

from dlokit.in_job import rank as dlorank
from dlokit.in_job.peers import leave_now
from dlokit.in_job.runrecord import RunRecorder, shared_run_id

from llm_kit.ranks_done import ranks_done

OPS = ("all_reduce", "all_gather", "reduce_scatter")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="comm_bench.py", description=__doc__.split("\n")[0])
    p.add_argument("--measure", choices=("collectives", "peak"), default="collectives")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--min-kib", type=float, default=4, help="smallest message, KiB")
    p.add_argument("--max-mib", type=float, default=16, help="largest message, MiB (sizes grow x4)")
    p.add_argument("--repeats", type=int, default=8, help="timed repeats of each collective and size")
    p.add_argument("--warmup", type=int, default=2, help="untimed repeats first (connections, buffers)")
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--matmul-sizes", type=int, nargs="+", default=[256, 512, 1024], help="--measure peak: n of n x n")
    p.add_argument("--min-run-time", type=float, default=0.3, help="--measure peak: seconds of products per size")
    p.add_argument("--runs-dir", default=None)
    args = p.parse_args(argv)
    if args.repeats < 2 or args.warmup < 0 or not 0 < args.min_kib * 1024 <= args.max_mib * 2**20:
        p.error("--repeats 2 or more, --warmup 0 or more, --min-kib at most --max-mib")
    return args


def sizes(args, world: int) -> list[int]:
    """Message sizes in bytes, x4 apart, each a multiple of the world's ranks x the element size."""
    unit = world * torch.tensor([], dtype=DTYPES[args.dtype]).element_size()
    found, size = [], args.min_kib * 1024
    while size <= args.max_mib * 2**20:
        found.append(max(unit, int(size) // unit * unit))
        size *= 4
    return found


def groups(world: int) -> list[int]:
    """Group sizes: 2, 4, 8 ... and the world."""
    found = [n for n in (2 ** k for k in range(1, world.bit_length())) if n < world]
    return found + [world]


def one(op: str, group, n: int, size: int, dtype, device):
    """A callable that runs the collective once on `size` bytes (nccl-tests' size of the op)."""
    elements = size // torch.tensor([], dtype=dtype).element_size()
    if op == "all_reduce":
        buffer = torch.ones(elements, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buffer, group=group)
    whole = torch.ones(elements, dtype=dtype, device=device)
    part = torch.ones(elements // n, dtype=dtype, device=device)
    if op == "all_gather":
        return lambda: dist.all_gather_single(whole, part, group=group)
    return lambda: dist.reduce_scatter_single(part, whole, group=group)


def timed(run, group, device) -> tuple[float, float]:
    """(seconds from a barrier to the slowest rank's end of one collective, this rank's own seconds)."""
    dist.barrier(group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    own = time.perf_counter() - start
    # >>> SOLUTION TP4.9: a collective has ended when its slowest rank has: the maximum of the ranks' times (all_reduce MAX)
    elapsed = torch.tensor([own], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return float(elapsed.item()), own
    # --- STUDENT
    # return own, own
    # <<< SOLUTION


def matmul_peak(args, recorder, device, ranks_on_node: int) -> dict:
    """This rank's best median FLOP/s over the sizes, every rank timing each size at once."""
    best = (0.0, None)
    for n in args.matmul_sizes:
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
        name, memory = "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, ranks_on_node)
    return {"peak_flops": best[0], "peak_n": best[1], "threads": torch.get_num_threads(), "device_name": name,
            "memory_bytes_per_rank": memory}


def main(argv=None) -> int:
    args = parse_args(argv)
    env = dlorank.detect()
    if env.world_size < 2 and args.measure == "collectives":
        print("comm_bench.py: error: run it on 2 ranks or more (a collective needs several)", file=sys.stderr)
        return 2
    device = dlorank.init_process_group()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    recorder = RunRecorder({**vars(args), "world_size": world}, rank=rank, world_size=world, run_id=shared_run_id(),
                           runs_dir=args.runs_dir, script="comm_bench.py", device=device)
    if args.measure == "peak":
        found = matmul_peak(args, recorder, device, env.tasks_on_node)
        recorder.finish(**found, device_type=device.type, dtype=args.dtype)
        if rank == 0:
            print(f"[comm_bench] rank 0: {found['peak_flops'] / 1e9:.1f} GFLOP/s ({args.dtype}, n = {found['peak_n']}, "
                  f"{found['threads']} threads)", flush=True)
        return ranks_done()
    dtype = DTYPES[args.dtype]
    message_sizes, group_sizes = sizes(args, world), groups(world)
    for n in group_sizes:
        group = dist.new_group(list(range(n)))  # every rank creates every group, as torch.distributed requires
        if rank < n:
            for op in args.ops:
                for size in message_sizes:
                    run = one(op, group, n, size, dtype, device)
                    for _ in range(args.warmup):
                        run()
                    for repeat in range(args.repeats):
                        slowest, own = timed(run, group, device)
                        recorder.log("collective", op=op, ranks=n, bytes=size, repeat=repeat, time_s=slowest,
                                     own_s=own)
                if rank == 0:
                    print(f"[comm_bench] {op} on {n} ranks: {len(message_sizes)} sizes timed", flush=True)
        dist.barrier()
    recorder.finish(backend=dist.get_backend(), device_type=device.type, sizes=message_sizes, groups=group_sizes,
                    dtype=args.dtype)
    return ranks_done()


if __name__ == "__main__":
    leave_now(main())  # without the interpreter's teardown: see dlokit.in_job.peers.leave_now
