"""--memory-limit: give this rank's tensors a device's worth of memory, on a GPU or on a CPU.

A GPU's memory is a wall for tensors: past it, the caching allocator raises "CUDA out of memory", whatever the
host holds. A CPU process has no such wall, and its resident memory is mostly the interpreter and the libraries
(about 1.3 GB here), which drowns the difference between two parallel layouts. So the limit applies to what the
run allocates once started:

* on a GPU: torch.cuda.set_per_process_memory_fraction, the allocator's own limit; a limit above the card's
  memory is lowered to the card, and the record says so (memory_limit_mb is what applied, beside what was asked);
* on a CPU: RLIMIT_DATA (the process's private writable memory, which tensors come from) set to what the process
  holds after start-up (interpreter, libraries, process group) plus the limit: an allocation past it is refused
  ("DefaultCPUAllocator: can't allocate memory"), and the run ends out of memory, as on a GPU of that size.
  Threads count there too (each reserves an 8 MiB stack): those the run would start later are started first.
"""
from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

from dlokit.in_job.host_memory import return_freed_memory


def data_mb() -> float | None:
    """The process's private writable memory now (VmData, what RLIMIT_DATA bounds), in MiB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmData:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def limit_memory(limit_mb: float, device: torch.device) -> dict:
    """Apply the limit for this rank; returns what the run record keeps of it."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory / 2**20
        applied = cuda_limit(limit_mb, total)
        torch.cuda.set_per_process_memory_fraction(applied["memory_limit_mb"] / total, device)
        if "memory_limit_note" in applied:
            print(f"[device_memory] {applied['memory_limit_note']}", file=sys.stderr, flush=True)
        return applied
    return_freed_memory()
    _start_autograd_threads()
    base = data_mb()
    if base is None:
        raise RuntimeError("--memory-limit on a CPU needs Linux (/proc/self/status)")
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    wanted = int((base + limit_mb) * 2**20)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY:
        wanted = min(wanted, soft)  # a job's own limit (the kit's mem) stays the tighter one
    resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
    return {"memory_limit_mb": limit_mb, "memory_limit_on": "RLIMIT_DATA", "memory_base_mb": round(base, 1)}


def cuda_limit(limit_mb: float, total_mb: float) -> dict:
    """What the run record keeps of a limit on a GPU of `total_mb`: the limit, or the card's memory when it asks for
    more (the allocator cannot give more than the card), with a note saying so."""
    if limit_mb <= total_mb:
        return {"memory_limit_mb": limit_mb, "memory_limit_on": "cuda allocator"}
    return {"memory_limit_mb": total_mb, "memory_limit_requested_mb": limit_mb, "memory_limit_on": "cuda allocator",
            "memory_limit_note": f"--memory-limit {limit_mb:.0f} MiB is more than this GPU's {total_mb:.0f} MiB: "
                                 "lowered to the GPU's memory (ask for less, or plan the sizes with dlokit.gpu_plan)"}


def _start_autograd_threads() -> None:
    """The first backward through a DTensor (FSDP2's and tensor parallelism's weights) starts the autograd engine's
    device threads: 8 on this CPU, 64 MiB of reserved stacks, which RLIMIT_DATA counts and a GPU's allocator never
    sees. Measured: FSDP2 of the small config then needed more room than DDP. Start them before the base is read."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    from torch.distributed.tensor import DeviceMesh, DTensor, Replicate

    mesh = DeviceMesh("cpu", list(range(dist.get_world_size())))
    weight = DTensor.from_local(torch.zeros(1), mesh, [Replicate()], run_check=False).requires_grad_()
    weight.to_local().sum().backward()


