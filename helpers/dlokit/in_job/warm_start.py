"""Warm starts: a local job's script forked from a process that has imported torch and torchvision already.

A fresh interpreter spends 7-8 s of a core importing torch and torchvision before a script's first line (2026-11-27,
this project's 2-core machine: torch 4 s, torchvision 3.5 s, 2.2 s of it torch._dynamo). On the local backend every
task of every job paid it, most of a short job's time on a laptop. Here it is paid once per user and install:

    python -u warm_start.py [--mem-bytes N] [--usage PATH] -- script.py args...   (a local task's command)
    python warm_start.py --serve KEY                                               (started by the first task)

The task's command (the client) asks this user's server to fork: a Unix socket in a folder only the user can
open, one server per interpreter, torch install and import-time environment. The server's child takes the
client's stdin, stdout and stderr, working directory, environment, cores and memory limit, and runs the script as
`python -u script args` does. The client stays in the job as the script's stand-in: it passes every signal on,
ends with the script's exit status, and writes the script's peak memory to --usage. The script dies with its
client (a job killed whole kills its script). The launcher finds the script through `adopted()`.

Cold, as before (the client execs `python -u script`, under the memory limit): with DLOKIT_WARM_START=0, or when no
server can be had. On a machine with NVIDIA GPUs the server serves only while CUDA is not initialised in it: a
process forked after cuInit cannot use CUDA. torch initialises it lazily, at the first CUDA call, not on import
(some builds map the driver library as they import; that alone is harmless). Should an import initialise it, the
server writes `<key>.cold` and ends, and every client of that key starts cold.
Slurm jobs never come here: a process forked outside the job would escape its cgroup.

Standard library only: the client runs before anything else is imported.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time

SWITCH = "DLOKIT_WARM_START"  # "0": every script starts cold
PRELOAD = ("torch", "torchvision", "numpy", "PIL.Image")
MEMORY_SHARE = 4  # a memory limit under 4x the server's own data (~0.85 GB, torch imported) starts cold
MAX_FDS = 16  # stdin, stdout, stderr and what a script is passed (a forkserver: 2)
IDLE_S = 300  # a server with nothing to do for this long ends
READY_S = 120  # how long a client waits for a server that is importing torch
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGABRT, signal.SIGALRM, signal.SIGCONT)
# read by torch at run time (or set by it): not part of what the server imported
RUNTIME_VARIABLES = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONUNBUFFERED"}
IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "PYTHON", "KMP_", "MKL_", "OPENBLAS", "LD_")
IMPORT_TIME_NAMES = ("CXX", "CC")  # torch._inductor.config reads the C++ compiler as it imports


# ---- where the servers live, and which one a job may use

def runtime_dir() -> str:
    """This user's folder for servers and notes: $XDG_RUNTIME_DIR/dlokit-warm, else <tmp>/dlokit-warm-<uid>."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = os.path.join(base, "dlokit-warm") if base else os.path.join("/tmp", f"dlokit-warm-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or not os.path.isdir(path):
        raise PermissionError(f"{path} is not this user's alone")
    return path


def server_key(python: str, environ: dict) -> str:
    """One server per interpreter, torch install and environment variables that torch reads as it imports."""
    spec = importlib.util.find_spec("torch")
    torch_version = os.path.join(os.path.dirname(spec.origin), "version.py") if spec and spec.origin else ""
    stamp = os.stat(torch_version).st_mtime_ns if torch_version and os.path.exists(torch_version) else 0
    seen = sorted((k, v) for k, v in environ.items()
                  if (k.startswith(IMPORT_TIME_PREFIXES) or k in IMPORT_TIME_NAMES) and k not in RUNTIME_VARIABLES)
    seen += [(k, v) for k, v in sorted(environ.items()) if k.startswith("OMP_") and k != "OMP_NUM_THREADS"]
    this = os.stat(os.path.abspath(__file__)).st_mtime_ns  # a changed server is a new one
    text = json.dumps([os.path.realpath(python), sys.version, sys.prefix, torch_version, stamp, this, seen,
                       _installed()])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _installed() -> list:
    """The .pth files of the site-packages, with their times: a reinstall of the kit (the editable install's finder,
    which makes `common` and `llm_kit` importable) makes a new server, whose scripts import what is installed now."""
    import site

    found = []
    for folder in site.getsitepackages():
        with contextlib.suppress(OSError):
            found += [(name, os.stat(os.path.join(folder, name)).st_mtime_ns)
                      for name in sorted(os.listdir(folder)) if name.endswith(".pth")]
    return found


