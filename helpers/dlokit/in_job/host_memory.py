"""A CPU job under `--memory-limit` (RLIMIT_DATA) should count what it holds, as a GPU's allocator would: freed big
blocks go back to the system. Shared by both script families' memory limits (common/memory_limit.py,
llm_kit/device_memory.py)."""
from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def return_freed_memory() -> None:
    """Blocks of 1 MiB and more get their own mapping, given back to the system when freed. By default glibc raises
    that threshold as big blocks are freed (up to 32 MiB), then keeps freed blocks for reuse: they would still count
    against RLIMIT_DATA, which a GPU's allocator does not do to its own cache. Nothing happens without glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "mallopt"):
            libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
    except OSError:
        pass
