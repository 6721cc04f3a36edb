"""--memory-limit for the classifier's scripts: a device's worth of memory for what the run allocates from here on.

On a GPU the caching allocator's own limit (torch.cuda.set_per_process_memory_fraction); on a CPU RLIMIT_DATA set
to what the process holds now plus the limit, so that an allocation past it is refused ("DefaultCPUAllocator: can't
allocate memory") and the run ends out of memory, as on a GPU of that size. Day 4's tp_scripts/llm/llm_kit/
device_memory.py does the same for the language model's ranks (a separate package: the scripts cannot share it).
"""
from __future__ import annotations

import resource
from pathlib import Path

import torch

from dlokit.in_job.host_memory import return_freed_memory



def data_mib() -> float:
    """The process's private writable memory now (VmData, what RLIMIT_DATA bounds), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("--memory-limit on a CPU needs Linux (/proc/self/status has no VmData)")


def limit_memory(limit_mib: float, device: torch.device) -> dict:
    """Apply the limit to this process; returns what the run record keeps of it."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory / 2**20
        applied = min(limit_mib, total)
        torch.cuda.set_per_process_memory_fraction(applied / total, device)
        return {"memory_limit_mib": applied, "memory_limit_on": "cuda allocator"}
    return_freed_memory()
    _start_threads()
    base = data_mib()
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    wanted = int((base + limit_mib) * 2**20)
    for bound in (soft, hard):  # a job's own limit (the kit's mem) stays the tighter one
        if bound != resource.RLIM_INFINITY:
            wanted = min(wanted, bound)
    resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
    return {"memory_limit_mib": limit_mib, "memory_limit_on": "RLIMIT_DATA", "memory_base_mib": round(base, 1)}


def _start_threads() -> None:
    """The intra-op threads and the autograd engine start on first use, each with a stack RLIMIT_DATA counts and a
    GPU's allocator never sees: start them before the base is read."""
    weight = torch.ones(256, 256, requires_grad=True)
    (weight @ weight).sum().backward()
