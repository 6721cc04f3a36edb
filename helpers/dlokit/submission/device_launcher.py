"""The local job launcher: wait for the job's devices (dlokit.submission.devices), then run submitit's controller.

    python -m dlokit.submission.device_launcher --need 1 --among cpu --folder F --name alice --mem-mb auto -- python -m submitit.local._local F

Its pid is the job's native id. While it waits, `<pid>_waiting.json` in the job folder says for what;
once started, `<pid>_started.json` says when, on which devices and with how much memory (each task's
script then runs under an RLIMIT_DATA of its share, see dlokit.in_job.task.ScriptTask). What it and the
controller print goes to `<pid>_launcher.log`, never into the notebook cell.

Cancelling (SIGINT or SIGTERM to the launcher, as dlokit.cancel does) writes `<pid>_cancelled.json`
and asks the controller to stop with SIGTERM (which it forwards to every task, and each task to its
script, whose RunRecorder records "cancelled"); whatever is left after GRACE_S is killed.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from dlokit.submission import tree_memory
from dlokit.in_job import jobenv, rank
from dlokit.submission.devices import POLL_S, DeviceQueue, write_json, holders

GRACE_S = 10.0  # after a cancel, how long the tasks get to stop before everything left is killed
FAILED_TASK_GRACE_S = 10.0  # after a task failed, how long the others get to record why they stop
AUTO_MEM_FRACTION = 0.8  # mem = "auto": this share of the memory available when the job starts


def _waiting_note(queue: DeviceQueue, since: float) -> dict:
    busy, me = holders(queue.among, queue.root), pwd.getpwuid(os.getuid()).pw_name  # the note is its owner's to read
    who = ", ".join(f"{d} ({'your' if n.get('user') == me else n.get('user', 'a user') + chr(39) + 's'} job "
                    f"{n.get('name')}, pid {n.get('pid')})" for d, n in busy.items())
    reason = f"waiting for {queue.need} free device(s) among {', '.join(queue.among)}"
    return {"since": since, "reason": reason + (f": in use by {who}" if who else ": earlier jobs go first")}


def _gpu_ids(devices: list[str]) -> str:
    return ",".join(d[3:] for d in devices if d.startswith("gpu"))


def _available_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _memory_limit_mb(wanted: str, queue: DeviceQueue) -> int:
    """The job's memory limit in MB (0: none). "auto": 80 % of the memory available now, shared between
    this job's devices and the devices no job holds yet (each may start a job of its own)."""
    if wanted != "auto":
        return int(wanted or 0)
    busy = holders(queue.among, queue.root)
    free = [d for d in queue.among if d not in busy and d not in queue.held]
    share = len(queue.held) / max(1, len(queue.held) + len(free))
    return int(_available_mb() * AUTO_MEM_FRACTION * share)


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m dlokit.submission.device_launcher", description=__doc__.split("\n")[0])
    parser.add_argument("--need", type=int, required=True, help="how many devices the job needs")
    parser.add_argument("--among", required=True, help="comma-separated devices: cpu, or gpu0,gpu1,...")
    parser.add_argument("--folder", type=Path, required=True, help="the job's log folder")
    parser.add_argument("--name", default="job")
    parser.add_argument("--mem-mb", default="0", help="the job's memory limit in MB, 'auto' or 0 (none)")
    parser.add_argument("--submitted-ns", type=int, default=None, help="when the job was submitted (time.time_ns): "
                        "its place in the queue")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return args


def _wait_for_devices(queue: DeviceQueue, waiting: Path) -> float:
    """Poll until the queue's turn comes and its devices are free; the waiting note says why meanwhile."""
    submitted = time.time()
    write_json(waiting, _waiting_note(queue, submitted))
    last_note = time.time()
    while not queue.try_acquire():
        time.sleep(POLL_S)
        if time.time() - last_note > 2:
            write_json(waiting, _waiting_note(queue, submitted))
            last_note = time.time()
    return time.time() - submitted


def _failed_task(folder: Path, pid: int) -> tuple[int, int] | None:
    """(task, exit code) of a task of this job that has ended with an error, else None (each task writes
    `<pid>_<task>_usage.json` as it ends, see dlokit.in_job.task.ScriptTask)."""
    for path in folder.glob(f"{pid}_*_usage.json"):
        try:
            usage = json.loads(path.read_text())
            task, code = int(path.name.split("_")[1]), usage.get("returncode")
        except (OSError, ValueError, IndexError, AttributeError):
            continue
        # a checkpoint on a signal (EXIT_REQUEUE, every rank leaves with it) is no failure
        if isinstance(code, int) and code not in (0, jobenv.EXIT_REQUEUE) and not usage.get("cancelled"):
            return task, code
    return None


