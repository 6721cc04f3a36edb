"""Submitted jobs: their cards on disk, their logs, their state and how they ended.

Every job gets a card `<log folder>/<name>/<job_id>_job.json` (a Slurm job: `<job_id>@<cluster>_job.json`,
job ids of two clusters collide) next to submitit's logs (`<job_id>_<task>_log.out|err`, and
`<job_id>_submission.sh` on Slurm), so a notebook reopened tomorrow still finds its jobs.

Nothing read from a job folder is unpickled (it may be another user's, read by the class report): a job's
outcome comes from the scheduler and from JSON the kit writes (`<job>_<task>_usage.json`), read as regular
files only (never a FIFO, a device or a symbolic link), and never more than a bounded size.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..in_job import untrusted
from ..in_job.jobenv import EXIT_OUT_OF_MEMORY, EXIT_PEER_FAILED, EXIT_REFUSED
from .jobspec import format_seconds
from .profiles import current_profile

# NO_ANSWER is the kit's, not Slurm's: the scheduler did not answer, so the job's state is not known right now
NO_ANSWER = "NO_ANSWER"
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", NO_ANSWER}
REQUEUED_AFTER = {"NODE_FAIL", "PREEMPTED"}  # ends of one attempt after which Slurm (--requeue) queues the job again
# submitit's words when the time-limit signal stops a job: the first line comes as the signal arrives, the
# second as it gives up; a job that exits in between ends FAILED in Slurm's accounting, not TIMEOUT
TIMED_OUT_SIGNS = ("this job is timed-out", "timed-out and not checkpointable")
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
    cluster: str = ""  # the Slurm cluster's name (ClusterName): job ids are the cluster's own; "" locally
    # how the course means the job to end, {state: why}, when not simply COMPLETED: a demonstration that fails by
    # design (TP4.2's DDP out of memory); {}: COMPLETED
    expected: dict = field(default_factory=dict)

    @property
    def scheduler_id(self) -> str:
        return self.native_id or self.job_id

    @property
    def path(self) -> Path:
        return Path(self.folder) / (f"{self.job_id}@{self.cluster}_job.json" if self.cluster else
                                    f"{self.job_id}_job.json")

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)

    def log_path(self, task: int = 0, err: bool = False) -> Path:
        return Path(self.folder) / f"{self.scheduler_id}_{task}_log.{'err' if err else 'out'}"

    def launcher_note(self, kind: str) -> dict:
        """A note written beside the job: the local launcher's (`waiting`, `started`...) or its task's (`history`
        of a job that requeued itself, dlokit.race.requeue); {} when absent or unreadable."""
        try:
            value = untrusted.read_json(Path(self.folder) / f"{self.scheduler_id}_{kind}.json")
        except OSError:
            return {}
        return value if isinstance(value, dict) else {}

    @property
    def run_dir(self) -> Path:
        """Where the job's records are: `<runs>/<job id>`, `<runs>/<job id>@<cluster>` for a Slurm job (its run id,
        dlokit.in_job.runrecord.slurm_run_id)."""
        return Path(self.runs_dir) / (f"{self.job_id}@{self.cluster}" if self.cluster else self.job_id)


@dataclass
class Outcome:
    job_id: str
    state: str  # COMPLETED, FAILED, TIMEOUT, CANCELLED, OUT_OF_MEMORY, RUNNING, PENDING, UNKNOWN
    exit_code: str = ""
    elapsed: str = ""
    cause: str = ""  # the last lines of the traceback, or why the job stopped
    expected: str = ""  # why, when the job failed as its card expected (a demonstration); see JobCard.expected
    error: str = ""  # a FAILED job's exception line, with the student's file and line it was raised through

    @property
    def finished(self) -> bool:
        return self.state not in ACTIVE

    @property
    def shown_state(self) -> str:
        """The state as a student reads it: 'OUT_OF_MEMORY: failed as expected (why)' for a failure by design."""
        return f"{self.state}: failed as expected ({self.expected})" if self.expected else self.state

    def __str__(self) -> str:
        head = f"job {self.job_id}: {self.shown_state}" + (f" (exit {self.exit_code})" if self.exit_code else "")
        return head + (f"\n{self.cause}" if self.cause else "")


ENDS = ("COMPLETED", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "CANCELLED")  # the states a job can be meant to end in


def expected_ends(expected) -> dict[str, str]:
    """A submit's `expected` checked: {state: why}, each state one of ENDS, each failure with its why (the job card
    and the queue show it: "failed as expected (why)"). None or {}: the job is meant to complete."""
    if not expected:
        return {}
    if not isinstance(expected, dict):
        raise ValueError(f"expected: {{state: why}}, e.g. {{'OUT_OF_MEMORY': 'DDP keeps a whole copy per rank'}}, "
                         f"not {expected!r}")
    for state, why in expected.items():
        if state not in ENDS:
            raise ValueError(f"expected: unknown state {state!r}; one of {', '.join(ENDS)}")
        if state != "COMPLETED" and not (isinstance(why, str) and why.strip()):
            raise ValueError(f"expected: say why the job is meant to end {state} (the student reads it)")
    return {state: str(why or "").strip() for state, why in expected.items()}


def as_expected(card: JobCard, outcome: Outcome) -> Outcome:
    """The outcome read against what its card expected: a failure by design carries its why; an end the card did
    not expect (a demonstration that completed) says what was expected. The card may be another user's: only
    {str: str} entries count."""
    meant = {k: v for k, v in card.expected.items() if isinstance(k, str) and isinstance(v, str)}
    if not meant or not outcome.finished:
        return outcome
    if outcome.state in meant and outcome.state != "COMPLETED":
        outcome.expected = meant[outcome.state][:300]
    elif outcome.state not in meant:
        wanted = " or ".join(f"{state} ({why})" if why else state for state, why in meant.items())
        outcome.cause = "\n".join(t for t in (outcome.cause, f"the course expected this job to end {wanted}"[:600]) if t)
    return outcome


def remember(card: JobCard, job) -> None:
    _live_jobs[card.job_id] = job


# ---- job cards on disk ------------------------------------------------------------------------

MAX_TASKS = 65536  # a card asking for more tasks is not one the kit wrote (and would make loops endless)
_CARD_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "float | None": (int, float, type(None)),
               "list": (list,), "dict": (dict,)}


class BadCard(ValueError):
    """A job card file that is not a card the kit wrote; str() says which file and why."""


def load_card(path: Path) -> JobCard:
    """The JobCard in a `<job_id>_job.json`; BadCard naming the file and why when it is not one
    (unreadable, not a regular file, not UTF-8, truncated JSON, not an object, a field missing or of the
    wrong type). Fields the card has and this kit does not know (a newer kit's) are ignored."""
    import dataclasses

    try:
        value = untrusted.read_json(path)
    except untrusted.Refused as error:
        raise BadCard(f"{path}: {error.why}") from None
    except OSError as error:
        raise BadCard(f"{path}: cannot be read ({error.strerror or error})") from None
    if not isinstance(value, dict):
        raise BadCard(f"{path}: not a JSON object ({type(value).__name__})")
    known = {f.name: f for f in dataclasses.fields(JobCard)}
    fields = {}
    for name, spec in known.items():
        if name not in value:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise BadCard(f"{path}: no '{name}' field")
            continue
        field_value, types = value[name], _CARD_TYPES.get(str(spec.type))
        if types and (not isinstance(field_value, types) or (isinstance(field_value, bool) and bool not in types)):
            raise BadCard(f"{path}: '{name}' is {type(field_value).__name__}, not {spec.type}")
        fields[name] = field_value
    card = JobCard(**fields)
    if not JOB_ID_PATTERN.fullmatch(card.job_id) or (card.native_id and not JOB_ID_PATTERN.fullmatch(card.native_id)):
        raise BadCard(f"{path}: job id {card.job_id!r} / {card.native_id!r} is not a job id")
    if card.cluster and not JOB_ID_PATTERN.fullmatch(card.cluster):
        raise BadCard(f"{path}: cluster {card.cluster!r} is not a cluster name")
    if not 0 <= card.tasks <= MAX_TASKS:
        raise BadCard(f"{path}: {card.tasks} tasks")
    return card


def all_cards(name: str | None = None, log_dir: Path | None = None) -> list[JobCard]:
    """Every readable job card (of the jobs named `name`), oldest first; a broken card is left out
    (find_card says what is wrong with it)."""
    root = log_dir or current_profile().logs
    patterns = [f"{name}/*_job.json", f"{name}@*/*_job.json"] if name else ["*/*_job.json"]  # name@cluster: Slurm's
    cards = []
    for path in sorted(path for pattern in patterns for path in root.glob(pattern)):
        try:
            cards.append(load_card(path))
        except BadCard:
            continue
    return sorted(cards, key=lambda c: c.submitted_at)


JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # bounded: it becomes a file name
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}(@[a-z0-9][a-z0-9_.-]{0,63})?")  # a Slurm job's: @cluster


