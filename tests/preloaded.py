"""Start `python script.py args` in a process forked from a server that has already imported torch, torchvision and
torch._dynamo: multiprocessing's forkserver, as the training scripts start their DataLoader workers
(tp_scripts/common/image_data.worker_start).

Why: those three imports cost ~3 s of a core in every process, before the script's first line, and the tests that
start ranks themselves start some three hundred; on CI's two cores the suite was CPU-bound (idle 6-8 %). What stays
fresh in every process: the script, its own modules (tp_scripts/..., dlokit), its environment, working directory,
arguments and sys.path (those of `python script.py`), and its thread count (OMP_NUM_THREADS). The launch paths
themselves (a new interpreter under srun, torchrun or the local launcher) are the notebook, submission and Slurm
tests'.

A command that is not `python [-u] [-B] script.py ...` (torchrun, `python -c`) starts as a plain subprocess.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback

PRELOAD = ["torch", "torchvision", "torch._dynamo"]
_INTERPRETER_FLAGS = {"-u", "-B"}
_context = None
_fresh_path: list[str] | None = None


def _server():
    """The forkserver context, its preload set once per pytest worker (the server starts at the first launch)."""
    global _context, _fresh_path
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        # sys.path of `python script.py` after its first entry (the script's folder) and PYTHONPATH's entries
        # (the script's own environment adds those): pytest adds folders of its own to the server's
        bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        printed = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                                 env=bare, capture_output=True, text=True, check=True).stdout
        _fresh_path = json.loads(printed)
    return _context


def script_argv(command: list[str]) -> list[str] | None:
    """[script, args...] when `command` is this interpreter running a script, else None."""
    if not command or os.path.realpath(command[0]) != os.path.realpath(sys.executable):
        return None
    rest = list(command[1:])
    while rest and rest[0] in _INTERPRETER_FLAGS:
        rest.pop(0)
    return rest if rest and rest[0].endswith(".py") else None


def _run_script(argv, env, cwd, out_path, err_path, fresh_path):  # in the forked process
    os.setsid()  # a session of its own: os.killpg(pid) ends it with whatever it started
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(script), *extra, *fresh_path]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:  # as the interpreter does: the traceback, exit code 1 (without multiprocessing's header)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()


class Started:
    """A script started through the server: pid, poll(), wait(timeout), kill(), send_signal(), communicate() and
    returncode, as subprocess.Popen (communicate reads the files its output went to)."""

    def __init__(self, process: multiprocessing.Process, command: list[str], stdout: str, stderr: str):
        self.process, self.args, self.pid = process, command, process.pid
        self.stdout_path, self.stderr_path = stdout, stderr

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def communicate(self, timeout=None) -> tuple[str, str | None]:
        self.wait(timeout)
        merged = self.stderr_path == self.stdout_path
        return read(self.stdout_path), None if merged else read(self.stderr_path)

    @property
    def returncode(self):
        return self.process.exitcode

    def poll(self):
        return None if self.process.is_alive() else self.process.exitcode

    def wait(self, timeout=None):
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.process.exitcode

    def kill(self):
        _kill_session(self.pid)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start(command: list[str], env: dict | None = None, cwd=None, stdout: str = os.devnull, stderr: str = os.devnull):
    """Start `command` with its output appended to the files `stdout` and `stderr` (paths)."""
    argv = script_argv(command)
    env = dict(os.environ if env is None else env)
    cwd = str(cwd or os.getcwd())
    if argv is None:
        with open(stdout, "a") as out, open(stderr, "a") as err:
            return subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=err, start_new_session=True)
    process = _server().Process(target=_run_script, args=(argv, env, cwd, str(stdout), str(stderr), _fresh_path))
    process.start()
    return Started(process, command, str(stdout), str(stderr))


def popen(command: list[str], env: dict | None = None, cwd=None, merge_stderr: bool = False):
    """Popen(command, stdout=PIPE, stderr=PIPE or STDOUT, text=True, start_new_session=True), through the server:
    the output goes to files of a temporary folder, which communicate() reads."""
    if script_argv(command) is None:
        raise ValueError(f"preloaded.popen starts `python script.py ...` only, not {command[:2]}: use subprocess.Popen")
    folder = tempfile.mkdtemp(prefix="preloaded-")
    out = os.path.join(folder, "out")
    return start(command, env, cwd, out, out if merge_stderr else os.path.join(folder, "err"))


def run(command: list[str], env: dict | None = None, cwd=None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout), through the server; at the timeout
    the script and everything it started are killed."""
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
