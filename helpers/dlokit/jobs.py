"""Submitted jobs: their cards on disk, their logs, their state and how they ended.

Every job gets a card `<log folder>/<name>/<job_id>_job.json` next to submitit's logs
(`<job_id>_<task>_log.out|err`, and `<job_id>_submission.sh` on Slurm), so a notebook reopened
tomorrow still finds its jobs.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .jobspec import format_seconds
from .profiles import current_profile

ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}
TIMED_OUT = "timed-out and not checkpointable"  # submitit's words when the time-limit signal stops a job
MEMORY_ERRORS = ("OutOfMemoryError", "CUDA out of memory", "MemoryError", "oom-kill", "Killed")

_live_jobs: dict[str, object] = {}  # submitit Job objects of this session, by job id
atexit.register(_live_jobs.clear)  # let submitit's Job.__del__ run before interpreter teardown


@dataclass
class JobCard:
    job_id: str
    name: str
    backend: str
    profile: str
    folder: str
    argv: list
    command_line: str
    n_gpu: int
    nodes: int
    tasks: int
    time_seconds: int
    runs_dir: str
    submitted_at: float
    cancelled_at: float | None = None
    extra: dict = field(default_factory=dict)
    native_id: str = ""  # the scheduler's own id where it differs (local: the launcher's pid)

    @property
    def scheduler_id(self) -> str:
        return self.native_id or self.job_id

    @property
    def path(self) -> Path:
        return Path(self.folder) / f"{self.job_id}_job.json"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)

    def log_path(self, task: int = 0, err: bool = False) -> Path:
        return Path(self.folder) / f"{self.scheduler_id}_{task}_log.{'err' if err else 'out'}"

    def launcher_note(self, kind: str) -> dict:
        """The local launcher's `waiting` or `started` note ({} when absent or unreadable)."""
        try:
            value = json.loads((Path(self.folder) / f"{self.scheduler_id}_{kind}.json").read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.job_id


@dataclass
class Outcome:
    job_id: str
    state: str  # COMPLETED, FAILED, TIMEOUT, CANCELLED, OUT_OF_MEMORY, RUNNING, PENDING, UNKNOWN
    exit_code: str = ""
    elapsed: str = ""
    cause: str = ""  # the last lines of the traceback, or why the job stopped

    @property
    def finished(self) -> bool:
        return self.state not in ACTIVE

    def __str__(self) -> str:
        head = f"job {self.job_id}: {self.state}" + (f" (exit {self.exit_code})" if self.exit_code else "")
        return head + (f"\n{self.cause}" if self.cause else "")


def remember(card: JobCard, job) -> None:
    _live_jobs[card.job_id] = job


def all_cards(name: str | None = None, log_dir: Path | None = None) -> list[JobCard]:
    root = log_dir or current_profile().logs
    pattern = f"{name}/*_job.json" if name else "*/*_job.json"
    cards = []
    for path in root.glob(pattern):
        try:
            cards.append(JobCard(**json.loads(path.read_text())))
        except (json.JSONDecodeError, TypeError):
            continue
    return sorted(cards, key=lambda c: c.submitted_at)


JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_job_id(job_id) -> str:
    """A job id as text, refused if it could act as a file pattern ('*', '?', '[', '/')."""
    text = str(job_id).strip()
    if not JOB_ID_PATTERN.fullmatch(text):
        raise ValueError(f"{job_id!r} is not a job id: ids are letters, digits, '_', '-' and '.', "
                         "as returned by gpu_jobs_submitter")
    return text


def find_card(job_id: str, log_dir: Path | None = None) -> JobCard:
    root = log_dir or current_profile().logs
    matches = list(root.glob(f"*/{check_job_id(job_id)}_job.json"))
    if not matches:
        raise LookupError(f"no job {job_id!r} under {root}: was it submitted with another profile or log folder?")
    return JobCard(**json.loads(matches[0].read_text()))


def search_log(name: str | None = None, contains: str | None = None, with_err: bool = False,
               log_dir: Path | None = None) -> list[str]:
    """Log files of your jobs, job by job in submission order, then task 0, 1, ... (`[0]` is task 0 of
    the first job), filtered by job name and by a text in the job id or the file name."""
    root = log_dir or current_profile().logs
    if name is not None:
        check_name_like(name)
    suffixes = ("out", "err") if with_err else ("out",)
    paths = []
    for card in all_cards(name, root):
        if contains is not None and str(contains) not in card.job_id and str(contains) not in card.scheduler_id \
                and not any(str(contains) in card.log_path(t).name for t in range(card.tasks)):
            continue
        for task in range(card.tasks):
            paths += [card.log_path(task, err=s == "err") for s in suffixes]
    return [str(p) for p in paths if p.exists()]


def check_name_like(name: str) -> None:
    if not JOB_ID_PATTERN.fullmatch(str(name)):
        raise ValueError(f"{name!r} is not a job name (letters, digits, '_', '-', '.')")


def tail(path: Path, lines: int = 1) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 8192))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def show_script(job_id: str) -> str:
    """What was sent: the batch script on Slurm, the per-task command on the local backend."""
    card = find_card(job_id)
    submission = Path(card.folder) / f"{card.job_id.split('_')[0]}_submission.sh"
    if card.backend == "slurm" and submission.exists():
        return submission.read_text()
    return (f"# local backend: submitit starts {card.tasks} process(es) on this machine, each running\n"
            f"{card.command_line}\n")


# ---- state -------------------------------------------------------------------------------------

