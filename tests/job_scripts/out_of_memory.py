"""Runs out of memory for real: caps this process's address space, then allocates past the cap."""
import resource

limit = 512 * 1024**2
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
buffers = [bytearray(64 * 1024**2) for _ in range(16)]