def check_job_id(job_id) -> str:
    """A job id as text, refused if it could act as a file pattern ('*', '?', '[', '/')."""
    text = str(job_id).strip()
    if not JOB_ID_PATTERN.fullmatch(text):
        raise ValueError(f"{job_id!r} is not a job id: ids are letters, digits, '_', '-' and '.', "
                         "as returned by gpu_jobs_submitter")
    return text


_clusters: dict[tuple, str] = {}  # ClusterName by (SLURM_CONF, its mtime): asked once per configuration


def job_folder(profile, name: str) -> Path:
    """Where a job's card and logs go: `<logs>/<name>`, on Slurm `<logs>/<name>@<cluster>` (another cluster's job of
    the same name and id must not write over this one's logs)."""
    cluster = current_cluster() if profile.backend == "slurm" else ""
    return profile.logs / (f"{name}@{cluster}" if cluster else name)


def current_cluster() -> str:
    """The name of the Slurm cluster this session talks to (ClusterName in its slurm.conf, else from
    `scontrol show config`); "" where there is none, or it cannot be known."""
    conf = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        key = (str(conf), conf.stat().st_mtime)
    except OSError:
        key = (str(conf), None)
    if key not in _clusters:
        _clusters[key] = _cluster_name(conf, key[1] is not None)
    return _clusters[key]


def _cluster_name(conf: Path, exists: bool) -> str:
    """ClusterName from the slurm.conf file, or from the controller when there is no file (configless Slurm)."""
    if exists:
        try:
            for line in untrusted.read_bytes(conf, owners=untrusted.ANYONE).decode(errors="replace").splitlines():
                name, _, value = line.split("#")[0].partition("=")
                if name.strip().lower() == "clustername" and value.strip():
                    return value.strip().lower()  # Slurm lowers it too
        except OSError:
            pass
        return ""
    if os.environ.get("SLURM_CONF") or not shutil.which("scontrol"):
        return ""  # a missing SLURM_CONF: no cluster to ask
    try:  # configless Slurm: the controller knows
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    found = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.MULTILINE)
    return found.group(1).lower() if found else ""