def _server_environment(environ: dict) -> dict:
    """What the server imports torch under: the variables the key holds, and the user's; never the first job's own
    (its scripts get each job's whole environment)."""
    kept = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "XDG_RUNTIME_DIR", SWITCH, *IMPORT_TIME_NAMES)
    return {k: v for k, v in environ.items() if k in kept or k.startswith(("LC_", "OMP_") + IMPORT_TIME_PREFIXES)}


def allowed(environ: dict) -> bool:
    return environ.get(SWITCH, "1") != "0"


def cuda_driver_loaded(maps: str | None = None) -> str:
    """The CUDA driver library mapped into this process (its path), or "". maps: /proc/self/maps's text (read when
    None)."""
    if maps is None:
        try:
            with open("/proc/self/maps") as handle:
                maps = handle.read()
        except OSError:
            return ""
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
        if os.path.basename(path).startswith("libcuda.so"):
            return path
    return ""


CUDA_ERROR_NOT_INITIALIZED = 3


def cuda_initialised() -> str:
    """The CUDA driver's path if it is loaded in this process and initialised (cuInit called: a forked child could not
    use CUDA), else "". Loaded is not initialised: some torch builds map the driver as they import. The driver's
    cuCtxGetCurrent answers CUDA_ERROR_NOT_INITIALIZED before cuInit, without initialising it."""
    import ctypes

    driver = cuda_driver_loaded()
    if not driver:
        return ""
    try:
        current = ctypes.c_void_p()
        code = ctypes.CDLL(driver).cuCtxGetCurrent(ctypes.byref(current))  # mapped already: no second copy
    except (OSError, AttributeError):
        return driver  # cannot tell: as if initialised
    return "" if code == CUDA_ERROR_NOT_INITIALIZED else driver


def adopted(pid: int, folder: str | None = None):
    """The script a warm client stands in for (a psutil.Process), or None: for the launcher's memory watch and
    its SIGABRT to stuck scripts, which look for the scripts among the job's descendants. folder: runtime_dir(),
    when the caller has it already."""
    import psutil

    try:
        with open(os.path.join(folder or runtime_dir(), f"{pid}.child")) as note:
            child, started = note.read().split()
        process = psutil.Process(int(child))
        return process if abs(process.create_time() - float(started)) < 1 else None
    except (OSError, ValueError, psutil.Error):
        return None


def descendants(process) -> list:
    """A process's descendants (psutil), each warm client replaced by the script it stands in for and that
    script's own descendants: what a cold start would have made the process's tree."""
    import psutil

    try:
        folder = runtime_dir()  # once, not once a process: the launcher asks twice a second
    except OSError:
        folder = None  # no notes can exist: no script was forked warm, and adopted() finds none
    return _descendants(process, folder, psutil)


def _descendants(process, folder: str, psutil) -> list:
    found = []
    try:
        children = process.children()
    except psutil.Error:
        return found
    for child in children:
        script = adopted(child.pid, folder)
        found.append(script or child)
        found += _descendants(script or child, folder, psutil)
    return found


# ---- messages: a length, then JSON

def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    data = struct.pack("!I", len(data)) + data
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    sock.sendall(data[sent:])


