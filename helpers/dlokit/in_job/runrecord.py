"""Run records: what every training script writes and every analysis helper reads.

Layout (schema in docs/run-records.md):

    <runs_dir>/<run_id>/rank<k>/run.json       config, versions, hardware, world size (at start)
    <runs_dir>/<run_id>/rank<k>/metrics.jsonl  one JSON object per line, flushed line by line
    <runs_dir>/<run_id>/rank<k>/summary.json   written once at the end (atomically)

A job killed mid-run leaves run.json and every complete metrics line readable; the reader skips a
half-written last line and reports the run as not finished. The reader (read_rank, at the end) never
raises on what it finds: a file it cannot use makes the rank's state "unreadable: <file>: <why>".
"""
from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

from . import jobenv, shared_folders, untrusted

SCHEMA_VERSION = 1
PROCESS_START = time.time()


def _my_cores() -> frozenset | None:
    return frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _cores_busy_ticks(cores) -> int | None:
    """Clock ticks these cores spent on anything but idling (user, system, interrupts, steal) since boot,
    from /proc/stat; None where there is no /proc/stat."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = seen = 0
    for line in lines:
        name, *fields = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit() and (cores is None or int(name[3:]) in cores):
            values = [int(v) for v in fields[:8]]
            busy += sum(values) - values[3] - values[4]  # minus idle and iowait
            seen += 1
    return busy if seen else None


def _own_cpu_s() -> float:
    """CPU time of this process and of all its descendants: those it waited for (os.times) and those still
    running, which os.times does not count. The DataLoader workers of a multi-rank job are the children of a
    forkserver (tp_scripts/common/image_data.worker_start) that this process never waits for: without them a rank's
    own work on its core read as 55 % "other work"."""
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    try:
        import psutil
    except ImportError:
        return total
    from dlokit.in_job import warm_start  # a forkserver started warm is the server's child, its stand-in ours

    for child in warm_start.descendants(psutil.Process()):
        try:
            cpu = child.cpu_times()
        except psutil.Error:  # ended in between
            continue
        total += cpu.user + cpu.system + cpu.children_user + cpu.children_system
    return total


class CpuUse:
    """From its creation on: how busy this process's cores were (anyone's work) and this process's own CPU time
    (its children's once they ended). Their difference is what other work took from the cores (see
    dlokit.analysis.overlap.foreign_cpu_share)."""

    MIN_WINDOW_S = 0.2  # /proc/stat and os.times count in ticks of 10 ms: a shorter window says little

    def __init__(self):
        self.start = (time.time(), _cores_busy_ticks(_my_cores()), _own_cpu_s())

    def summary(self) -> dict:
        started, ticks_start, own_start = self.start
        window, ticks = time.time() - started, _cores_busy_ticks(_my_cores())
        if ticks is None or ticks_start is None or window < self.MIN_WINDOW_S:
            return {}
        return {"cpu_window_s": round(window, 3), "cores_busy_s": round((ticks - ticks_start) / os.sysconf("SC_CLK_TCK"), 3),
                "own_cpu_s": round(_own_cpu_s() - own_start, 3)}


def default_runs_dir() -> Path:
    return jobenv.runs_dir()


def default_run_id() -> str:
    """The job's id when there is one, so that every rank and the notebook agree on it."""
    env = os.environ
    if env.get(jobenv.RUN_ID):
        return env[jobenv.RUN_ID]
    if env.get("SLURM_JOB_ID"):
        return jobenv.slurm_run_id(env)
    if env.get("SUBMITIT_LOCAL_JOB_ID"):
        return env["SUBMITIT_LOCAL_JOB_ID"]
    if env.get("TORCHELASTIC_RUN_ID", "none") != "none":
        return env["TORCHELASTIC_RUN_ID"]
    return time.strftime("local-%Y%m%d-%H%M%S-") + str(os.getpid())