def of_this_cluster(cards: list[JobCard]) -> list[JobCard]:
    """The cards of jobs of this session's Slurm cluster, and of jobs of no cluster (local ones); where the
    cluster is not known, those of the one cluster the cards name (none when they name several)."""
    here = current_cluster()
    named = {card.cluster for card in cards if card.cluster}
    if not here and len(named) == 1:
        here = named.pop()
    return [card for card in cards if card.cluster in ("", here)]


def find_card(job_id: str, log_dir: Path | None = None) -> JobCard:
    """The card of a job of this session's cluster (never another cluster's job of the same id); LookupError
    when there is none, or when its card is broken (naming the file and why)."""
    root = log_dir or current_profile().logs
    job_id = check_job_id(job_id)
    matches = sorted(root.glob(f"*/{job_id}_job.json")) + sorted(root.glob(f"*/{job_id}@*_job.json"))
    if not matches:
        raise LookupError(f"no job {job_id!r} under {root}: was it submitted with another profile or log folder?")
    cards, problems = [], []
    for path in matches:
        try:
            cards.append(load_card(path))
        except BadCard as error:
            problems.append(str(error))
    mine = sorted(of_this_cluster(cards), key=lambda card: not card.cluster)  # the cluster's own card first
    if mine:
        return mine[0]
    if cards:
        others = ", ".join(sorted({card.cluster for card in cards}))
        raise LookupError(f"job {job_id!r} under {root} is a job of Slurm cluster(s) {others}, not of this session's "
                          f"({current_cluster() or 'none known: SLURM_CONF'}): job ids are each cluster's own; "
                          "set SLURM_CONF to that cluster's slurm.conf to follow it")
    raise LookupError(f"job {job_id!r} has a broken job card: " + "; ".join(problems))


PLUMBING = ("submitit ", "The following command is sent:")  # what submitit says in a task's log, not the script


def script_line(card: JobCard, task: int = 0) -> str:
    """The last line the job's script printed (task 0), never submitit's plumbing; "starting" before any."""
    text = tail(card.log_path(task), 40)
    lines = [line for line in text.splitlines() if not line.startswith(PLUMBING)]
    return lines[-1] if lines else "starting"


def search_log(name: str | None = None, contains: str | None = None, with_err: bool = False,
               log_dir: Path | None = None) -> list[str]:
    """Log files of your jobs, job by job in submission order, then task 0, 1, ... (`[0]` is task 0 of
    the first job), filtered by job name and by a job id: `contains` is the job's id (or the scheduler's),
    or a whole part of it ('12' finds array job 12_3 and local job 1128-104259-e3c1 is found by 'e3c1'),
    never a piece of another number ('1' does not find job 12). Jobs of another Slurm cluster are left out."""
    root = log_dir or current_profile().logs
    if name is not None:
        check_name_like(name)
    suffixes = ("out", "err") if with_err else ("out",)
    cards = all_cards(name, root)
    if contains is not None:
        cards = [card for card in of_this_cluster(cards) if str(contains).strip() in _id_tokens(card)]
    paths = []
    for card in cards:
        for task in range(card.tasks):
            paths += [card.log_path(task, err=s == "err") for s in suffixes]
    return [str(p) for p in paths if p.exists()]


def _id_tokens(card: JobCard) -> set[str]:
    """The job's ids and their whole parts: '12_3' -> {'12_3', '12'}; '1128-104259-e3c1' -> it, 1128, 104259, e3c1."""
    tokens = set()
    for job_id in {card.job_id, card.scheduler_id}:
        tokens |= {job_id, job_id.split("_")[0], *re.split(r"[-.]", job_id)}
    return tokens - {""}


def check_name_like(name: str) -> None:
    if not JOB_ID_PATTERN.fullmatch(str(name)):
        raise ValueError(f"{name!r} is not a job name (letters, digits, '_', '-', '.')")


def tail(path: Path, lines: int = 1) -> str:
    """The last non-blank lines of a text file (of its last 8 KiB); "" when it cannot be read."""
    try:
        text = untrusted.read_tail(Path(path), 8192).decode(errors="replace")
    except OSError:  # absent, a folder, a FIFO, no permission
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

def _slurm_mb(text: str) -> float | None:
    """sacct's sizes ('572052K', '1.50G', '300M', '300Mn') -> MB."""
    match = re.fullmatch(r"([\d.]+)([KMGTP]?)[nc]?", (text or "").strip())
    if not match:
        return None
    return float(match.group(1)) * {"K": 1 / 1024, "": 1 / 1024 ** 2, "M": 1, "G": 1024, "T": 1024 ** 2,
                                     "P": 1024 ** 3}[match.group(2)]


