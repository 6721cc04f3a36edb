"""What torch.compile needs on this machine, checked before a job relies on it.

A module shared by train_classifier.py (--compile) and compile_bench.py: it is not part of any TP. It also keeps
Inductor's kernel cache (where it is, a fresh one) and the compiler's one-off start-up, timed apart.

Inductor, torch.compile's default back end, writes C++ kernels for the CPU and builds them with a C++
compiler ($CXX, else g++); for the GPU it writes Triton kernels. Without one, the first compiled call
fails deep inside the compiler stack: these checks say it in one sentence instead.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time

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


def inductor_cache_dir() -> str:
    """Where Inductor keeps compiled kernels (TORCHINDUCTOR_CACHE_DIR: the kit sets one per user)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def use_fresh_cache() -> None:
    """An empty cache folder, removed at the end, and Inductor's in-memory caches emptied: every kernel is generated
    and built again (called before each compiled variant, so that no variant reuses another's kernels)."""
    from torch._inductor.utils import clear_inductor_caches

    folder = tempfile.mkdtemp(prefix="dlokit-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    clear_inductor_caches()


def compiler_startup(device, variants, make_variant) -> dict:
    """Compile and run a one-line function once, untimed by the variants: Dynamo's and Inductor's modules load,
    the C++ (or Triton) toolchain starts, whatever the first compiled variant would otherwise pay alone.
    Returns {"compiler_startup_s": the seconds it took}; when make_variant compiles none of the compile variants
    (compile_with left as the identity), nothing would pay it: {"compiler_startup_s": None} and why it was skipped."""
    from .compile_options import compiles
    from .compile_timing import is_compiled

    if not any(is_compiled(make_variant(v, _same, None)) for v in variants if compiles(v)):
        return {"compiler_startup_s": None, "compiler_startup_skipped": "no variant compiles: compile_with returns the "
                "function it is given (TODO TP3.3 in compile_bench.py), so there is no compiler start-up to pay"}
    started = time.perf_counter()
    use_fresh_cache()
    import torch

    torch.compile(lambda x: torch.relu(x) + 1)(torch.ones(8, device=device))
    torch._dynamo.reset()
    return {"compiler_startup_s": time.perf_counter() - started}


def _same(x):
    return x