def shared_run_id() -> str:
    """default_run_id() of rank 0, broadcast to all ranks when a process group is up."""
    run_id = default_run_id()
    try:
        import torch.distributed as dist
    except ImportError:
        return run_id
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [run_id]
        dist.broadcast_object_list(box, src=0)
        run_id = box[0]
    return run_id


def describe_hardware(device=None) -> dict:
    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            index = device.index if device is not None and device.index is not None else 0
            info["gpu_name"] = torch.cuda.get_device_name(index)
            info["gpu_count"] = torch.cuda.device_count()
        else:
            info["gpu_name"] = None
            info["gpu_count"] = 0
    except ImportError:
        pass
    try:  # the installed version: importing torchvision would cost a job that does not use it 0.2 to 1 s of CPU
        info["torchvision"] = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        pass
    return info


def measurement_context() -> dict:
    """The evidence that a measurement had its devices to itself: when, where, on which cores and
    GPUs, how loaded the machine was, and how long the job waited for its devices."""
    cores = _my_cores()
    context = {
        "started_unix": round(PROCESS_START, 3),  # the script started (this module is imported early)
        "host": socket.gethostname(),
        "loadavg_start": _loadavg(),
        "cpus": sorted(cores) if cores is not None else None,
        "gpus_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices_held": jobenv.devices_held() or None,
        "alone": not jobenv.shares_machine(),
        "lock_waited_s": jobenv.lock_waited_s(),
    }
    return context


def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


class RecordWriteError(OSError):
    """A run record file could not be written (a full disk, a quota): the message names the file."""


def _write_failed(path: Path, err: OSError) -> RecordWriteError:
    cause = "the disk is full" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "write failed"
    return RecordWriteError(err.errno, f"{cause} while writing the run record {path} ({err.strerror or err})")


def _write_json_atomic(path: Path, data: dict) -> None:
    """tmp file then rename: a failed write (a full disk) leaves the previous version in place."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str))
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _write_failed(path, err) from None  # one traceback, whose last line names the file


class RunRecorder:
    """Writes one rank's run record: the one surface every script records through (the classifier's Instrument and
    train_llm.py's Meter are thin layers over it). Use as a context manager or call finish() yourself.

        record.step(step=.., t_step=.., ...)     # a training step's metrics line (kind "step")
        record.log("event", event="resumed")     # any other line: events, validation, a bench's results
        record.out_of_memory(text, ...)          # this rank ran out of memory: the "oom" event, then the summary
        record.finish(status="completed", ...)   # summary.json, once
    """

    def __init__(self, config: dict, *, rank: int = 0, world_size: int = 1, run_id: str | None = None,
                 runs_dir: str | os.PathLike | None = None, script: str | None = None, device=None,
                 extra: dict | None = None):
        self.run_id = run_id or default_run_id()
        self.rank = rank
        run_folder = Path(runs_dir or default_runs_dir()) / self.run_id
        run_folder.parent.mkdir(parents=True, exist_ok=True)
        shared_folders.make_private(run_folder)  # a student's records are theirs (and the instructors')
        self.folder = run_folder / f"rank{rank}"
        self.folder.mkdir(exist_ok=True)
        self.started = time.time()
        self._cpu = CpuUse()
        header = {
            "schema": SCHEMA_VERSION,
            "run_id": self.run_id,
            "name": jobenv.job_name(),  # set by the kit's submitter
            "tag": jobenv.tag(),  # e.g. "TP1.2": gpu_jobs_submitter(..., tag=...)
            "script": script or Path(sys.argv[0]).name,
            "argv": sys.argv[1:],
            "rank": rank,
            "world_size": world_size,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": config,
            "hardware": describe_hardware(device),
            "measurement": measurement_context(),
            **(extra or {}),
        }
        self.header = header
        _write_json_atomic(self.folder / "run.json", header)
        self._metrics = open(self.folder / "metrics.jsonl", "a", buffering=1)
        _open_records.append(self)
        _install_excepthook()
        _install_cancel_handler()

    def amend(self, **fields) -> None:
        """Add fields to run.json (rewritten atomically), e.g. what was observed on the first step."""
        self.header.update(fields)
        _write_json_atomic(self.folder / "run.json", self.header)

    def log(self, kind: str, **fields) -> None:
        """Append one metrics line; it is on disk when this returns."""
        line = {"kind": kind, "time": round(time.time() - self.started, 4), **fields}
        try:
            self._metrics.write(json.dumps(line, default=float) + "\n")
            self._metrics.flush()
        except OSError as err:
            raise _write_failed(self.folder / "metrics.jsonl", err) from None

    def step(self, **fields) -> None:
        """One training step's metrics line (kind "step"): what the analysis reads as a step."""
        self.log("step", **fields)

    def out_of_memory(self, error: str, *, status: str = "oom", event: dict | None = None, **summary) -> None:
        """This rank ran out of memory: an "oom" event line (with `event`), then the summary with `oom: true`. Both
        families end the same way: this record, then dlokit.in_job.peers.Peers.failed(..., oom=True), whose exit code
        is jobenv.EXIT_OUT_OF_MEMORY. `status`: train_llm.py's records say "oom", the classifier's "failed"."""
        self.log("event", event="oom", error=error, **(event or {}))
        self.finish(status=status, error=error, oom=True, **summary)

    def finish(self, status: str = "completed", **summary) -> None:
        if self._metrics.closed:
            return
        try:
            self._metrics.close()
        except OSError:  # a last buffered line could not be written (a full disk): the summary still tries
            pass
        if self in _open_records:
            _open_records.remove(self)
        summary = {"status": status, "run_id": self.run_id, "rank": self.rank,
                   "wall_time_s": round(time.time() - self.started, 3), "ended_unix": round(time.time(), 3),
                   "loadavg_end": _loadavg(), **self._cpu.summary(), **summary}
        _write_json_atomic(self.folder / "summary.json", summary)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.finish(status="cancelled", error="KeyboardInterrupt")
        elif exc_type is not None:
            self.finish(status="failed", error=f"{exc_type.__name__}: {exc}")
        else:
            self.finish()
        return False