def slurm_config_problem() -> str:
    """Why the Slurm commands cannot work here at all ('' when they may): SLURM_CONF naming a missing file
    (sacct and squeue would retry for a minute before saying so)."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():
        return (f"SLURM_CONF names {conf}, which is not a file: no Slurm command can reach the cluster (is the "
                "cluster's state folder gone? source its env.sh again, or unset SLURM_CONF)")
    return ""


PING_EVERY_S = 2.0  # how long the controller's answer to `scontrol ping` is trusted (a wait polls many jobs)
_pings: dict[str, tuple[float, str]] = {}


def controller_silence() -> str:
    """Why the Slurm controller cannot be asked now ('' when it answers): SLURM_CONF naming a missing file, or
    `scontrol ping` finding it DOWN, said at once (squeue retries 10 to 20 s before it gives up)."""
    problem = slurm_config_problem()
    if problem:
        return problem
    key = os.environ.get("SLURM_CONF", "")
    at, why = _pings.get(key, (0.0, ""))
    if time.time() - at < PING_EVERY_S:
        return why
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
        lines = [line for line in done.stdout.splitlines() if " is " in line]
        why = "" if done.returncode == 0 else f"scontrol ping: {lines[0].strip() if lines else said(done)}"
    except FileNotFoundError:
        why = ""  # no scontrol here: squeue says what it can
    except subprocess.TimeoutExpired as error:
        why = f"scontrol ping: {said(error)}"
    _pings[key] = (time.time(), why)
    return why


def said(answer) -> str:
    """The last line a Slurm command wrote on stderr (a CompletedProcess or a TimeoutExpired, whose stderr may be
    bytes), or what went wrong running it."""
    stderr = getattr(answer, "stderr", None)
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    lines = (stderr or "").strip().splitlines()
    if isinstance(answer, subprocess.TimeoutExpired):
        return f"no answer within {answer.timeout:.0f} s" + (f": {lines[-1]}" if lines else "")
    if isinstance(answer, BaseException):
        return str(answer)
    return lines[-1] if lines else "no message"


def _sacct(job_id: str) -> dict | None:
    """The job's accounting line, with its steps' peak memory (MaxRSS), the memory it asked for and its nodes;
    None when sacct does not answer."""
    if slurm_config_problem():
        return None
    try:
        # -D: every attempt of a requeued job, oldest first (without it, once the job waits again, only the new one)
        out = subprocess.run(["sacct", "-D", "-j", job_id, "-n", "-P", "-o",
                              "JobID,State,ExitCode,Elapsed,MaxRSS,ReqMem,NodeList"],
                             capture_output=True, text=True, timeout=20).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    row, peaks, attempts = None, [], []
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 7:
            continue
        jid, state, exit_code, elapsed, max_rss, req_mem, nodes = fields
        if jid == job_id:
            row = {"state": state.split()[0] if state.split() else "UNKNOWN", "exit_code": exit_code,
                   "elapsed": elapsed, "req_mem": req_mem, "nodes": nodes}
            attempts.append(row["state"])
        elif jid.startswith(job_id + ".") and _slurm_mb(max_rss) is not None:
            peaks.append(_slurm_mb(max_rss))
    if row is not None and peaks:
        row["peak_mb"] = max(peaks)
    if row is not None:  # how the attempt before this one ended, when Slurm requeued the job after it
        row["requeued_after"] = next((s for s in reversed(attempts[:-1]) if s in REQUEUED_AFTER), "")
    return row


def no_answer(why: str) -> dict:
    return {"state": NO_ANSWER, "cause": f"the Slurm controller did not answer ({why}): the job's state is not "
                                         "known; asking again later"}


def _squeue_state(card: JobCard) -> dict:
    """Before slurmdbd has the job, squeue knows it (with why a PENDING job waits); a job neither knows is
    UNKNOWN. A controller that does not answer (restarting, or down) makes the job NO_ANSWER, not lost: its state
    is not known, and the cause says so (wait() gives up when that lasts)."""
    silence = controller_silence()
    if silence:
        return no_answer(silence)
    try:  # -t all: also a job that ended a moment ago (MinJobAge), which sacct may still show RUNNING
        done = subprocess.run(["squeue", "-h", "-t", "all", "-j", card.job_id, "-o", "%T|%M|%r"],
                              capture_output=True, text=True, timeout=20)
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        return no_answer(f"squeue: {said(error)}")
    out = [line for line in done.stdout.split("\n") if line.strip()]
    if out:
        state, elapsed, reason = (out[0].split("|") + ["", ""])[:3]
        row = {"state": state, "elapsed": elapsed, "seen": True}
        if state == "PENDING" and reason and reason != "None":
            row["cause"] = f"waiting: {reason} (Slurm's reason)"
        return row
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        return no_answer(f"squeue: {textwrap.shorten(said(done), 300)}")
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


def usage_record(card: JobCard, task: int) -> tuple[dict | None, str]:
    """What a task wrote as it ended, `<job>_<task>_usage.json` (dlokit.in_job.task: its return code, peak memory
    and limit): (the record, ""); (None, "") when there is none; (None, why) when the file is there but says
    nothing usable (empty, damaged, not the kit's, not a regular file): then how the task ended is not known."""
    path = Path(card.folder) / f"{card.scheduler_id}_{task}_usage.json"
    try:
        data = untrusted.read_bytes(path)
    except FileNotFoundError:
        return None, ""
    except OSError as error:
        return None, f"{path.name} was not read ({error.strerror or error})"
    if not data.strip():
        return None, f"{path.name} is empty or cut short"
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, f"{path.name} cannot be read (not JSON: cut short or damaged)"
    code = value.get("returncode") if isinstance(value, dict) else None
    if not isinstance(code, int) or isinstance(code, bool):
        return None, f"{path.name} is not the kit's usage record (no integer 'returncode')"
    return value, ""


def _tasks_failed_first(card: JobCard) -> list[int]:
    """The job's tasks, those that ended with an error code first: their logs hold the cause; a task stopped
    after another one failed (exit code EXIT_PEER_FAILED, or its log holds only the stack dump of a SIGABRT)
    comes after."""
    codes = {task: _task_returncode(card, task) for task in range(card.tasks)}
    exited = [task for task, code in codes.items() if isinstance(code, int) and code > 0 and code != EXIT_PEER_FAILED]
    stopped = [task for task, code in codes.items() if code == EXIT_PEER_FAILED]
    killed = [task for task, code in codes.items() if isinstance(code, int) and code < 0]  # by a signal
    first = exited + stopped + killed
    return first + [task for task in codes if task not in first]


def _task_returncode(card: JobCard, task: int):
    record, _ = usage_record(card, task)
    return record["returncode"] if record else None


def _err_tails(card: JobCard) -> str:
    """The end of every task's error log (submitit writes its time-limit lines after the task's traceback)."""
    return "\n".join(tail(card.log_path(task, err=True), 40) for task in range(card.tasks))


SUBMITIT_FAILED = "submitit.core.utils.FailedJobError: "  # submitit's report of a task whose script failed
SCHEDULER_LINE = re.compile(r"^(srun|slurmstepd\S*): |^submitit (WARNING|ERROR|INFO) \(")  # written after it


def _error_logs(card: JobCard) -> list[str]:
    """The end of each task's error log, the tasks that failed first."""
    return [tail(card.log_path(task, err=True), 200) for task in _tasks_failed_first(card)]


def _traceback_block(text: str) -> list[str]:
    """A log's first traceback, from its head to its exception's line; [] when it has none."""
    if "Traceback" not in text:
        return []
    block = text[text.index("Traceback"):].splitlines()
    end = next((i for i, line in enumerate(block) if re.match(r"\S.*(Error|Exception|Interrupt)\b", line)
                and i > 0), len(block) - 1)
    if block[end].startswith(SUBMITIT_FAILED):  # its message is the script's whole stderr: the end says why
        end = max(i for i, line in enumerate(block) if line.strip() and not SCHEDULER_LINE.match(line))
    return block[:end + 1]


def traceback_tail(card: JobCard, lines: int = 6) -> str:
    """The end of the first task's traceback that says why it failed (user script first, then submitit's)."""
    texts = _error_logs(card)
    block = next((block for block in map(_traceback_block, texts) if block), [])
    return "\n".join(block[-lines:]) if block else next((t for t in texts if t), "")


FRAME_LINE = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)')


