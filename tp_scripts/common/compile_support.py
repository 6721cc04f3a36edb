"""What torch.compile needs on this machine, checked before a job relies on it.

A module shared by train_classifier.py (--compile) and compile_bench.py: it is not part of any TP.

Inductor, torch.compile's default back end, writes C++ kernels for the CPU and builds them with a C++
compiler ($CXX, else g++); for the GPU it writes Triton kernels. Without one, the first compiled call
fails deep inside the compiler stack: these checks say it in one sentence instead.
"""
from __future__ import annotations

import shutil

CUDA_GRAPH_MODES = ("reduce-overhead",)  # CUDA graphs replay whole GPU launches: nothing to replay on a CPU


def compile_modes() -> list[str]:
    """The modes torch.compile accepts (default, reduce-overhead, max-autotune, ...)."""
    import torch._inductor

    return list(torch._inductor.list_mode_options())


def cpu_compiler() -> str:
    """The C++ compiler Inductor calls for CPU kernels: the last entry of its search list ($CXX, else g++)."""
    from torch._inductor import config

    names = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
    return next((name for name in reversed(names) if name), "g++")


def missing_compiler(device_type: str) -> str | None:
    """Why torch.compile cannot build kernels for this device here, or None when it can."""
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "torch.compile on the GPU needs Triton (pip package 'triton'), not installed"
    name = cpu_compiler()
    if shutil.which(name) is None:
        return (f"torch.compile on the CPU needs a C++ compiler and '{name}' is not on PATH: install g++ "
                "(scripts/setup.sh does it as root) or set CXX to one")
    return None