_open_records: list[RunRecorder] = []


def _install_excepthook() -> None:
    """A script that dies of an uncaught exception (say torch.OutOfMemoryError) still gets a summary
    saying so, which the analysis helpers show (e.g. the OOM point of a batch-size scan)."""
    previous = sys.excepthook
    if getattr(previous, "_dlokit", False):
        return

    def hook(exc_type, exc, tb):
        cancelled = issubclass(exc_type, KeyboardInterrupt)
        for record in list(_open_records):
            record.finish(status="cancelled" if cancelled else "failed", error=f"{exc_type.__name__}: {exc}")
        previous(exc_type, exc, tb)

    hook._dlokit = True
    sys.excepthook = hook


def _install_cancel_handler() -> None:
    """A cancelled job (SIGTERM: scancel, dlokit.cancel) finishes its open records with status "cancelled",
    then ends as SIGTERM would have ended it. Only where SIGTERM has no handler yet (not the script's own)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    owner = os.getpid()

    def on_term(signum, _frame):
        if os.getpid() != owner:  # a forked DataLoader worker inherits the handler: the records are not its own
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        signal.signal(signum, signal.SIG_IGN)  # a second SIGTERM (Slurm's and the task's) must not cut the writing
        for record in list(_open_records):
            try:
                record.finish(status="cancelled", signal=signal.Signals(signum).name)
            except OSError:
                pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_term)


# ---- reading ---------------------------------------------------------------------------------------
#
# The one reader of record files (read_rank; the analysis views and the checks go through it). Its contract:
#
# - It never raises on what it finds on disk. A file that cannot be used at all (not readable, a
#   folder, not UTF-8, not JSON, not a JSON object, a metrics file without a single record line) makes
#   the rank *unreadable*: state "unreadable: rank<k>/<file>: <why>". What else could be read is kept.
# - Smaller damage is dropped and named in `problems`: a run.json/summary.json field of the wrong type
#   (a number field holding text, `config` holding a list...) is removed; a metrics line that is not
#   UTF-8, not JSON, not an object with a string "kind", or that has a number field holding something
#   else than a number (or null) is skipped as a whole — it is not a step.
# - A line that starts like a JSON object but does not parse is a half-written line (a job killed while
#   writing it): skipped and reported as `truncated`, as before; that is not a problem.

UNREADABLE = "unreadable"
# run.json: fields that must be JSON objects, integers; config options that must be numbers
RUN_OBJECTS = ("config", "hardware", "observed", "measurement")
RUN_INTEGERS = ("rank", "world_size")
CONFIG_NUMBERS = ("batch_size", "global_batch_size", "per_gpu_batch_size", "local_batch_size", "num_workers",
                  "workers", "prefetch_factor", "image_size", "world_size")
MEASUREMENT_NUMBERS = ("started_unix", "lock_waited_s")
# summary.json and metrics lines: fields that must be numbers (or null), besides every t_* and throughput_*
SUMMARY_NUMBERS = ("steps", "epochs", "wall_time_s", "ended_unix", "first_step_load_s", "gpu_mem_peak_mb",
                   "host_rss_peak_mb", "energy_j", "peak_power_w", "val_acc", "val_acc5", "best_val_acc",
                   "train_loss", "timed_steps", "breakdown_steps", "timing_warmup_steps", "cpu_window_s",
                   "cores_busy_s", "own_cpu_s")
METRIC_NUMBERS = ("time", "step", "epoch", "lr", "loss", "acc", "batch_size", "gpu_mem_mb", "train_loss",
                  "train_acc", "epoch_time_s", "val_loss", "val_acc", "val_acc5", "tokens_per_s", "mfu",
                  "grad_norm", "comm_s", "seconds", "batch_in_epoch")
NUMBER_PREFIXES = ("t_", "throughput_")


class Unreadable(ValueError):
    """A record file that cannot be used at all; str() is '<file>: <why>'."""


def is_number(value) -> bool:
    """A JSON number (NaN and infinities included: a diverged loss is a measurement); not true/false."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _a(value) -> str:
    """'a list', 'a string', 'null'...: what a JSON value is, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)


def _number_field(key: str, names) -> bool:
    return key in names or key.startswith(NUMBER_PREFIXES)


def _read_bytes(path: Path, owners=untrusted.FOLDER_OWNER) -> bytes | None:
    """The file's bytes, None when it does not exist; Unreadable when it exists but is not read (not a regular
    file, another user's, over its size bound: see dlokit.in_job.untrusted)."""
    limit = untrusted.METRICS_BYTES if path.name == "metrics.jsonl" else untrusted.NOTE_BYTES
    try:
        return untrusted.read_bytes(path, limit, owners)
    except FileNotFoundError:
        return None
    except untrusted.Refused as error:
        raise Unreadable(f"{path.name}: {'a folder, not a file' if error.why.startswith('a folder') else error.why}") \
            from None


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Unreadable(f"{what}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start})") from None


