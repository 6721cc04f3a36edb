"""Run N ranks of a script on this machine as srun does: one process each, with RANK, WORLD_SIZE, LOCAL_RANK and
the master's address in its environment. No torchrun process in between, and each rank forked from a server that has
imported torch already (tests/preloaded.py): the Day 4 tests start some sixty launches. Rank 0's output comes first,
then rank 1's..."""
from __future__ import annotations

import socket
import subprocess
import tempfile
import time

import preloaded

FAILED_RANK_GRACE_S = 15  # once a rank has failed, how long the others may take to end (they record why)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_ranks(command: list[str], nproc: int, env: dict, logs: list[tuple[str, str]]) -> list[subprocess.Popen]:
    """Start `command` on `nproc` ranks, rank r writing to logs[r] (stdout, stderr: one path may serve both)."""
    port = str(free_port())
    return [preloaded.start(command, stdout=out, stderr=err, env={
        **env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}) for r, (out, err) in enumerate(logs)]


def run_ranks(command: list[str], nproc: int, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`command` on `nproc` ranks: returncode 0 when every rank ended with 0, else the first rank's non-zero code;
    a rank still running `FAILED_RANK_GRACE_S` after another failed, or at `timeout`, is killed."""
    with tempfile.TemporaryDirectory() as folder:
        logs = [(f"{folder}/{r}.out", f"{folder}/{r}.err") for r in range(nproc)]
        processes = start_ranks(command, nproc, env, logs)
        deadline, failed_at = time.monotonic() + timeout, None
        while any(p.poll() is None for p in processes):
            now = time.monotonic()
            if failed_at is None and any(p.returncode not in (None, 0) for p in processes):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + FAILED_RANK_GRACE_S):
                for p in processes:
                    if p.poll() is None:
                        p.kill()
                break
            time.sleep(0.05)
        codes = [p.wait() for p in processes]
        texts = [(preloaded.read(out), preloaded.read(err)) for out, err in logs]
    code = next((c for c in codes if c != 0), 0)
    if any(c is not None and c < 0 for c in codes) and time.monotonic() > deadline:
        raise subprocess.TimeoutExpired(command, timeout, output="".join(t[0] for t in texts))
    return subprocess.CompletedProcess(command, code, "".join(t[0] for t in texts), "".join(t[1] for t in texts))


def run_warm(command: list[str], env: dict, timeout: float, ranks: int = 1, cwd=None) -> subprocess.CompletedProcess:
    """`command` started warm: one process (in `cwd`), or `ranks` of them as srun starts them (run_ranks)."""
    if ranks > 1:
        return run_ranks(command, ranks, env, timeout)
    return preloaded.run(command, env=env, cwd=cwd, timeout=timeout)