def _sacct(job_id: str) -> dict | None:
    try:
        out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,ExitCode,Elapsed"],
                             capture_output=True, text=True, timeout=20).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        jid, state, exit_code, elapsed = line.split("|")
        if jid == job_id:
            return {"state": state.split()[0], "exit_code": exit_code, "elapsed": elapsed}
    return None


def _squeue_state(card: JobCard) -> dict:
    """Before slurmdbd has the job, squeue knows it; a job neither knows is UNKNOWN."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", card.job_id, "-o", "%T|%M"],
                             capture_output=True, text=True, timeout=20).stdout.split()
    except (FileNotFoundError, subprocess.TimeoutExpired):
        out = []
    if out:
        state, elapsed = out[0].split("|")
        return {"state": state, "elapsed": elapsed}
    if time.time() - card.submitted_at < 60:
        return {"state": "PENDING"}
    return {"state": "UNKNOWN", "cause": "neither squeue nor sacct knows this job (is accounting on?)"}


def local_alive(card: JobCard) -> bool:
    """Is this local job's launcher (and so its controller) still running?"""
    job = _live_jobs.get(card.job_id)
    if job is not None and getattr(job, "_process", None) is not None:
        return job._process.poll() is None  # submitted from this session: ask the process handle
    try:  # submitted by an earlier session: the pid must still be the kit's launcher for this folder
        cmdline = Path(f"/proc/{int(card.scheduler_id)}/cmdline").read_bytes()
        state = Path(f"/proc/{int(card.scheduler_id)}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ValueError, PermissionError, IndexError):
        return False
    return b"submitit" in cmdline and card.folder.encode() in cmdline and state != "Z"


def _result(card: JobCard):
    """submitit's result pickle of task 0, as (status, payload), or None."""
    import pickle

    path = Path(card.folder) / f"{card.scheduler_id}_0_result.pkl"
    try:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    except (FileNotFoundError, EOFError, pickle.UnpicklingError):
        return None


def traceback_tail(card: JobCard, lines: int = 6) -> str:
    """The end of the first task's traceback that says why it failed (user script first, then submitit's)."""
    texts = [tail(card.log_path(task, err=True), 200) for task in range(card.tasks)]
    for text in texts:
        if "Traceback" in text:
            block = text[text.index("Traceback"):].splitlines()
            end = next((i for i, line in enumerate(block) if re.match(r"\S.*(Error|Exception|Interrupt)\b", line)
                        and i > 0), len(block) - 1)
            return "\n".join(block[max(0, end - lines + 1): end + 1])
    return next((t for t in texts if t), "")


def job_outcome(job_id: str) -> Outcome:
    """How a job stands or ended, with the cause of a failure (last traceback lines)."""
    card = find_card(str(job_id))
    if card.backend == "slurm":
        row = _sacct(card.job_id) or _squeue_state(card)
        outcome = Outcome(card.job_id, row["state"], row.get("exit_code", ""), row.get("elapsed", ""))
    else:
        outcome = _local_outcome(card)
    if outcome.state == "FAILED":
        outcome.cause = traceback_tail(card)
        if TIMED_OUT in outcome.cause:
            outcome.state = "TIMEOUT"
        elif any(marker in outcome.cause for marker in MEMORY_ERRORS):
            outcome.state = "OUT_OF_MEMORY"
    if outcome.state == "TIMEOUT":
        outcome.cause = f"the job reached its time limit ({format_seconds(card.time_seconds)}) and was stopped"
    elif outcome.state == "CANCELLED":
        outcome.cause = "the job was cancelled"
    return outcome


def _local_outcome(card: JobCard) -> Outcome:
    started = card.launcher_note("started").get("started_at")
    if local_alive(card):
        waiting = card.launcher_note("waiting")
        if waiting or not started:
            return Outcome(card.job_id, "PENDING", cause=waiting.get("reason", "waiting for its devices"))
        return Outcome(card.job_id, "RUNNING", elapsed=hms(time.time() - started))
    started = started or card.submitted_at
    ended = max((card.log_path(t).stat().st_mtime for t in range(card.tasks) if card.log_path(t).exists()),
                default=started)
    elapsed = hms(ended - started)
    if card.cancelled_at:
        return Outcome(card.job_id, "CANCELLED", elapsed=elapsed)
    result = _result(card)
    if result is not None and result[0] == "success":
        return Outcome(card.job_id, "COMPLETED", "0:0", elapsed)
    if ended - started >= card.time_seconds - 2:
        return Outcome(card.job_id, "TIMEOUT", elapsed=elapsed)
    return Outcome(card.job_id, "FAILED", "1:0", elapsed)


def hms(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def cancel(job_id: str) -> None:
    """Stop a job (scancel on Slurm, an interrupt to the local controller)."""
    card = find_card(str(job_id))
    if card.backend == "slurm":
        subprocess.run(["scancel", card.job_id], check=True, capture_output=True, timeout=30)
    elif local_alive(card):
        card.cancelled_at = time.time()
        card.save()
        os.kill(int(card.scheduler_id), signal.SIGINT)


def wait(job_ids, poll_s: float = 1.0, timeout_s: float | None = None) -> list[Outcome]:
    """Block until the jobs have ended; returns their outcomes."""
    ids = [job_ids] if isinstance(job_ids, str) else list(job_ids)
    start = time.time()
    while True:
        outcomes = [job_outcome(i) for i in ids]
        if all(o.finished for o in outcomes):
            return outcomes
        if timeout_s is not None and time.time() - start > timeout_s:
            raise TimeoutError(f"jobs still running after {timeout_s:.0f} s: "
                               + ", ".join(o.job_id for o in outcomes if not o.finished))
        time.sleep(poll_s)