def student_error(card: JobCard) -> str:
    """A failed job's exception line with the last place of the student's files its traceback passed (the files the
    card hashed: the script and the modules of its folder), e.g. "NameError: name 'trace_dri' is not defined
    (train_classifier.py, line 312)"; '' when no task's log holds a traceback."""
    digests = card.extra.get("script_sha256")
    names = set(digests) if isinstance(digests, dict) else {Path(str(script)).name for script in card.argv[:1]}
    block = next((block for block in map(_traceback_block, _error_logs(card)) if block), [])
    if not block:
        return ""
    places = [(Path(m["path"]).name, m["line"]) for m in map(FRAME_LINE.match, block)
              if m and Path(m["path"]).name in names]
    error = textwrap.shorten(block[-1].removeprefix(SUBMITIT_FAILED).strip(), 300)
    return f"{error} ({places[-1][0]}, line {places[-1][1]})" if places else error


# what a job killed for memory leaves in its logs, besides MEMORY_ERRORS: an allocation refused under the
# local RLIMIT_DATA (torch, numpy), Slurm's jobacct_gather killing a step over its --mem
OUT_OF_MEMORY_SIGNS = MEMORY_ERRORS + ("Cannot allocate memory", "can't allocate memory", "exceeded memory limit",
                                       "Exceeded job memory limit", "Exceeded step memory limit")
DISK_FULL = ("No space left on device", "Disk quota exceeded", "the disk is full")
ARGPARSE_ERROR = re.compile(r"^\S+: error: ")
EXCEPTION_LINE = re.compile(r"^(\[rank\d+\]:\s*)?[A-Za-z_][\w.]*(Error|Exception)\b: ")  # RuntimeError: ..., [rank0]: ...
# the thread stacks Python's faulthandler writes (a stuck job's ranks write them before their message)
FAULTHANDLER_LINE = re.compile(
    r"^(Thread 0x|Current thread 0x|  File \"|  <no Python frame>|  \.\.\.$|Extension modules: |Fatal Python error: )")


def job_outcome(job_id: str, log_dir: Path | None = None) -> Outcome:
    """How a job stands or ended, with the cause of a failure: the script's own error message (argparse's
    `error:` line, not its usage block) or the last traceback lines; memory and disk named when they ran out.
    A race job that requeued itself (dlokit.race) says what each segment did. `log_dir`: another user's job
    folder (the class report), instead of the current profile's."""
    return card_outcome(find_card(str(job_id), log_dir))


# a job that ended and left no exit status: what it may mean
SILENT_END = ("ended without a word (no exit status was written: killed, e.g. SIGKILL, or the machine "
              "restarted)")


