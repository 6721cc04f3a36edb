"""Start `python script.py args` as the kit's local tasks start their scripts: through dlokit.in_job.warm_start,
forked from this user's warm-start server, which has imported torch and torchvision already.

Why: those imports cost 7-8 s of a core in every fresh process, and the tests that start scripts themselves start
some three hundred; on CI's two cores the suite is CPU-bound. The launch paths themselves (a new interpreter under
srun, torchrun or the local launcher) are the notebook, submission and Slurm tests'.

What comes back is a subprocess.Popen of the warm start's client, the script's stand-in: it passes signals on and
ends as the script ends; killing its session (start_new_session) kills the script and what it started.
A command that is not `python [-u] [-B] script.py ...` (torchrun, `python -c`) starts as a plain subprocess.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

from dlokit.in_job import warm_start

_INTERPRETER_FLAGS = {"-u", "-B"}


def script_argv(command: list[str]) -> list[str] | None:
    """[script, args...] when `command` is this interpreter running a script, else None."""
    if not command or os.path.realpath(command[0]) != os.path.realpath(sys.executable):
        return None
    rest = list(command[1:])
    while rest and rest[0] in _INTERPRETER_FLAGS:
        rest.pop(0)
    return rest if rest and rest[0].endswith(".py") else None


def _warm(command: list[str]) -> list[str]:
    argv = script_argv(command)
    return command if argv is None else warm_start.command(sys.executable, argv)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start(command: list[str], env: dict | None = None, cwd=None, stdout: str = os.devnull, stderr: str = os.devnull):
    """Start `command` with its output appended to the files `stdout` and `stderr` (paths)."""
    with open(stdout, "a") as out, open(stderr, "a") as err:
        return subprocess.Popen(_warm(command), env=env, cwd=cwd, stdout=out, stderr=err, start_new_session=True)


def popen(command: list[str], env: dict | None = None, cwd=None, merge_stderr: bool = False):
    """Popen(command, stdout=PIPE, stderr=PIPE or STDOUT, text=True, start_new_session=True), started warm."""
    if script_argv(command) is None:
        raise ValueError(f"preloaded.popen starts `python script.py ...` only, not {command[:2]}: use subprocess.Popen")
    return subprocess.Popen(_warm(command), env=env, cwd=cwd, stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, start_new_session=True)


def run(command: list[str], env: dict | None = None, cwd=None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout), started warm; at the timeout the
    script and everything it started are killed."""
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
        started = start(command, env, cwd, out, err)
        try:
            code = started.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_session(started.pid)
            started.wait()
            raise subprocess.TimeoutExpired(command, timeout, output=read(out), stderr=read(err)) from None
        return subprocess.CompletedProcess(command, code, read(out), read(err))


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as file:
            return file.read()
    except FileNotFoundError:
        return ""
