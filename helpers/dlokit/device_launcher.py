"""The local job launcher: wait for the job's devices (dlokit.devices), then run submitit's controller.

    python -m dlokit.device_launcher --need 1 --among cpu --folder F --name alice -- python -m submitit.local._local F

Its pid is the job's native id. While it waits, `<pid>_waiting.json` in the job folder says for what;
once started, `<pid>_started.json` says when and on which devices. What it and the controller print
goes to `<pid>_launcher.log`, never into the notebook cell.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dlokit import jobenv
from dlokit.devices import POLL_S, DeviceQueue, write_json, holders


def _waiting_note(queue: DeviceQueue, since: float) -> dict:
    busy = holders(queue.among, queue.root)
    who = ", ".join(f"{d} (job {n.get('name')}, pid {n.get('pid')})" for d, n in busy.items())
    reason = f"waiting for {queue.need} free device(s) among {', '.join(queue.among)}"
    return {"since": since, "reason": reason + (f": in use by {who}" if who else ": earlier jobs go first")}


def _gpu_ids(devices: list[str]) -> str:
    return ",".join(d[3:] for d in devices if d.startswith("gpu"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlokit.device_launcher", description=__doc__.split("\n")[0])
    parser.add_argument("--need", type=int, required=True, help="how many devices the job needs")
    parser.add_argument("--among", required=True, help="comma-separated devices: cpu, or gpu0,gpu1,...")
    parser.add_argument("--folder", type=Path, required=True, help="the job's log folder")
    parser.add_argument("--name", default="job")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    pid = os.getpid()
    # what this launcher and the controller print goes to a file, never into the notebook cell
    log = open(args.folder / f"{pid}_launcher.log", "ab", buffering=0)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)

    waiting = args.folder / f"{pid}_waiting.json"
    queue = DeviceQueue(args.need, [d for d in args.among.split(",") if d], args.name)
    child: list[subprocess.Popen] = []

    def on_signal(signum, _frame):
        if child:
            child[0].send_signal(signum)
        else:  # still waiting: nothing started, nothing to stop
            queue.leave()
            waiting.unlink(missing_ok=True)
            os._exit(128 + signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, on_signal)

    submitted = time.time()
    write_json(waiting, _waiting_note(queue, submitted))
    last_note = time.time()
    while not queue.try_acquire():
        time.sleep(POLL_S)
        if time.time() - last_note > 2:
            write_json(waiting, _waiting_note(queue, submitted))
            last_note = time.time()
    waited = time.time() - submitted
    env = {**os.environ, jobenv.DEVICES: ",".join(queue.held), jobenv.LOCK_WAITED_S: f"{waited:.3f}",
           # the controller names its task logs after its parent (this launcher), as under a shell
           "SUBMITIT_LOCAL_WITH_SHELL": "1"}
    if any(d.startswith("gpu") for d in queue.held):
        env["CUDA_VISIBLE_DEVICES"] = _gpu_ids(queue.held)
    write_json(args.folder / f"{pid}_started.json",
                {"started_at": time.time(), "devices": queue.held, "waited_s": round(waited, 3)})
    waiting.unlink(missing_ok=True)
    print(f"{time.strftime('%H:%M:%S')} job {args.name}: got {', '.join(queue.held)} after {waited:.1f} s", flush=True)
    child.append(subprocess.Popen(command, env=env))
    while True:
        try:
            code = child[0].wait()
            break
        except InterruptedError:
            continue
    queue.release()
    return code


if __name__ == "__main__":
    sys.exit(main())
