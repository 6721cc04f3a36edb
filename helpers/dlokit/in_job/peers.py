"""One rank stops, every rank stops: the way both training scripts end a multi-rank job early.

A rank that stops early (out of memory, another error, cancelled, or the job found stuck) leaves a note in the
store every rank of the job shares (torchrun's or rank 0's TCPStore). A thread of every other rank (RankWatch)
looks for it each WATCH_EVERY_S and ends that rank at once, recording the cause: otherwise it would wait in its
next collective (a DDP all-reduce, an FSDP all-gather) until the backend's timeout, and under srun nothing
would kill it. The same thread publishes a heartbeat, so that a frozen rank (no Python running: a deadlock in C
code) or a job where no rank gets any further is named instead of hanging until the time limit.

The rank being watched is any object with `rank`, `world_size`, `progress`, `where`, `first_step_done`,
`stop_for(note, exit_process=True)` and `stuck(reason)`: the classifier's Instrument, train_llm.py's Peers.
The exit codes are dlokit.in_job.jobenv's.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch.distributed as dist

WATCH_EVERY_S = 1.0      # how often a rank looks for another rank's stop note in the process group's store
ACK_WAIT_S = 5.0         # how long a failing rank waits for the others to read its note before it exits
LEAVE_GRACE_S = 1.0      # then the others give its process that long to end before they exit too
FROZEN_S = 15.0          # another rank whose watch thread has not written for this long: its process is frozen
STALL_S = 90.0           # no rank got a step further for this long (first step done): the job is stuck
# What an allocation refused by the host says: PyTorch's CPU allocator under a memory limit (the local
# backend's RLIMIT_DATA), a C++ allocation in a library (gloo), Python's own MemoryError.
HOST_OUT_OF_MEMORY = ("can't allocate memory", "Cannot allocate memory", "std::bad_alloc")


def is_out_of_memory(error: BaseException) -> bool:
    """A GPU out-of-memory error, or the host refusing an allocation (the job's memory limit)."""
    import torch

    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(sign in str(error) for sign in HOST_OUT_OF_MEMORY)


def stop_key() -> str:  # a torchrun restart starts with no note
    return f"dlokit/stop/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def job_store():
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def wait_for_every_rank(what: str, timeout_s: float) -> None:
    """Leave only once every rank got here (at most timeout_s): torchrun and srun stop the other ranks as soon as
    one exits with an error code, and 75 is one, so a rank leaving first would kill rank 0 while it still writes
    the checkpoint and the records."""
    store = job_store()
    if store is None:
        return
    key = f"{stop_key()}/{what}"
    try:
        store.add(key, 1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and store.add(key, 0) < dist.get_world_size():
            time.sleep(0.05)
    except Exception:  # the store is gone: the rank that held it has left, so every rank got here
        pass


def tell_other_ranks(store, note: dict, *, wait_for: int) -> None:
    """Leave the note, then wait (at most ACK_WAIT_S) until `wait_for` ranks, this one included, are done with
    notes: the store may live in this very process (rank 0 without torchrun) and must outlive their reading.
    Ranks that fail together (every rank out of memory at the same step) count each other as done."""
    if store is None:
        return
    try:
        store.set(stop_key(), json.dumps(note))
        store.add(stop_key() + "/read", 1)
        deadline = time.monotonic() + ACK_WAIT_S
        while wait_for and time.monotonic() < deadline and store.add(stop_key() + "/read", 0) < wait_for:
            time.sleep(0.05)
    except Exception:  # the store is gone (rank 0 already ended): nobody left to tell
        pass


def say_leaving(store) -> None:
    try:
        if store is not None:
            store.set(stop_key() + "/left", "1")
    except Exception:
        pass


def read_stop_note() -> dict | None:
    store = job_store()
    try:
        if store is None or not store.check([stop_key()]):
            return None
        return json.loads(store.get(stop_key()))
    except Exception:
        return None


def acknowledge_stop_note(note: dict) -> None:
    """Tell the noting rank that this one has read its note; when it says it leaves, let it leave first (up
    to ACK_WAIT_S): a launcher reports the first rank to exit as the root cause."""
    store = job_store()
    try:
        if store is None:
            return
        store.add(stop_key() + "/read", 1)
        deadline = time.monotonic() + ACK_WAIT_S
        while note.get("leaves") and time.monotonic() < deadline and not store.check([stop_key() + "/left"]):
            time.sleep(0.05)
        if note.get("leaves"):
            time.sleep(LEAVE_GRACE_S)
    except Exception:  # the store is gone with the noting rank: it has left
        pass


class RankWatch:
    """The thread that keeps an eye on the other ranks through the process group's store, every WATCH_EVERY_S:

    * another rank's stop note (it ran out of memory, was cancelled): this rank records it and leaves;
    * this rank's heartbeat (a counter) and its main thread's progress (Instrument.tick), for the others;
    * a rank whose heartbeat has not moved for FROZEN_S is frozen (its process no longer runs Python: a
      deadlock, a stopped process): named, and every rank leaves instead of waiting in a collective until the
      backend's timeout (300 s for gloo) and then the job's time limit;
    * once the first step is done, no rank's main thread getting anywhere for STALL_S (they all wait: one
      where it cannot reach the collective the others wait in) is a stuck job: named the same way.
    Counters, not clocks, are compared: two nodes' clocks may disagree by seconds."""

    def __init__(self, ins):
        self.ins = ins
        self._quit = threading.Event()
        self._beat = 0
        now = time.monotonic()
        # rank -> [beat, progress, where, when its beat last moved, when its progress last moved] (this clock)
        self._seen = {rank: [None, None, "its start", now, now] for rank in range(ins.world_size) if rank != ins.rank}
        self._own = [ins.progress, now]
        self._thread = threading.Thread(target=self._run, name="dlokit-rank-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._publish(job_store())
        except Exception:
            pass
        while not self._quit.wait(WATCH_EVERY_S):
            store = job_store()
            try:
                if store is None:
                    continue
                if store.check([stop_key()]):
                    note = json.loads(store.get(stop_key()))
                    if note.get("rank") != self.ins.rank and not self._quit.is_set():
                        self.ins.stop_for(note, exit_process=True)
                    return
                self._publish(store)
                reason = self._stuck(store)
            except Exception:
                return  # the store is gone: the job is ending anyway
            if reason and not self._quit.is_set():
                self.ins.stuck(reason)
                return

    def _publish(self, store) -> None:
        if store is None:
            return
        self._beat += 1
        store.set(f"{_watch_key()}/{self.ins.rank}", json.dumps(
            {"beat": self._beat, "progress": self.ins.progress, "where": self.ins.where}))

    def _stuck(self, store) -> str | None:
        """Why the job cannot go on, or None."""
        now = time.monotonic()
        if self.ins.progress != self._own[0]:
            self._own = [self.ins.progress, now]
        frozen, idle = [], [now - self._own[1]]
        for rank, seen in self._seen.items():
            key = f"{_watch_key()}/{rank}"
            if store.check([key]):
                peer = json.loads(store.get(key))
                if peer["beat"] != seen[0]:
                    seen[0], seen[3] = peer["beat"], now
                if peer["progress"] != seen[1]:
                    seen[1], seen[4] = peer["progress"], now
                seen[2] = peer["where"]
            if now - seen[3] > FROZEN_S:
                frozen.append(f"rank {rank} has not answered for {now - seen[3]:.0f} s (its process is frozen; "
                              f"its last word: {seen[2]})")
            idle.append(now - seen[4])
        if frozen:
            return "; ".join(frozen)
        peers = sorted(self._seen)
        if self.ins.first_step_done and min(idle) > STALL_S:
            where = "; ".join([f"rank {self.ins.rank} in {self.ins.where}"] +
                              [f"rank {r} in {self._seen[r][2]}" for r in peers])
            return f"no rank got any further for {min(idle):.0f} s ({where})"
        return None

    def stop(self, wait: bool = True) -> None:
        self._quit.set()
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * WATCH_EVERY_S)


def _watch_key() -> str:
    return f"dlokit/watch/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def leave_now(code: int) -> None:
    """End the process with `code` once its records are written, skipping the interpreter's teardown.

    Why not return from main(): on gloo, each process group has worker threads (ProcessGroupGloo::runLoop)
    that destroy a finished collective's work object after the caller has seen it complete, dropping the last
    reference to its tensors, which needs the GIL. If Python is finalising by then, that thread is made to exit
    from inside a noexcept destructor: std::terminate, "terminate called without an active exception", SIGABRT,
    after a run that had completed (seen in a core dump of rank 0: 3 runs in 22 of a 20-line DDP +
    ZeroRedundancyOptimizer script, 1 in 12 of train_llm.py --mode fsdp). The same after an aborted process
    group. os._exit ends the process without finalising Python; the DataLoader's workers are ended first."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        end_data_workers()
    finally:
        os._exit(code)


def end_data_workers() -> None:
    """Kill the DataLoader's worker processes and their forkserver (image_data.worker_start). One left behind keeps
    the process's stdout, stderr and open sockets (the process group's store): the job would not end while it
    lives. Other children are left alone: a tracker's service finishes its own records."""
    import multiprocessing

    import psutil

    doomed = []
    for child in psutil.Process().children():
        try:
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                doomed += [child, *child.children(recursive=True)]
        except psutil.Error:
            pass
    doomed += multiprocessing.active_children()  # workers forked by the rank itself
    for process in doomed:
        try:
            process.kill()
        except (psutil.Error, OSError, ValueError):  # ended already
            pass


def abort_process_group(device) -> None:
    """Leave the process group without waiting for the other ranks (NCCL: abort its communicators)."""
    if not dist.is_initialized():
        return
    try:
        if getattr(device, "type", "cpu") == "cuda":
            dist.distributed_c10d._abort_process_group()
        else:
            dist.destroy_process_group()
    except Exception:
        pass



class Peers:
    """This rank among the others: what RankWatch watches and how this rank ends early. train_llm.py uses it
    as it is, with a `record(status, reason)` that finishes its run record; the classifier's Instrument is one
    (it records more: the steps done, memory, energy).

        peers = Peers(rank, world_size, device, record=..., script="train_llm.py").start_watching()
        peers.tick("step 3")                      # the main thread got somewhere: the others see it
        leave_now(peers.failed("ran out of memory: ...", oom=True))   # this rank failed, its record written
        code = peers.peer_stop_code()             # this rank's collective failed: did another rank stop first?
        peers.stop_watching()                     # the normal end, before the final barrier
    """

    def __init__(self, rank: int, world_size: int, device, *, record=None, script: str = "train"):
        self.rank, self.world_size, self.device, self.script = rank, world_size, device, script
        self.record_stop = record  # record(status, reason): finishes this rank's run record with that cause
        self.progress, self.where, self.first_step_done = 0, "setting up", False  # what the watch thread publishes
        # one way out only (reentrant: a signal handler runs in the main thread, maybe while it holds the lock)
        self._ending = threading.RLock()
        self._ended = False
        self._watch = None

    def start_watching(self) -> "Peers":
        if dist.is_initialized() and self.world_size > 1:
            self._watch = RankWatch(self)
        return self

    def stop_watching(self, wait: bool = True) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop(wait)

    def tick(self, where: str) -> None:
        """The main thread got somewhere (a step, a validation batch, a collective): the other ranks' watch
        threads see it, so that a rank stuck where it cannot reach the next collective is named, not waited for."""
        self.progress += 1
        self.where = where

    # ---- how this rank ends early; the records are the subclass's (or `record`'s) ----------------------

    def failed(self, reason: str, *, oom: bool = False) -> int:
        """This rank failed (its record is written): tell the others, leave the process group, and return the
        exit code (out of memory, or failed) for leave_now."""
        from .jobenv import EXIT_FAILED, EXIT_OUT_OF_MEMORY

        self._claim_end()
        self.stop_watching()
        store = job_store()  # kept: the process group (and its store handle) is gone once aborted
        tell_other_ranks(store, {"rank": self.rank, "status": "failed", "oom": oom, "leaves": True,
                                 "reason": reason}, wait_for=self.world_size)
        abort_process_group(self.device)
        say_leaving(store)  # the others exit after this rank: the launcher names it as the first failure
        return EXIT_OUT_OF_MEMORY if oom else EXIT_FAILED

    def cancelled(self, signum: int) -> None:
        """This rank was cancelled (its record is written): tell the others, who exit with the same code."""
        import signal

        self.stop_watching(wait=False)
        tell_other_ranks(job_store(), {"rank": self.rank, "status": "cancelled", "exit_code": 128 + signum,
                                       "reason": f"was cancelled ({signal.Signals(signum).name})"}, wait_for=0)

    def peer_stop_code(self) -> int | None:
        """This rank's collective failed: when another rank left a stop note, its cause recorded here and the exit
        code; None when no other rank stopped first (the failure is this rank's own)."""
        note = read_stop_note()
        if note is None or note.get("rank") == self.rank:
            return None
        return self.stop_for(note, exit_process=False)

    def stop_for(self, note: dict, *, exit_process: bool) -> int:
        """Another rank stopped early (its note): finish this rank's record with that cause. exit_process: called
        by the watching thread while the main thread may wait forever in a collective: exit the process."""
        from .jobenv import EXIT_PEER_FAILED

        code = note.get("exit_code", EXIT_PEER_FAILED)
        step = self.stopped_at()
        where = f" at step {step}" if step is not None else ""
        reason = f"rank {note.get('rank')} {note.get('reason', 'stopped')}; rank {self.rank} stopped{where}"
        if self._claim_end():
            print(f"{self.script}: rank {self.rank}: {reason}", file=sys.stderr, flush=True)
            self.record_stopped(note, reason)
            acknowledge_stop_note(note)
        elif exit_process:
            return code  # the main thread is already ending this rank its own way
        if exit_process:
            leave_now(code)
        self.stop_watching(wait=False)
        abort_process_group(self.device)
        return code

    def stuck(self, reason: str) -> None:
        """Called by the watch thread: the job cannot go on (a rank frozen, or no rank getting anywhere while
        they wait for each other). Records the cause, tells the other ranks, and ends this process."""
        import faulthandler

        from .jobenv import EXIT_FAILED

        text = f"the job is stuck: {reason}"
        print(f"{self.script}: rank {self.rank}: where its threads were when it found the job stuck:",
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        print(f"{self.script}: rank {self.rank}: {text}", file=sys.stderr, flush=True)
        if self._claim_end():
            self.record_stuck(reason, text)
        tell_other_ranks(job_store(), {"rank": self.rank, "status": "failed", "leaves": True,
                                       "reason": f"found the job stuck ({reason})"}, wait_for=self.world_size)
        leave_now(EXIT_FAILED)

    def stopped_at(self) -> int | None:
        """The step this rank stopped at, for the cause (None: unknown)."""
        return None

    def record_stopped(self, note: dict, reason: str) -> None:
        self.record_stop("aborted", f"stopped because {reason}")

    def record_stuck(self, reason: str, text: str) -> None:
        self.record_stop("failed", text)

    def _claim_end(self) -> bool:
        """True for the first way out only (the record is finished once)."""
        with self._ending:
            ended, self._ended = self._ended, True
            return not ended
