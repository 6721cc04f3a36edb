"""Run records: what every training script writes and every analysis helper reads.

Layout (schema in docs/run-records.md):

    <runs_dir>/<run_id>/rank<k>/run.json       config, versions, hardware, world size (at start)
    <runs_dir>/<run_id>/rank<k>/metrics.jsonl  one JSON object per line, flushed line by line
    <runs_dir>/<run_id>/rank<k>/summary.json   written once at the end (atomically)

A job killed mid-run leaves run.json and every complete metrics line readable; the reader skips a
half-written last line and reports the run as not finished.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from pathlib import Path

from . import jobenv

SCHEMA_VERSION = 1
PROCESS_START = time.time()


def default_runs_dir() -> Path:
    return jobenv.runs_dir()


def default_run_id() -> str:
    """The job's id when there is one, so that every rank and the notebook agree on it."""
    env = os.environ
    if env.get(jobenv.RUN_ID):
        return env[jobenv.RUN_ID]
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    for key in ("SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID"):
        if env.get(key):
            return env[key]
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
    try:
        import torchvision

        info["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    return info


def measurement_context() -> dict:
    """The evidence that a measurement had its devices to itself: when, where, on which cores and
    GPUs, how loaded the machine was, and how long the job waited for its devices."""
    context = {
        "started_unix": round(PROCESS_START, 3),  # the script started (this module is imported early)
        "host": socket.gethostname(),
        "loadavg_start": _loadavg(),
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpus_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices_held": jobenv.devices_held() or None,
        "lock_waited_s": jobenv.lock_waited_s(),
    }
    return context


def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


class RunRecorder:
    """Writes one rank's run record. Use as a context manager or call finish() yourself."""

    def __init__(self, config: dict, *, rank: int = 0, world_size: int = 1, run_id: str | None = None,
                 runs_dir: str | os.PathLike | None = None, script: str | None = None, device=None,
                 extra: dict | None = None):
        self.run_id = run_id or default_run_id()
        self.rank = rank
        self.folder = Path(runs_dir or default_runs_dir()) / self.run_id / f"rank{rank}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        header = {
            "schema": SCHEMA_VERSION,
            "run_id": self.run_id,
            "name": jobenv.job_name(),  # set by the kit's submitter
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

    def amend(self, **fields) -> None:
        """Add fields to run.json (rewritten atomically), e.g. what was observed on the first step."""
        self.header.update(fields)
        _write_json_atomic(self.folder / "run.json", self.header)

    def log(self, kind: str, **fields) -> None:
        """Append one metrics line; it is on disk when this returns."""
        line = {"kind": kind, "time": round(time.time() - self.started, 4), **fields}
        self._metrics.write(json.dumps(line, default=float) + "\n")
        self._metrics.flush()

    def finish(self, status: str = "completed", **summary) -> None:
        if self._metrics.closed:
            return
        self._metrics.close()
        if self in _open_records:
            _open_records.remove(self)
        summary = {"status": status, "run_id": self.run_id, "rank": self.rank,
                   "wall_time_s": round(time.time() - self.started, 3), "ended_unix": round(time.time(), 3),
                   "loadavg_end": _loadavg(), **summary}
        _write_json_atomic(self.folder / "summary.json", summary)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
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
        for record in list(_open_records):
            record.finish(status="failed", error=f"{exc_type.__name__}: {exc}")
        previous(exc_type, exc, tb)

    hook._dlokit = True
    sys.excepthook = hook


def read_metrics(path: str | os.PathLike) -> tuple[list[dict], bool]:
    """Every complete line of a metrics.jsonl, and whether a broken (truncated) line was skipped."""
    records, truncated = [], False
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return [], False
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            truncated = True
    return records, truncated


def read_rank(folder: str | os.PathLike) -> dict:
    """One rank's record: {'run', 'metrics', 'summary', 'state', 'truncated'}; never raises on a partial run."""
    folder = Path(folder)

    def load(name):
        try:
            return json.loads((folder / name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    run, summary = load("run.json"), load("summary.json")
    metrics, truncated = read_metrics(folder / "metrics.jsonl")
    if summary is not None:
        state = summary.get("status", "completed")
    elif run is not None:
        state = "running or killed"
    else:
        state = "missing"
    return {"run": run, "metrics": metrics, "summary": summary, "state": state, "truncated": truncated}
