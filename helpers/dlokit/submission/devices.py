"""Measurements run alone: on the local backend a job waits until the devices it needs are free.

A device is one local GPU or, on a machine without GPUs, one core standing for one (up to 8): a job that
measures speed takes every core (the whole CPU, so two measurements never share it), a job that measures
accuracy only (`alone=False`) takes one core per task and may run beside another. Each device is a lock file
(the `filelock` library: an OS-level flock, which the kernel drops when its holder exits, crashed or
killed, so a lock can never go stale). Every local job is started through the launcher (dlokit.submission.device_launcher):

    python -m dlokit.submission.device_launcher --need 1 --among gpu0,gpu1 --folder F -- python -m submitit.local._local F

It queues (first come, first served among jobs that want the same devices), takes the
locks, points CUDA_VISIBLE_DEVICES at the GPUs it got, and runs submitit's job controller as its
child, forwarding signals to it. Its pid is the job's native id; while it waits, a
`<pid>_waiting.json` file in the job folder says for what, which the queue and `job_outcome` show as
PENDING. Cancelling a waiting job ends the launcher before anything started.
"""
from __future__ import annotations

import contextlib
import getpass
import json
import os
import time
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

from ..in_job import jobenv, untrusted

POLL_S = 0.25


def lock_dir() -> Path:
    """Shared by every user and profile of this machine: two measurements on one machine never overlap."""
    path = Path(os.environ.get(jobenv.LOCK_DIR) or "/tmp/dlokit-locks")
    (path / "queue").mkdir(parents=True, exist_ok=True)
    for folder in (path, path / "queue"):
        try:
            folder.chmod(0o1777)
        except PermissionError:  # created by another user, who already opened it up
            pass
    return path


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


MAX_CPU_DEVICES = 8  # as Profile.node_gpus: at most 8 CPU processes stand for 8 GPUs


def machine_devices() -> list[str]:
    """The lockable devices of this machine, as the notebook process sees them: its GPUs, else its cores."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return [f"gpu{v.strip()}" for v in visible.split(",") if v.strip()]
    import torch

    count = torch.cuda.device_count()
    if count:
        return [f"gpu{k}" for k in range(count)]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return [f"cpu{k}" for k in range(max(1, min(cores, MAX_CPU_DEVICES)))]


def devices_needed(among: list[str], tasks: int, alone: bool) -> int:
    """How many of `among` a job takes: its GPUs (one per task); on the CPU, every core when it measures speed
    (the whole CPU), one core per task when it only shares the machine."""
    if among and among[0].startswith("gpu"):
        return tasks
    return len(among) if alone else min(tasks, len(among))


def _started(pid: int) -> float | None:
    """When process `pid` started (None if there is none): with the pid, it names one process, never a later
    one that reused the pid."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(pid: int, started: float | None = None) -> bool:
    """Process `pid` runs (and, when `started` is given, is the one that started then)."""
    try:
        process = psutil.Process(pid)
        if started is not None and abs(process.create_time() - started) > 0.01:
            return False  # the pid was reused: the process that wrote the note has ended
        # an exited child its parent has not reaped yet is a zombie: it holds nothing
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _note_alive(note: dict) -> bool:
    return bool(note.get("pid")) and _alive(int(note["pid"]), note.get("started"))


def _read_json(path: Path) -> dict:
    """A note in the shared lock folder: a holder's note must be the user's its name says (`<device>.holder.<uid>`);
    anything else there (a FIFO, a link, another's file) reads as no note."""
    owner = path.name.split(".holder.")[-1].split(".")[0] if ".holder." in path.name else ""
    try:
        value = untrusted.read_json(path, owners={int(owner)} if owner.isdigit() else untrusted.FOLDER_OWNER)
    except OSError:
        return {}
    return value if isinstance(value, dict) else {}


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _holder_note(root: Path, device: str) -> Path:
    """Each user's note of the device they hold: in the shared, sticky lock folder a user can replace only
    their own files, so one note per device would be the first user's forever."""
    return root / f"{device}.holder.{os.getuid()}.json"