def _run_to_the_end(child: subprocess.Popen, stop_by: list[float], name: str, folder: Path, mem_mb: int = 0) -> int:
    """Wait for the controller; after a cancel, kill what is still running past the grace period. Once a task
    has failed, the others get FAILED_TASK_GRACE_S to record why they stop, then whatever is left is killed, as
    `srun --kill-on-bad-exit` does: a rank that waits for a failed one, or a rank stuck where it cannot reach
    the next collective, would otherwise hold the job (and the machine) until its time limit."""
    failed_since, killed = None, False
    while True:
        try:
            code = child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            if killed:
                continue
            if stop_by and time.time() > stop_by[0]:
                print(f"{time.strftime('%H:%M:%S')} job {name}: tasks still running {GRACE_S:.0f} s after "
                      "the cancel: killed", flush=True)
                _kill_group(child.pid)
                killed = True
                continue
            exceeded = None if stop_by else tree_memory.over_limit(child.pid, mem_mb)
            if exceeded:
                print(f"{time.strftime('%H:%M:%S')} job {name}: its processes hold {exceeded['peak_mb']:.0f} MB together "
                      f"({exceeded['processes']} processes), over its limit of {mem_mb} MB: killed", flush=True)
                write_json(folder / f"{os.getpid()}_memory_exceeded.json", {**exceeded, "killed_at": time.time()})
                _kill_group(child.pid)
                killed = True
                continue
            failed = None if stop_by else _failed_task(folder, os.getpid())
            if failed and failed_since is None:
                failed_since = time.time()
            elif failed and time.time() - failed_since > FAILED_TASK_GRACE_S:
                task, exit_code = failed
                print(f"{time.strftime('%H:%M:%S')} job {name}: task {task} failed (exit code {exit_code}); the "
                      f"tasks still running {FAILED_TASK_GRACE_S:.0f} s later were killed", flush=True)
                write_json(folder / f"{os.getpid()}_stopped_tasks.json",
                           {"failed_task": task, "exit_code": exit_code, "killed_at": time.time()})
                _abort_scripts(child.pid)
                _kill_group(child.pid)
                killed = True
        except InterruptedError:
            continue
    if stop_by:
        _kill_group(child.pid)  # a script's own children left behind by a cancel
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    command = args.command
    pid = os.getpid()
    # what this launcher and the controller print goes to a file, never into the notebook cell
    log = open(args.folder / f"{pid}_launcher.log", "ab", buffering=0)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)

    waiting = args.folder / f"{pid}_waiting.json"
    queue = DeviceQueue(args.need, [d for d in args.among.split(",") if d], args.name,
                        submitted_ns=args.submitted_ns)
    child: list[subprocess.Popen] = []
    stop_by: list[float] = []  # when a cancelled job's leftovers get killed

    def on_signal(signum, _frame):
        if signum in (signal.SIGINT, signal.SIGTERM):
            write_json(args.folder / f"{pid}_cancelled.json",
                       {"cancelled_at": time.time(), "signal": signal.Signals(signum).name})
        if not child:  # still waiting: nothing started, nothing to stop
            queue.leave()
            waiting.unlink(missing_ok=True)
            os._exit(128 + signum)
        if signum in (signal.SIGINT, signal.SIGTERM):
            # SIGTERM, never SIGINT: the controller forwards it to the tasks and raises no KeyboardInterrupt
            if not stop_by:
                stop_by.append(time.time() + GRACE_S)
                print(f"{time.strftime('%H:%M:%S')} job {args.name}: cancelled, stopping its tasks", flush=True)
            child[0].send_signal(signal.SIGTERM)
        else:
            child[0].send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, on_signal)

    waited = _wait_for_devices(queue, waiting)
    env = {**os.environ, jobenv.DEVICES: ",".join(queue.held), jobenv.LOCK_WAITED_S: f"{waited:.3f}",
           # the controller names its task logs after its parent (this launcher), as under a shell
           "SUBMITIT_LOCAL_WITH_SHELL": "1",
           # checked free now (submitit would draw one at random, often in the ephemeral range, taken)
           "MASTER_PORT": str(rank.free_port(rank.port_from_job_id(str(pid))))}
    if any(d.startswith("gpu") for d in queue.held):
        env["CUDA_VISIBLE_DEVICES"] = _gpu_ids(queue.held)  # each task then keeps its own (ScriptTask)
    mem_mb = _memory_limit_mb(args.mem_mb, queue)
    write_json(args.folder / f"{pid}_started.json",
               {"started_at": time.time(), "devices": queue.held, "waited_s": round(waited, 3),
                "mem_limit_mb": mem_mb or None, "mem_auto": args.mem_mb == "auto"})
    waiting.unlink(missing_ok=True)
    memory = f"{mem_mb} MB{' (auto)' if args.mem_mb == 'auto' else ''}" if mem_mb else "no limit"
    print(f"{time.strftime('%H:%M:%S')} job {args.name}: got {', '.join(queue.held)} after {waited:.1f} s; "
          f"memory: {memory}", flush=True)
    # its own process group: a cancel can kill whatever the tasks leave behind, and nothing else
    child.append(subprocess.Popen(command, env=env, start_new_session=True))
    code = _run_to_the_end(child[0], stop_by, args.name, args.folder, mem_mb)
    queue.release()
    return code


def _abort_scripts(controller: int) -> None:
    """SIGABRT to the scripts the tasks run (and their own children, DataLoader workers): their faulthandler
    prints where each thread was to the job's log, the evidence of why they were stuck. The tasks themselves
    are spared for a moment: they relay what the scripts print."""
    scripts = tree_memory.scripts_of(controller)
    for process in scripts:
        try:
            process.send_signal(signal.SIGABRT)
        except psutil.Error:
            pass
    psutil.wait_procs(scripts, timeout=3)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(main())