def card_outcome(card: JobCard) -> Outcome:
    """job_outcome of the job of this card (the class report passes the cards it found)."""
    here = current_cluster()
    if card.backend == "slurm" and card.cluster and here and card.cluster != here:
        return Outcome(card.job_id, "UNKNOWN", cause=f"a job of Slurm cluster {card.cluster}, not of this session's "
                                                     f"({here}): its state is that cluster's to tell")
    row: dict = {}
    if card.backend == "slurm":
        row = _slurm_row(card)
        outcome = Outcome(card.job_id, row["state"], row.get("exit_code", ""), row.get("elapsed", ""))
        outcome.cause = row.get("cause", "")
    else:
        outcome = _local_outcome(card)
    usage = _usage(card)
    if outcome.state == "FAILED":
        how = outcome.cause  # the local backend's word on how the job ended, when no exit status says it
        raw = traceback_tail(card)
        outcome.cause = _script_error(card) or _from_error_line(raw) or (
            _launcher_error(card) if card.backend != "slurm" else "")
        evidence = raw + "\n" + outcome.cause
        logs = raw + "\n" + _err_tails(card)
        if any(sign in logs for sign in TIMED_OUT_SIGNS):
            outcome.state = "TIMEOUT"
        elif any(u.get("returncode") == EXIT_REFUSED for u in usage):  # its input was refused, never loaded
            outcome.state = "REFUSED"
        elif (any(sign in evidence for sign in OUT_OF_MEMORY_SIGNS)
              or any(u.get("returncode") == EXIT_OUT_OF_MEMORY for u in usage)):  # a rank said so by its exit code
            outcome.state = "OUT_OF_MEMORY"
        elif any(sign in evidence for sign in DISK_FULL):
            outcome.cause = f"the disk is full (No space left on device): {_last_line(outcome.cause)}\n{outcome.cause}"
        killed = _killing_signal(outcome.exit_code, usage)
        if outcome.state == "FAILED" and (killed or how):
            # last: the class report shows a cause's last line
            said_how = f"killed by a signal ({_signal_name(killed)})" if killed else how
            if killed == signal.SIGKILL:
                said_how += ": not cancelled through the kit (a kill -9, or the kernel's out-of-memory killer)"
            outcome.cause = "\n".join(t for t in (outcome.cause, said_how + _last_step(card)) if t)
        stopped = card.launcher_note("stopped_tasks") if card.backend != "slurm" else {}
        if stopped:
            outcome.cause += (f"\n(task {stopped.get('failed_task')} failed with exit code {stopped.get('exit_code')}; "
                              "the tasks still running after it were stopped, as srun --kill-on-bad-exit does)")
    if outcome.state == "FAILED":
        outcome.error = student_error(card)
    if outcome.state == "OUT_OF_MEMORY":
        outcome.cause = _memory_cause(card, row, usage, outcome.cause or traceback_tail(card))
    elif outcome.state == "TIMEOUT":
        outcome.cause = f"the job reached its time limit ({format_seconds(card.time_seconds)}) and was stopped"
    elif outcome.state == "CANCELLED":
        outcome.cause = "the job was cancelled"
    elif outcome.state == "NODE_FAIL":
        outcome.cause = _node_failure(card, row)
    segments = card.launcher_note("history").get("lines") or []  # a job that requeued itself: what each run did
    outcome.cause = "\n".join(text for text in (outcome.cause, *segments) if text)
    return as_expected(card, outcome)


def _killing_signal(exit_code: str, usage: list[dict]) -> int:
    """The signal that ended the script, from a task's return code (-9) or Slurm's exit code ('0:9'); 0: none."""
    codes = [u["returncode"] for u in usage if isinstance(u.get("returncode"), int) and u["returncode"] < 0]
    if codes:
        return -codes[0]
    match = re.fullmatch(r"\d+:(\d+)", exit_code or "")
    return int(match.group(1)) if match else 0


def _last_step(card: JobCard) -> str:
    """'; its run record's last step: N' from the job's run record (rank 0), '' when there is none to read."""
    from ..in_job.runrecord import read_rank

    steps = [line.get("step") for line in read_rank(card.run_dir / "rank0")["metrics"] if line.get("kind") == "step"]
    numbers = [step for step in steps if isinstance(step, int) and not isinstance(step, bool)]
    return f"; its run record's last step: {max(numbers)}" if numbers else "; its run record has no step"


def _node_failure(card: JobCard, row: dict) -> str:
    """A node failed under the job: which one, where the run stopped, and how to go on from there."""
    nodes = row.get("nodes") or ""
    down = _nodes_down(nodes) if nodes else ""
    which = (f"node {down} failed while the job ran on it (NODE_FAIL; its nodes: {nodes})" if down else
             f"a node of the job ({nodes or 'unknown'}) failed while it ran (NODE_FAIL)")
    checkpoint = card.run_dir / "checkpoint.pt"
    resume = (f"submit the same command again with --resume {card.run_dir} (its last checkpoint)"
              if checkpoint.is_file() else
              "it left no checkpoint to resume from: submit it again (with --checkpoint-steps K the script saves "
              "one every K steps, and --resume RUN_FOLDER goes on from it)")
    return (f"{which}{_last_step(card)}: not the script's fault; {resume}; a race job (dlokit.race) requeues "
            "itself and resumes on its own")


