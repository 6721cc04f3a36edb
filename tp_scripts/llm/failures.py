"""When one rank fails, every rank stops promptly and its run record says why.

A rank that runs out of memory leaves the others blocked in their next collective: NCCL waits for
its timeout (10 minutes by default) and, under srun, nothing kills the other tasks. So:

- the failing rank writes its cause into the job's key-value store (the TCPStore every rank joined
  when the process group started), aborts its NCCL communicators, waits a moment for the other ranks
  to acknowledge, and exits (code 3 for out of memory, 1 otherwise);
- every rank runs a small watcher thread that polls that key; when it appears the rank records
  "aborted: rank R ran out of memory: ..." and exits at once (code 4), even from inside a collective.
  A rank whose collective fails first (gloo notices a closed connection at once) reads the same key.

At the normal end every rank stops its watcher before the final barrier, so a rank that finishes
first and takes the store with it (rank 0 hosts it outside torchrun) is never mistaken for a failure.
"""
from __future__ import annotations

import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from dlokit.jobenv import EXIT_PEER_FAILED  # the exit codes of both scripts: one table, in dlokit.jobenv

# the first failing rank's cause; how many ranks failed; how many stopped (failed or not) and have
# recorded why; the failing ranks have seen every acknowledgement; how many stopped ranks have left
KEY, FAILED, ACK, DONE, LEFT = (f"train_llm/failure_{name}" for name in ("cause", "count", "ack", "done", "left"))


def _default_store():
    try:
        from torch.distributed.distributed_c10d import _get_default_store
        return _get_default_store()
    except Exception:  # no process group, or a torch without it: no watcher
        return None


class FailureWatch:
    def __init__(self, rank: int, world_size: int, on_peer_failure, poll_s: float = 0.2, grace_s: float = 10.0):
        """on_peer_failure(cause): called once, on the rank that stops because another one failed."""
        self.rank, self.world_size, self.on_peer_failure = rank, world_size, on_peer_failure
        self.poll_s, self.grace_s = poll_s, grace_s
        self.store = _default_store() if world_size > 1 and dist.is_initialized() else None
        self._stop = threading.Event()
        self._stopping = threading.Lock()  # the watcher and the main thread may both find the cause
        self._failing = False
        self._thread = None

    def start(self) -> "FailureWatch":
        if self.store is not None:
            self._thread = threading.Thread(target=self._watch, name="train_llm-failure-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """The run ended normally: stop watching (before the final barrier)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self):
        while not self._stop.wait(self.poll_s):
            try:
                failed = self.store.check([KEY])
                cause = self.store.get(KEY).decode() if failed else None
            except Exception as error:
                if self._stop.is_set():
                    return
                cause = f"lost the job's store ({type(error).__name__}): the rank hosting it has died"
            if cause and not self._failing and not self._stop.is_set():
                self.stop_for_peer(cause)

    def peer_failure(self) -> str | None:
        """The cause another rank announced, if any: asked when this rank's own collective failed."""
        if self.store is None:
            return None
        try:
            return self.store.get(KEY).decode() if self.store.check([KEY]) else None
        except Exception:
            return None

    def stop_for_peer(self, cause: str) -> None:
        """Record another rank's failure as the reason this rank stops, acknowledge, exit now."""
        if not self._stopping.acquire(blocking=False):  # the other thread is already on it
            threading.Event().wait()  # until its os._exit ends the process
        try:
            self.on_peer_failure(cause)
        finally:
            try:
                self.store.add(ACK, 1)
                # this rank may host the store (rank 0 outside torchrun): leave only once the failing
                # rank has seen every acknowledgement, so that it never talks to a store that is gone
                _wait_until(lambda: self.store.check([DONE]), self.grace_s + 2.0)
                self.store.add(LEFT, 1)
            except Exception:
                pass
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_PEER_FAILED)

    def announce(self, cause: str) -> None:
        """This rank failed: tell the others, abort its communicators, wait (at most grace_s) until
        every rank has acknowledged."""
        self._failing = True
        if self.store is None:
            return
        try:
            self.store.compare_set(KEY, "", f"rank {self.rank} {cause}")  # the first cause wins
            _abort_nccl()
            self.store.add(FAILED, 1)
            self.store.add(ACK, 1)
            _wait_until(lambda: self.store.add(ACK, 0) >= self.world_size, self.grace_s)
            self.store.set(DONE, "1")
            if self.rank == 0:  # it may host the store: stay until the others have stopped using it
                _wait_until(lambda: self.store.add(LEFT, 0) >= self.world_size - self.store.add(FAILED, 0), 2.0)
        except Exception:  # the store is gone (its host died): nobody left to tell
            pass


def _wait_until(condition, timeout_s: float, poll_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(poll_s)


def _abort_nccl():
    """Abort NCCL communicators so no kernel waits for a peer that will never come (NCCL only)."""
    try:
        backend = str(dist.get_backend())
    except Exception:
        return
    if "nccl" not in backend:
        return
    try:
        from torch.distributed.distributed_c10d import _abort_process_group
        _abort_process_group()
    except Exception as error:
        print(f"[train_llm] could not abort the NCCL communicators: {error}", file=sys.stderr, flush=True)


# What an allocation refused by the host says: PyTorch's CPU allocator under a memory limit (the local
# backend's RLIMIT_DATA), a C++ allocation in a library (gloo), Python's own MemoryError.
HOST_OUT_OF_MEMORY = ("can't allocate memory", "Cannot allocate memory", "std::bad_alloc")


def is_out_of_memory(error: BaseException) -> bool:
    """A GPU out-of-memory error, or the host refusing an allocation (the job's memory limit)."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(sign in str(error) for sign in HOST_OUT_OF_MEMORY)


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown, once the run is recorded and flushed.

    Why not return from main(): on gloo, each process group has worker threads (ProcessGroupGloo::runLoop)
    that destroy a finished collective's work object after the caller has seen it complete. Destroying it
    drops the last reference to its tensors; a tensor that has a Python object needs the GIL for that. If
    Python is finalising by then, the thread that asks for the GIL is made to exit (PyThread_exit_thread,
    a forced unwind) from inside that noexcept destructor: std::terminate, "terminate called without an
    active exception", SIGABRT, after a run that had completed. Seen in a core dump of rank 0 (the gloo
    thread in ~AsyncBroadcastWork -> decref -> take_gil -> pthread_exit, the main thread in Python's
    final garbage collection); 3 runs in 22 of a 20-line DDP + ZeroRedundancyOptimizer script that calls
    destroy_process_group() and returns, 1 in 12 of train_llm.py --mode fsdp returning from main() (issue
    12 saw 2 in 9). os._exit ends the process without finalising Python: no thread is made to exit, the
    kernel reclaims threads and sockets, the exit code is ours."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