def read_json_object(path: str | os.PathLike, owners=untrusted.FOLDER_OWNER) -> tuple[dict | None, list[str]]:
    """(the JSON object a run.json or summary.json holds, problems); (None, []) when the file is absent.

    Raises Unreadable ('<file>: <why>') when the file exists but is not one JSON object: empty, a folder,
    not UTF-8, not JSON, or JSON of another type. Fields of the wrong type are dropped, one problem each."""
    path = Path(path)
    data = _read_bytes(path, owners)
    if data is None:
        return None, []
    if not data.strip():
        raise Unreadable(f"{path.name}: empty file")
    text = _utf8(data, path.name)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        where = f" (line {error.lineno}, column {error.colno})" if isinstance(error, json.JSONDecodeError) else ""
        raise Unreadable(f"{path.name}: not JSON{where}") from None
    if not isinstance(value, dict):
        raise Unreadable(f"{path.name}: not a JSON object ({_a(value)})")
    problems = []
    if path.name == "summary.json":
        status = value.get("status")
        if status is not None and not isinstance(status, str):
            raise Unreadable(f"{path.name}: 'status' is {_a(status)}, not a string")
        _drop(value, path.name, problems, objects=("observed",), numbers=SUMMARY_NUMBERS)
    elif path.name == "run.json":
        _drop(value, path.name, problems, objects=RUN_OBJECTS, integers=RUN_INTEGERS, prefixes=False)
        for block, names in (("config", CONFIG_NUMBERS), ("measurement", MEASUREMENT_NUMBERS)):
            if isinstance(value.get(block), dict):
                _drop(value[block], f"{path.name}: {block}", problems, numbers=names, prefixes=False)
        measurement = value.get("measurement")
        if isinstance(measurement, dict) and measurement.get("cpus") is not None:
            cpus = measurement["cpus"]
            if not isinstance(cpus, list) or not all(is_number(c) or isinstance(c, str) for c in cpus):
                del measurement["cpus"]
                problems.append(f"{path.name}: measurement 'cpus' is not a list of core numbers (dropped)")
    return value, problems