def _nodes_down(nodes: str) -> str:
    """Which of these nodes Slurm holds down or unresponsive now (sinfo), '' when none or it cannot say."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-n", nodes, "-o", "%N|%T"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    down = sorted({name for name, _, state in (line.partition("|") for line in out.splitlines())
                   if state.startswith(("down", "fail", "drain")) or state.endswith("*")})
    return ",".join(down)


def _slurm_row(card: JobCard) -> dict:
    """sacct's line for a finished job; squeue's while the controller has the job (it knows first that the
    job waits, and why, or that it just ended); then sacct's once slurmdbd has the end (exit code, MaxRSS).
    A controller that does not answer makes an active job NO_ANSWER, whatever sacct last said of it (a job whose
    script ended while slurmctld was down stays RUNNING in sacct until the controller is back)."""
    row = _sacct(card.job_id)
    ended = row and (row["state"] if row["state"] in REQUEUED_AFTER else row.get("requeued_after"))
    if ended:  # an attempt's end; the job itself may wait to rerun
        live = _squeue_state(card)
        waits = live["state"] in ACTIVE if row["state"] in REQUEUED_AFTER else live["state"] in ("PENDING", "REQUEUED")
        if live.get("seen") and waits:
            why = live.get("cause", "").removeprefix("waiting: ")
            return {**live, "cause": f"requeued after {ended}: waits to run again" + (f" ({why})" if why else "")}
    if row is not None and row["state"] not in ACTIVE:
        return row
    live = _squeue_state(card)
    if live["state"] == NO_ANSWER:
        last = f" (sacct last said {row['state']})" if row else ""
        return {**(row or {}), **live, "cause": live["cause"].replace("; asking", f"{last}; asking", 1)}
    if row is not None and not live.get("seen"):
        return {**row, **({"cause": live["cause"]} if row["state"] == "PENDING" and "cause" in live else {})}
    if live["state"] in ACTIVE | {"UNKNOWN"}:
        return {**(row or {}), **live}
    deadline = time.time() + 10
    while time.time() < deadline:  # ended: its accounting comes a moment later
        time.sleep(0.5)
        row = _sacct(card.job_id)
        if row is not None and row["state"] not in ACTIVE:
            return row
    return live


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_line(text: str) -> str:
    return next((line for line in reversed(text.splitlines()) if line.strip()), "").strip()


def _usage(card: JobCard) -> list[dict]:
    """What each task wrote in `<job>_<task>_usage.json` (peak memory, limit, return code), where it could."""
    return [record for record, _ in (usage_record(card, task) for task in range(card.tasks)) if record]


def _launcher_error(card: JobCard) -> str:
    """Why the local launcher itself failed, before the script could start (its log's last traceback lines)."""
    text = tail(Path(card.folder) / f"{card.scheduler_id}_launcher.log", 4000)
    if "Traceback" not in text:
        return ""
    lines = [line for line in text.split("Traceback")[-1].splitlines()[1:] if line.strip()]
    return "the job's launcher failed before the script started: " + "\n".join(lines[-3:])


def _from_error_line(text: str) -> str:
    """A traceback's tail shown from its exception's line on, when that line and one after it are in it (PyTorch's
    reducer error runs to a page: its start says what went wrong); the whole tail otherwise."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if EXCEPTION_LINE.match(line)), 0)
    return "\n".join(lines[start:]) if start and len(lines) - start >= 2 else text


def _script_error(card: JobCard) -> str:
    """The script's own last error line(s) when it printed no traceback: argparse's `prog: error: ...`
    without the usage block above it, or its last stderr lines ('' when it printed a traceback)."""
    for task in _tasks_failed_first(card):
        text = tail(card.log_path(task, err=True), 200)
        script_part = text.split("submitit ERROR (")[0]  # what the script printed, before submitit's report
        # a traceback whose head the bounded read cut off still ends in its exception's line: traceback_tail's
        if not script_part.strip() or "Traceback" in script_part or any(
                EXCEPTION_LINE.match(line) for line in script_part.splitlines()):
            continue
        lines = [line for line in script_part.splitlines() if line.strip() and not FAULTHANDLER_LINE.match(line)]
        if not lines:
            continue
        errors = [i for i, line in enumerate(lines) if ARGPARSE_ERROR.match(line)]
        return "\n".join(lines[errors[-1]:] if errors else lines[-3:])
    return ""


def _memory_cause(card: JobCard, row: dict, usage: list[dict], detail: str) -> str:
    """Out of memory, with the peak the job reached and the limit it had."""
    peaks = [u["peak_rss_mb"] for u in usage if isinstance(u.get("peak_rss_mb"), (int, float))]
    task_peak = f"peak {max(peaks):.0f} MB (largest process of a task)" if peaks else "peak unknown"
    if card.backend == "slurm":
        # what the job asked for, as submitted (sacct's ReqMem can read oddly, e.g. "16?", before it settles)
        asked = card.extra.get("mem") or (card.extra.get("mem_per_cpu") and f"{card.extra['mem_per_cpu']} per CPU")
        if not asked and re.fullmatch(r"\d+(\.\d+)?[KMGT]?[nc]?", str(row.get("req_mem", ""))):
            asked = row["req_mem"]
        limit = f"its memory request {asked}" if asked else "the memory it was given"
        where = "use_profile(..., mem='32G') asks for more"
        measured = f"peak {row['peak_mb']:.0f} MB (sacct MaxRSS)" if row.get("peak_mb") else task_peak
    else:
        limits = [u["mem_limit_mb"] for u in usage if u.get("mem_limit_mb")]
        limit = f"the limit of {max(limits)} MB per task" if limits else "the machine's memory"
        where = f"use_profile({card.profile!r}, mem='16G') sets the job's limit"
        measured = task_peak
        exceeded = card.launcher_note("memory_exceeded")
        if exceeded:
            measured = (f"its {exceeded.get('processes')} processes (scripts and their children) held "
                        f"{exceeded.get('peak_mb'):.0f} MB together")
            limit = f"the job's limit of {exceeded.get('limit_mb')} MB"
    from .week import option_groups

    own = (dict(option_groups(card.argv)).get("--memory-limit") or [None])[0]  # train_llm.py's device-sized limit
    refused = ("can't allocate memory", "cuda out of memory")  # PyTorch's CPU allocator, the CUDA allocator
    if own is not None and any(words in detail.lower() for words in refused):  # the script's own limit, not the job's
        return (f"out of memory under the script's own --memory-limit of {own} MiB per rank (what its TP set), not "
                f"the job's ({measured}, against {limit}); a larger --memory-limit or a smaller batch fits\n"
                f"{detail}").rstrip()
    return f"out of memory: {measured}, against {limit}; {where}\n{detail}".rstrip()


def _local_outcome(card: JobCard) -> Outcome:
    """A local job's state: its launcher's notes while it lives, then what each task wrote as it ended (the
    usage records): COMPLETED when every task's script returned 0, never guessed from what is missing."""
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
    if card.cancelled_at or card.launcher_note("cancelled"):
        return Outcome(card.job_id, "CANCELLED", elapsed=elapsed)
    if card.launcher_note("memory_exceeded"):  # the job's processes together went past its limit
        return Outcome(card.job_id, "OUT_OF_MEMORY", "0:9", elapsed)
    records, problems = zip(*(usage_record(card, task) for task in range(card.tasks))) if card.tasks else ((), ())
    problem = next((p for p in problems if p), "")
    if problem:  # never COMPLETED nor FAILED on a record that cannot be read
        return Outcome(card.job_id, "UNKNOWN", elapsed=elapsed,
                       cause=f"how the job ended is not known: {problem}; look at its log "
                             f"(dlokit.search_log(contains='{card.job_id}', with_err=True))")
    codes = [record["returncode"] if record else None for record in records]
    if codes and all(code == 0 for code in codes):
        return Outcome(card.job_id, "COMPLETED", "0:0", elapsed)
    if ended - started >= card.time_seconds - 2:
        return Outcome(card.job_id, "TIMEOUT", elapsed=elapsed)
    failed = [code for code in codes if code]
    if not failed:  # a task that wrote no exit status: killed with its task, or the machine went down
        return Outcome(card.job_id, "FAILED", elapsed=elapsed, cause=SILENT_END)
    code = failed[0]  # as Slurm writes it: exit code:signal
    return Outcome(card.job_id, "FAILED", f"{code}:0" if code > 0 else f"0:{-code}", elapsed)


def hms(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def cancel(job_id: str, why: str = "") -> None:
    """Stop a job: scancel on Slurm; SIGTERM to the local launcher, which stops the tasks and their scripts
    (their run records say "cancelled"). `why`, for a cancel the kit meant (an HPO trial its pruner stopped), goes on
    the card first: the job then reads "CANCELLED: failed as expected (why)", never as a student's failure. Prints
    nothing."""
    card = find_card(str(job_id))
    if why:
        card.expected = {**card.expected, "CANCELLED": why}
        card.save()
    if card.backend == "slurm":
        subprocess.run(["scancel", card.job_id], check=True, capture_output=True, timeout=30)
    elif local_alive(card):
        card.cancelled_at = time.time()
        card.save()
        os.kill(int(card.scheduler_id), signal.SIGTERM)


class SchedulerError(RuntimeError):
    """The scheduler has not answered for a while: the jobs' states cannot be known."""


def wait(job_ids, poll_s: float = 1.0, timeout_s: float | None = None, no_answer_s: float = 120.0) -> list[Outcome]:
    """Block until the jobs have ended; returns their outcomes. Raises SchedulerError when the scheduler has
    not answered about a job for `no_answer_s` seconds (a controller restart takes less)."""
    ids = [job_ids] if isinstance(job_ids, str) else list(job_ids)
    start = time.time()
    silent_since: dict[str, float] = {}
    while True:
        outcomes = [job_outcome(i) for i in ids]
        if all(o.finished for o in outcomes):
            return outcomes
        for o in outcomes:
            if o.state != NO_ANSWER:
                silent_since.pop(o.job_id, None)
            elif time.time() - silent_since.setdefault(o.job_id, time.time()) > no_answer_s:
                raise SchedulerError(f"job {o.job_id}: {o.cause.split('; asking')[0]}, for {no_answer_s:.0f} s: "
                                     "stopped waiting. The job may still run: once the controller is back, "
                                     f"dlokit.job_outcome({o.job_id!r}) says how it stands")
        if timeout_s is not None and time.time() - start > timeout_s:
            raise TimeoutError(f"jobs still running after {timeout_s:.0f} s: "
                               + ", ".join(f"{o.job_id} ({o.state}{': ' + o.cause if o.cause else ''})"
                                           for o in outcomes if not o.finished))
        time.sleep(poll_s)