def holders(devices: list[str], root: Path | None = None) -> dict[str, dict]:
    """Who holds each of these devices now (pid, job name, user, since), from the holders' own notes."""
    root = root or lock_dir()
    found = {}
    for device in devices:
        for path in sorted(root.glob(f"{device}.holder.*.json")):
            note = _read_json(path)
            if _note_alive(note):
                found[device] = note
    return found


class DeviceQueue:
    """One waiting job: its ticket in the queue, and the locks it takes once its turn has come."""

    def __init__(self, need: int, among: list[str], name: str, root: Path | None = None,
                 submitted_ns: int | None = None):
        if need > len(among):
            raise ValueError(f"{need} device(s) needed but this machine has {len(among)}: {', '.join(among)}")
        self.need, self.among, self.name = need, among, name
        self.root = root or lock_dir()
        # the queue's order is the order of submission, not of how fast each launcher happened to start
        self.ticket = self.root / "queue" / f"{submitted_ns or time.time_ns():020d}-{os.getpid()}.json"
        self.me = {"pid": os.getpid(), "started": _started(os.getpid()), "name": name, "user": _user()}
        write_json(self.ticket, {**self.me, "among": among})
        self.locks: list[FileLock] = []
        self.held: list[str] = []

    def _my_turn(self) -> bool:
        """No older live ticket wants any of my devices (dead tickets are cleaned up)."""
        for ticket in sorted((self.root / "queue").glob("*.json")):
            if ticket.name >= self.ticket.name:
                return True
            note = _read_json(ticket)
            if not _note_alive(note):
                with contextlib.suppress(OSError):  # another user's ticket stays: only they may remove it
                    ticket.unlink(missing_ok=True)
            elif set(note.get("among", [])) & set(self.among):
                return False
        return True

    def try_acquire(self) -> bool:
        """Take `need` free devices, all or none (holding some while waiting could deadlock two jobs)."""
        if not self._my_turn():
            return False
        for device in self.among:
            lock = FileLock(self.root / f"{device}.lock", mode=0o666)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            self.locks.append(lock)
            self.held.append(device)
            if len(self.held) == self.need:
                break
        if len(self.held) < self.need:
            self.release()
            return False
        for device in self.held:
            write_json(_holder_note(self.root, device), {**self.me, "since": time.time()})
        self.ticket.unlink(missing_ok=True)
        return True

    def release(self) -> None:
        for lock in self.locks:
            lock.release()
        self.locks, self.held = [], []

    def leave(self) -> None:
        self.ticket.unlink(missing_ok=True)
        self.release()


# ---- a waiting job's reason, in a few words (the live queue) ----------------------------------------------------

def asked_for(need: int, among: list[str]) -> str:
    """What a job waits for, in the unit it was submitted in: its GPUs; on a machine without GPUs the whole CPU
    (a measurement takes every core) or its cores (alone=False: one per task)."""
    if among and among[0].startswith("gpu"):
        return f"{need} GPU" + ("s" if need > 1 else "")
    if need >= len(among):
        return "the CPU"
    return f"{need} core" + ("s" if need > 1 else "")


def pending_reason(need: int, among: list[str], held_by: dict[str, str]) -> str:
    """"waits for the CPU: your job 1128-…-d3b7 holds it". `held_by`: {device: who holds it, in words}."""
    what = asked_for(need, among)
    if not held_by:
        return f"waits for {what}: earlier jobs go first"
    who = list(dict.fromkeys(held_by.values()))
    if what == "the CPU":
        return f"waits for the CPU: {' and '.join(who)} {'holds' if len(who) == 1 else 'hold'} it"
    return f"waits for {what}: " + "; ".join(
        f"{holder} holds {', '.join(d for d, h in held_by.items() if h == holder)}" for holder in who)