def _drop(record: dict, where: str, problems: list, *, objects=(), integers=(), numbers=(), prefixes=True) -> None:
    """Remove the fields of `record` that have the wrong type, naming each in `problems`."""
    for key in list(record):
        value = record[key]
        if value is None:
            continue
        if key in objects:
            wanted, ok = "an object", isinstance(value, dict)
        elif key in integers:
            wanted, ok = "a whole number ≥ 0", isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif key in numbers or (prefixes and key.startswith(NUMBER_PREFIXES)):
            wanted, ok = "a number", is_number(value)
        else:
            continue
        if not ok:
            del record[key]
            problems.append(f"{where}: '{key}' is {_a(value)}, not {wanted} (dropped)")


def _metrics_line_problem(value) -> str | None:
    """Why a parsed metrics line is not a record, or None."""
    if not isinstance(value, dict):
        return f"{_a(value)}, not an object"
    kind = value.get("kind")
    if not isinstance(kind, str):
        return "no 'kind'" if kind is None else f"'kind' is {_a(kind)}, not a string"
    for key, field_value in value.items():
        if field_value is None or type(field_value) in (float, int):  # the common case, first
            continue
        numeric = _METRIC_KEYS.get(key)
        if numeric is None:
            numeric = _number_field(key, METRIC_NUMBERS)
            if len(_METRIC_KEYS) < 10_000:
                _METRIC_KEYS[key] = numeric
        if numeric:
            return f"'{key}' is {_a(field_value)}, not a number"
    return None


_METRIC_KEYS: dict[str, bool] = {}  # metrics field name -> must it be a number (a cache of _number_field)


class MetricsScan(NamedTuple):
    """What read_metrics found: the record lines, a half-written line, and what was skipped and why."""

    records: list
    truncated: bool
    skipped: int  # lines that are not records (not counted: the half-written line, blank lines)
    problems: list  # one sentence naming the skipped lines (empty when none)
    unreadable: str | None  # '<file>: <why>' when the file cannot be used at all