def _receive(sock: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    fds: list[int] = []
    if with_fds:
        data, fds, _flags, _address = socket.recv_fds(sock, 1 << 16, with_fds)
    else:
        data = sock.recv(1 << 16)
    if len(data) < 4:
        return None, fds
    size = struct.unpack("!I", data[:4])[0]
    while len(data) < 4 + size:
        more = sock.recv(1 << 16)
        if not more:
            return None, fds
        data += more
    return json.loads(data[4:4 + size]), fds


# ---- the client: a local task's command

def _cold(script_argv: list[str], mem_bytes: int):
    import resource

    if mem_bytes:  # RLIMIT_DATA: writable private memory, not the address space (CUDA's reservations do not count)
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        resource.setrlimit(resource.RLIMIT_DATA, (mem_bytes if hard == resource.RLIM_INFINITY else min(mem_bytes, hard), hard))
    os.execv(sys.executable, [sys.executable, "-u", *script_argv])


@contextlib.contextmanager
def _address(path: str):
    """The socket's path, or the same file reached through its folder's descriptor when the path is longer than
    AF_UNIX takes (108 bytes: a deep temporary folder)."""
    if len(os.fsencode(path)) < 100:
        yield path
        return
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{os.path.basename(path)}"
    finally:
        os.close(folder)


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _address(path) as address:
            sock.connect(address)
        return sock
    except OSError:
        sock.close()
        return None


def _server(key: str) -> socket.socket | None:
    """A connection to this key's server; the first client starts it (under a lock) and waits until it listens."""
    import fcntl

    folder = runtime_dir()
    path, cold = os.path.join(folder, f"{key}.sock"), os.path.join(folder, f"{key}.cold")
    if os.path.exists(cold):  # this key's imports initialise CUDA: no fork is safe
        return None
    sock = _connect(path)
    if sock:
        return sock
    with open(os.path.join(folder, f"{key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another task may be starting it: wait for it
        sock = _connect(path)
        if sock:
            return sock
        if os.path.exists(path):
            os.unlink(path)  # a server that ended without cleaning up
        with open(os.path.join(folder, f"{key}.log"), "ab") as log:
            # --serve leaves at once and its own child serves: no job counts the server among its processes
            subprocess.run([sys.executable, os.path.abspath(__file__), "--serve", key], stdin=subprocess.DEVNULL,
                           stdout=log, stderr=log, cwd="/", start_new_session=True, check=True,
                           env=_server_environment(os.environ))
        deadline = time.time() + READY_S
        while time.time() < deadline and not os.path.exists(cold):
            sock = _connect(path)
            if sock:
                return sock
            time.sleep(0.05)
    return None


def client(argv: list[str]) -> None:
    mem_bytes, usage, pass_fds, script_argv = _client_options(argv)
    runnable = script_argv[:1] == ["-c"] and len(script_argv) > 1 or script_argv[:1] and script_argv[0][:1] != "-"
    if not runnable or not allowed(os.environ):
        _cold(script_argv, mem_bytes)
    try:
        key = server_key(sys.executable, os.environ)
        sock = _server(key)
        if sock and mem_bytes and mem_bytes < MEMORY_SHARE * _server_data_bytes(key):
            sock.close()  # the server's imports would take too much of a small limit: a script that never
            sock = None   # imports torch could have run cold under it
    except OSError as error:
        print(f"dlokit warm start: none ({error}); starting cold", file=sys.stderr, flush=True)
        sock = None
    if sock is None:
        _cold(script_argv, mem_bytes)
    request = {"argv": script_argv, "fds": pass_fds, "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask(),
               "cpus": sorted(os.sched_getaffinity(0)), "mem_bytes": mem_bytes,
               "ignored": [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]}
    pending: list[int] = []
    child: list[int] = []

    def forward(signum, _frame):
        if not child:
            pending.append(signum)  # passed on once the script exists
            return
        try:
            os.kill(child[0], signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, forward)
    try:
        _send(sock, request, [0, 1, 2, *pass_fds])
        reply, _ = _receive(sock)
    except OSError:
        reply = None
    if not reply or "pid" not in reply:
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        _cold(script_argv, mem_bytes)
    note = os.path.join(runtime_dir(), f"{os.getpid()}.child")
    try:
        with open(note, "w") as out:
            out.write(f"{reply['pid']} {reply['started']}")
    except OSError:  # a full disk: the script runs all the same, the launcher's memory watch misses it
        pass
    child.append(reply["pid"])
    for signum in pending:
        forward(signum, None)
    ended, _ = _receive(sock)
    _end_as(ended, note, usage)


def _client_options(argv: list[str]) -> tuple[int, str | None, list[int], list[str]]:
    mem_bytes, usage, pass_fds = 0, None, []
    while argv and argv[0] != "--":
        option, value, argv = argv[0], argv[1], argv[2:]
        if option == "--mem-bytes":
            mem_bytes = int(value)
        elif option == "--usage":
            usage = value
        elif option == "--pass-fds":
            pass_fds = [int(fd) for fd in value.split(",") if fd]
    if not mem_bytes:  # a limit this process has (a rank's, for its forkserver) holds for the script too
        import resource

        soft = resource.getrlimit(resource.RLIMIT_DATA)[0]
        mem_bytes = 0 if soft == resource.RLIM_INFINITY else soft
    return mem_bytes, usage, pass_fds, argv[1:]


def _end_as(ended: dict | None, note: str, usage: str | None) -> None:
    """Leave as the script left: its exit code, or killed by its signal; its peak memory written to `usage`."""
    try:
        os.unlink(note)  # the server removes it too: for a client killed on the way
    except OSError:
        pass
    if ended is None:
        print("dlokit warm start: the server went away before the script ended", file=sys.stderr, flush=True)
        os._exit(1)
    if usage:
        with open(usage, "w") as out:
            json.dump({"peak_rss_kb": ended["maxrss_kb"], "cpu_s": ended["cpu_s"]}, out)
    status = ended["status"]
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # their action cannot be set (EINVAL), nor caught
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- the server

def serve(key: str):
    """Import torch, listen, and fork a script for each request. Returns in a forked child only: (request, fds,
    connection), for run_script; the server itself ends after IDLE_S with nothing to do."""
    if os.fork():  # the client waits for this parent only; the server is nobody's child
        os._exit(0)
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # not the first task's cores
    except OSError:
        pass
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    import gc

    # What the imports made is never collected in a script: a full collection there would write to every one of
    # those objects and copy its page from this server's memory (hundreds of MB, mid-run, inside a measured step).
    gc.collect()
    gc.freeze()
    driver = cuda_initialised()
    if driver:
        with open(os.path.join(runtime_dir(), f"{key}.cold"), "w") as note:
            note.write(f"importing {', '.join(PRELOAD)} initialised {driver}: a forked script could not use CUDA\n")
        print(f"{time.strftime('%H:%M:%S')} not serving: {driver} is initialised; every script of this key starts cold",
              flush=True)
        os._exit(0)
    return _Server(key).run()


class _Server:
    """One thread, so that a fork never copies another thread's half-held lock: a selector waits for clients and,
    through the wake-up pipe, for SIGCHLD."""

    def __init__(self, key: str):
        self.folder = runtime_dir()
        self.path = os.path.join(self.folder, f"{key}.sock")
        self.facts = os.path.join(self.folder, f"{key}.json")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        draft = f"{self.path}.{os.getpid()}"
        with _address(draft) as address:
            self.listener.bind(address)
        self.listener.listen(64)
        with open(self.facts, "w") as facts:
            json.dump({"pid": os.getpid(), "data_bytes": _data_bytes()}, facts)
        os.rename(draft, self.path)  # clients connect only once torch is imported
        self.identity = os.stat(self.path).st_ino
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.running: dict[int, tuple[socket.socket, int]] = {}  # script -> (its connection, its client's pid)
        print(f"{time.strftime('%H:%M:%S')} serving {self.path} (pid {os.getpid()})", flush=True)

    def run(self):
        last_busy = time.time()
        while True:
            for selected, _ in self.selector.select(timeout=5):
                if selected.fileobj is self.listener:
                    last_busy = time.time()
                    forked = self.fork_one()
                    if forked:
                        return forked
                else:
                    os.read(self.wake_r, 512)
            self.reap()
            if self.running:
                last_busy = time.time()
            mine = os.path.exists(self.path) and os.stat(self.path).st_ino == self.identity
            if not self.running and (not mine or time.time() - last_busy > IDLE_S):
                if mine:
                    os.unlink(self.path)
                    os.unlink(self.facts)
                os._exit(0)

    def fork_one(self):
        """Fork a script for the next client; in the child, returns what run_script needs."""
        conn, _ = self.listener.accept()
        request, fds, client_pid = _accept(conn)
        if request is None:
            conn.close()
            return None
        pid = os.fork()
        if pid == 0:
            self.selector.close()
            self.listener.close()
            for other, _ in self.running.values():
                other.close()
            signal.set_wakeup_fd(-1)
            os.close(self.wake_r)
            os.close(self.wake_w)
            return request, fds, conn
        for fd in fds:
            os.close(fd)
        self.running[pid] = (conn, client_pid)
        try:
            _send(conn, {"pid": pid, "started": _create_time(pid)})
        except OSError:
            pass
        return None

    def reap(self):
        """Tell each ended script's client how it ended, and its peak memory."""
        while self.running:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn, client_pid = self.running.pop(pid, (None, 0))
            try:
                os.unlink(os.path.join(self.folder, f"{client_pid}.child"))
            except OSError:
                pass
            if conn:
                try:
                    _send(conn, {"status": status, "maxrss_kb": usage.ru_maxrss,
                                 "cpu_s": usage.ru_utime + usage.ru_stime})
                except OSError:
                    pass
                conn.close()


def _data_bytes() -> int:
    """This process's writable private memory (VmData), what RLIMIT_DATA counts."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))


def _server_data_bytes(key: str) -> int:
    try:
        with open(os.path.join(runtime_dir(), f"{key}.json")) as facts:
            return int(json.load(facts)["data_bytes"])
    except (OSError, ValueError, KeyError):
        return 1 << 40  # unknown: cold under any limit


def _accept(conn: socket.socket) -> tuple[dict | None, list[int], int]:
    """The request and the client's pid, if it comes from this user (the folder is the user's alone; this checks
    it again)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    try:
        request, fds = _receive(conn, with_fds=MAX_FDS)
    except (OSError, ValueError):
        return None, [], pid
    if uid != os.getuid() or request is None or len(fds) != 3 + len(request.get("fds", ())):
        for fd in fds:
            os.close(fd)
        return None, [], pid
    return request, fds, pid


def _create_time(pid: int) -> float:
    """As psutil counts it: boot time plus the start in clock ticks (/proc/<pid>/stat, field 22)."""
    with open(f"/proc/{pid}/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as machine:
        boot = next(int(line.split()[1]) for line in machine if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def run_script(request: dict, fds: list[int], conn: socket.socket):
    """In the forked child: become `python -u <script> <args>` as the client's process would have been."""
    import io
    import resource
    import tempfile
    import threading

    os.setpgid(0, 0)
    conn = _place_fds(fds, [0, 1, 2, *request.get("fds", ())], conn)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # chosen again from this environment's TMPDIR
    for signum in FORWARDED + (signal.SIGCHLD,):
        signal.signal(signum, signal.SIG_IGN if signum in request["ignored"] else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN if signal.SIGINT in request["ignored"] else signal.default_int_handler)
    os.sched_setaffinity(0, request["cpus"])
    if request["mem_bytes"]:
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        limit = request["mem_bytes"] if hard == resource.RLIM_INFINITY else min(request["mem_bytes"], hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    _redo_import_time_choices()

    def die_with_client():  # the client is the job's process: when it goes, the script goes
        try:
            while conn.recv(1024):
                pass
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=die_with_client, name="dlokit-warm-start", daemon=True).start()
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    script = request["argv"][0]
    code = request["argv"][1] if script == "-c" else None
    _name_process("python" if code else os.path.basename(script))
    path = "<string>" if code else os.path.join(os.getcwd(), script)  # joined, not normalised, as Python does
    sys.argv = ["-c", *request["argv"][2:]] if code else list(request["argv"])
    python_path = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = ["" if code else os.path.dirname(os.path.realpath(script)), *python_path,
                   *[p for p in sys.path[1:] if p not in python_path]]
    if "multiprocessing.process" in sys.modules:  # where relative paths of a spawned process start from
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.getcwd()
    try:
        _run_as_main(path, code)
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException as error:
        _print_error(error, path)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    _leave(code)


def _name_process(name: str) -> None:
    """The name top, ps and pgrep show (15 bytes): the script's, not the server's (its command line stays the
    server's: Python cannot rewrite it)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(15, os.fsencode(name)[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _run_as_main(path: str, code: str | None) -> None:
    """The script as the interpreter runs `python path` (a fresh __main__ whose __file__ is absolute, as in Python
    3.9+; sys.argv[0] stays as it was given), or `python -c code`."""
    import importlib.machinery
    import io
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    if code is None:
        main.__file__ = path
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
        with io.open_code(path) as source:
            code = source.read()
    sys.modules["__main__"] = main
    exec(compile(code, path, "exec"), main.__dict__)


def _place_fds(received: list[int], targets: list[int], conn: socket.socket) -> socket.socket:
    """Each received descriptor under its target number (0, 1, 2, then the passed ones); the connection to the
    client is moved out of their way first."""
    import fcntl

    if conn.fileno() in targets:
        moved = socket.socket(fileno=fcntl.fcntl(conn.fileno(), fcntl.F_DUPFD_CLOEXEC, 256))
        conn.close()
        conn = moved
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 256) for fd in received]
    for fd in received:
        os.close(fd)
    for fd, target in zip(high, targets):
        os.dup2(fd, target)
        os.close(fd)
    return conn


def _exit_code(code) -> int:
    """What the interpreter makes of SystemExit's argument."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_error(error: BaseException, path: str) -> None:
    """The traceback as `python script` prints it: from the script's own first frame, not this module's."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next
    if tb is not None:
        error = error.with_traceback(tb)
    sys.excepthook(type(error), error, error.__traceback__)


def _leave(code: int) -> None:
    """The interpreter's exit, less the teardown of its modules (1.5 s of a core with torch and torchvision, 2026-11-27):
    non-daemon threads joined, atexit run, unreachable objects collected, every open file flushed, then out."""
    import atexit
    import gc
    import io
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    gc.collect()
    for stream in gc.get_objects():
        if issubclass(type(stream), io.IOBase):  # type(), not isinstance: a deprecated alias would warn
            try:
                if not stream.closed and stream.writable():
                    stream.flush()
            except (OSError, ValueError):
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:  # KeyboardInterrupt: the interpreter ends by the signal itself
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _redo_import_time_choices() -> None:
    """What torch chose while the server imported it, from the server's cores and environment: chosen again."""
    cpus = len(os.sched_getaffinity(0))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or cpus))
    config = sys.modules.get("torch._inductor.config")
    if config is not None and hasattr(config, "decide_compile_threads"):
        config.compile_threads = config.decide_compile_threads()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # a fresh process draws its own seed


def command(python: str, script_argv: list[str], mem_bytes: int = 0, usage: str | None = None,
            pass_fds: tuple[int, ...] = ()) -> list[str]:
    """The command line for `python -u <script_argv>` (a script and its arguments, or -c and code), started warm
    where it can be. pass_fds: open file descriptors the script gets under the same numbers."""
    options = ["--mem-bytes", str(mem_bytes)] + (["--usage", usage] if usage else [])
    options += ["--pass-fds", ",".join(map(str, pass_fds))] if pass_fds else []
    return [python, "-u", os.path.abspath(__file__), *options, "--", *script_argv]


@contextlib.contextmanager
def forkserver_from_server():
    """multiprocessing's forkserver (tp_scripts/common/image_data.worker_start), started from this user's server
    too while this is open, on the local backend: it imports torch and torchvision as it starts, 7-8 s of a core
    for each rank of a job whose DataLoader has workers. Its stand-in (a client, the rank's child as the forkserver
    was) ends with it."""
    from multiprocessing import util

    if os.environ.get("SUBMITIT_EXECUTOR") != "local" or not allowed(os.environ):
        yield
        return
    spawn = util.spawnv_passfds

    def through_server(path, args, passfds):
        code = list(args[list(args).index("-c"):])  # the interpreter's flags before it come from the environment,
        return spawn(path, command(path, code, pass_fds=tuple(passfds)), passfds)  # which the server shares

    util.spawnv_passfds = through_server
    try:
        yield
    finally:
        util.spawnv_passfds = spawn


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        run_script(*serve(sys.argv[2]))
    else:
        client(sys.argv[1:])