def scan_metrics(path: str | os.PathLike, owners=untrusted.FOLDER_OWNER) -> MetricsScan:
    """Read a metrics.jsonl line by line (bytes, so that one bad byte spoils one line, not the file)."""
    path = Path(path)
    try:
        data = _read_bytes(path, owners)
    except Unreadable as error:
        return MetricsScan([], False, 0, [], str(error))
    records, truncated, bad, first_bad = [], False, 0, None
    data = data or b""
    try:  # the whole file at once when it is all UTF-8 (the usual case, faster), else line by line
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = data.split(b"\n")  # a newline byte is never part of a UTF-8 multi-byte character
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        why = None
        try:
            text = raw if isinstance(raw, str) else raw.decode("utf-8")
        except UnicodeDecodeError as error:
            why = f"not UTF-8 text (byte 0x{raw[error.start]:02x})"
        else:
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                if text.lstrip().startswith("{"):  # a half-written line: the job was killed while writing it
                    truncated = True
                    continue
                why = "not JSON"
            else:
                why = _metrics_line_problem(value)
        if why is None:
            records.append(value)
        else:
            bad += 1
            first_bad = first_bad or f"line {number}: {why}"
    if bad and not records:
        return MetricsScan([], truncated, bad, [], f"{path.name}: no line is a metrics record ({first_bad})")
    problems = [f"{path.name}: {bad} line(s) skipped, not metrics records ({first_bad})"] if bad else []
    return MetricsScan(records, truncated, bad, problems, None)


def read_metrics(path: str | os.PathLike) -> tuple[list[dict], bool]:
    """Every record line of a metrics.jsonl, and whether a half-written (truncated) line was skipped.

    Never raises: an unreadable file gives no records (scan_metrics says why)."""
    scan = scan_metrics(path)
    return scan.records, scan.truncated


def read_rank(folder: str | os.PathLike, owner: int | None = None, metrics: bool = True) -> dict:
    """One rank's record; never raises, whatever is on disk.

    {'run', 'summary': dict or None, 'metrics': list of dicts, 'truncated': bool, 'state',
     'unreadable': '<rank folder>/<file>: <why>' or None, 'problems': list of sentences}.
    state: summary's status ('completed', 'failed'), 'running or killed' (run.json but no summary),
    'missing' (neither), or 'unreadable: <rank folder>/<file>: <why>' when a file cannot be used at all;
    what could be read of the other files is kept. Every file must belong to `owner` (a uid; default: the rank
    folder's owner), the user whose job wrote it. metrics=False leaves metrics.jsonl unread."""
    folder = Path(folder)
    record = {"run": None, "metrics": [], "summary": None, "state": "missing", "truncated": False,
              "unreadable": None, "problems": []}
    unreadable = []
    try:
        found_owner = untrusted.folder_owner(folder)
    except FileNotFoundError:
        return record
    except untrusted.Refused as error:
        return refused_rank(f"{folder.name}: a file, not a folder" if folder.is_file() and not folder.is_symlink()
                            else f"{folder.name}: {error.why}")
    owners = {found_owner if owner is None else owner}
    if found_owner not in owners:
        return refused_rank(f"{folder.name}: belongs to {untrusted.user_name(found_owner)}, not to "
                            f"{untrusted.user_name(owner)} whose job this is: not read")
    for key, name in (("run", "run.json"), ("summary", "summary.json")):
        try:
            record[key], problems = read_json_object(folder / name, owners)
        except Unreadable as error:
            unreadable.append(f"{folder.name}/{error}")
        else:
            record["problems"] += [f"{folder.name}/{p}" for p in problems]
    if metrics:
        scan = scan_metrics(folder / "metrics.jsonl", owners)
        record.update(metrics=scan.records, truncated=scan.truncated)
        record["problems"] += [f"{folder.name}/{p}" for p in scan.problems]
        if scan.unreadable:
            unreadable.append(f"{folder.name}/{scan.unreadable}")
    record["problems"] = unreadable + record["problems"]
    if unreadable:
        record["unreadable"] = unreadable[0]
        record["state"] = f"{UNREADABLE}: {unreadable[0]}"
    elif record["summary"] is not None:
        record["state"] = record["summary"].get("status") or "completed"
    elif record["run"] is not None:
        record["state"] = "running or killed"
    return record


def refused_rank(why: str) -> dict:
    """The record of a rank (or run) that is not read at all: state 'unreadable: <why>'."""
    return {"run": None, "metrics": [], "summary": None, "state": f"{UNREADABLE}: {why}", "truncated": False,
            "unreadable": why, "problems": [why]}
