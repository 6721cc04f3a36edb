"""The doctor's jobs: each submits helpers/dlokit/doctor/probe.py through the profile, exactly as a course cell
submits a training script, and turns what the job said (its log lines, its outcome) into Findings."""
from __future__ import annotations

import json
import re
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

from submitit.core.utils import FailedJobError, FailedSubmissionError

from ..submission import jobs
from ..submission.jobspec import JobSpec, JobSpecError
from ..submission.profiles import with_overrides
from ..submission.submit import submit
from .probe import MARK
from .report import CHECKS, failed, not_checked, passed

PROBE = Path(__file__).with_name("probe.py")
NAME = "doctor"
# sbatch's refusals -> the profile setting to change
REFUSALS = [("account", "account"), ("partition", "partition"), ("qos", "qos"), ("feature", "constraint"),
            ("constraint", "constraint"), ("memory", "mem")]


class Refused(Exception):
    """The job was not accepted: by the kit's own checks or by the scheduler (sbatch's message)."""


SETUP_DONE = "DLOKIT_DOCTOR setup done"  # echoed after the profile's setup lines: what precedes it on stderr is theirs


def submit_probe(profile, kind: str, *args: str, n_gpu: int = 1, time_max: str = "00:05:00") -> jobs.JobCard:
    echo = f"echo {shlex.quote(SETUP_DONE)} >&2"
    if profile.setup:
        profile = with_overrides(profile, setup=(*profile.setup, echo))
    spec = JobSpec(script=str(PROBE), args=(kind, *args), name=NAME, n_gpu=n_gpu, time_max=time_max, alone=False)
    try:
        return submit(spec, profile, verbose=False)[0]
    except (JobSpecError, FailedJobError, FailedSubmissionError, subprocess.CalledProcessError) as err:
        raise Refused(" ".join(str(err).replace(f"; {echo}", "").split())[:600]) from None


def refusal_fix(message: str, profile_name: str) -> str:
    lowered = message.lower()
    for word, setting in REFUSALS:
        if word in lowered:
            return f"set {setting} in the profile to a value the cluster accepts for you (sacctmgr show assoc " \
                   "user=$USER lists your accounts and QOS; sinfo the partitions and features)"
    return (f"read the message; `dlokit preview --profile {profile_name} train_classifier.py` prints the batch script "
            "a job gets")


def said(card: jobs.JobCard) -> list[dict]:
    """The probe's lines from every task's log."""
    lines = []
    for task in range(card.tasks):
        try:
            text = card.log_path(task).read_text(errors="replace")
        except OSError:
            continue
        lines += [json.loads(line[len(MARK):]) for line in text.splitlines() if line.startswith(MARK)]
    return lines


def setup_errors(card: jobs.JobCard) -> list[str]:
    """What the profile's setup lines wrote on stderr (the batch script's, before srun starts the tasks)."""
    try:
        text = card.log_path(0, err=True).read_text(errors="replace")
    except OSError:
        return []
    if SETUP_DONE not in text:  # the setup never finished: what came before the tasks' own errors (srun's)
        head = text.split(MARK.strip() + " started")[0]
        return [line for line in head.splitlines() if line.strip() and not line.startswith("srun:")][:3]
    return [line for line in text.split(SETUP_DONE)[0].splitlines() if line.strip()]


def wait(cards, timeout_s: float = 600) -> list[jobs.Outcome]:
    """The jobs' outcomes; a job still queued or running after timeout_s is cancelled and reads so."""
    try:
        return jobs.wait([c.job_id for c in cards], poll_s=1.0, timeout_s=timeout_s)
    except (TimeoutError, jobs.SchedulerError) as err:
        outcomes = [jobs.job_outcome(c.job_id) for c in cards]
        for card, outcome in zip(cards, outcomes):
            if not outcome.finished:
                jobs.cancel(card.job_id)
        return [o if o.finished else jobs.Outcome(o.job_id, o.state, cause=f"not over after {timeout_s:.0f} s, "
                                                  f"cancelled ({err}); a busy partition? a reservation (sbatch = "
                                                  "{ reservation = ... }) keeps the class's nodes free")
                for o in outcomes]


def write_tokens(profile) -> tuple[str, list[Path]]:
    """A file in the log folder and one in the runs folder, written here, that the node reads and answers."""
    token = secrets.token_hex(6)
    paths = [profile.logs / NAME / f"{token}.login", profile.runs / "doctor" / f"{token}.login"]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token)
    return token, paths


def env_findings(profile, card, outcome, token, paths) -> list:
    """The 1-task job: it ran, its setup lines, its python, the two shared folders."""
    findings = []
    lines = [line for line in said(card) if line.get("probe") == "env"]
    if not card.log_path(0).exists() and not card.log_path(0, err=True).exists():
        findings.append(failed("log folder", f"job {card.job_id} ended {outcome.state} without writing its log in "
                                             f"{card.folder}: the node cannot write there",
                               "set log_dir in the profile (or DLOKIT_LOG_DIR) to a folder of a filesystem the "
                               "nodes mount and you can write (e.g. under $WORK or $HOME)"))
    errors = setup_errors(card) if profile.setup else []
    if outcome.state != "COMPLETED" or not lines:
        cause = " ".join((outcome.cause or " ".join(errors)).split())[:500] or "nothing in its log"
        findings.append(failed("job", f"job {card.job_id} ended {outcome.state}: {cause}",
                               "the lines below say which setting of the profile; fix that first"))
    else:
        findings.append(passed("job", f"job {card.job_id} ran on {lines[0]['host']} and completed in {outcome.elapsed}"
                               if outcome.elapsed else f"job {card.job_id} ran on {lines[0]['host']} and completed"))
    if errors:
        findings.append(failed("setup lines", f"the job's setup said: {' | '.join(errors[:3])[:400]}",
                               f"correct the profile's setup lines ({'; '.join(profile.setup) or 'none'}): e.g. "
                               "`module avail` on a node lists the modules that exist"))
    elif not profile.setup:
        findings.append(passed("setup lines", "the profile has none"))
    elif lines:
        findings.append(passed("setup lines", f"ran without an error: {'; '.join(profile.setup)}"))
    findings.append(_python(profile, lines[0] if lines else None, outcome, card))
    if lines:
        for label, path in zip(("log folder", "runs folder"), paths):
            findings.append(_shared(label, path, lines[0]["shared"].get(str(path), ""), token))
    elif not any(f.check == "log folder" for f in findings):
        findings += [not_checked("log folder", "the job did not run"), not_checked("runs folder", "the job did not run")]
    return sorted(findings, key=lambda f: list(CHECKS).index(f.check))


def _python(profile, line, outcome, card):
    node_python = profile.python or sys.executable
    fix = (f"set python in the profile to an interpreter that has the kit installed (this one: {sys.executable}), "
           "or load the module that provides it in setup")
    if line is None:
        try:
            text = outcome.cause + " " + card.log_path(0, err=True).read_text(errors="replace")
        except OSError:
            text = outcome.cause
        missing = re.search(r"No module named '?([\w.]+)'?", text)
        if missing:
            return failed("python on the nodes", f"{node_python} cannot import {missing.group(1)} on the node", fix)
        return not_checked("python on the nodes", "the job did not run")
    import dlokit
    import torch

    problems = [f"{line.get(m + '_error')}" for m in ("torch", "dlokit", "submitit") if line.get(m + "_error")]
    if problems:
        return failed("python on the nodes", f"{line['python']}: {'; '.join(problems)}", fix)
    here = {"torch": torch.__version__, "dlokit": dlokit.__version__}
    differ = [f"{m} {line[m]} on the node, {v} here" for m, v in here.items() if line.get(m) != v]
    if differ:
        return failed("python on the nodes", "; ".join(differ),
                      "install the same versions on both sides (the nodes' python is the profile's `python`)")
    return passed("python on the nodes", f"{line['python']}: python {line['python_version']}, torch {line['torch']}, "
                                         f"dlokit {line['dlokit']}, {line.get('gpus', 0)} GPU(s) visible")


def _shared(label: str, path: Path, read_on_node: str, token: str):
    fix = (f"set {'log_dir' if label == 'log folder' else 'runs_dir'} in the profile to a folder on a filesystem "
           "that the login node and the nodes share (not /tmp, not a node-local disk)")
    if read_on_node != token:
        return failed(label, f"the node could not read {path}, written here: {read_on_node or 'another content'}", fix)
    answer = path.with_suffix(".node")
    if not answer.exists():
        return failed(label, f"the node wrote {answer}, which this machine does not see", fix)
    return passed(label, f"{path.parent}: written here, read on {answer.read_text()}, and the other way round")


def _said_if_completed(check, card, outcome, fix, probe=None):
    """(the probe's lines, None) from a completed job; else (None, a failed finding with the job's end)."""
    lines = [line for line in said(card) if probe is None or line.get("probe") == probe]
    if outcome.state != "COMPLETED" or not lines:
        return None, failed(check, f"{outcome.state}: {outcome.cause[:400]}", fix)
    return lines, None


NETWORK_FIX = ("read the job's log (dlokit.job_outcome and search_log); a firewall between nodes or a wrong network "
               "interface (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) are common causes")


def all_reduce_finding(check, card, outcome, across_nodes=False):
    """Every task of the job added rank + 1 in one all-reduce ("2 tasks", or "2 nodes" with ranks on 2 hosts)."""
    lines, problem = _said_if_completed(check, card, outcome, NETWORK_FIX, probe="ranks")
    if problem:
        return problem
    if len(lines) < card.tasks:
        return failed(check, f"{len(lines)} of {card.tasks} ranks said what they summed", NETWORK_FIX)
    expected = card.tasks * (card.tasks + 1) / 2
    wrong = [line for line in lines if line["sum"] != expected]
    if wrong:
        return failed(check, f"all-reduce gave {wrong[0]['sum']}, not {expected}", "report it to the site")
    hosts = sorted({line["host"] for line in lines})
    if across_nodes and len(hosts) < 2:
        return failed(check, f"every rank ran on {hosts[0]}", "the profile's gpus_per_node should match the nodes")
    bandwidth = [line["bus_gb_s"] for line in lines if "bus_gb_s" in line]
    return passed(check, f"{len(lines)} ranks on {', '.join(hosts)} all-reduced with {lines[0]['backend']}"
                         + (f", bus bandwidth {min(bandwidth)} GB/s (64 MiB)" if bandwidth else ""))


def cancel_finding(card):
    """Cancel the sleeping job once it runs (or after 2 minutes in the queue); it must read CANCELLED."""
    deadline = time.time() + 120
    while not _started(card) and time.time() < deadline and not jobs.job_outcome(card.job_id).finished:
        time.sleep(1)
    running = _started(card)
    jobs.cancel(card.job_id)
    [outcome] = wait([card], timeout_s=120)
    if outcome.state != "CANCELLED":
        return failed("cancel", f"the cancelled job reads {outcome.state} ({outcome.cause[:200]})",
                      "the kit names a job's end from sacct (Slurm) or its launcher's note (local): see dlokit."
                      "job_outcome; report it with the job's log")
    return passed("cancel", f"job {card.job_id}, cancelled while {'running' if running else 'queued'}, reads CANCELLED")


def _started(card) -> bool:
    return any(line.get("probe") == "sleep" for line in said(card))


def timeout_finding(outcome, limit: str):
    if outcome.state != "TIMEOUT":
        return failed("time limit", f"a job with --time {limit} that sleeps past it ended {outcome.state} "
                                    f"({outcome.cause[:200]})",
                      "check the partition's time limits and OverTimeLimit (scontrol show config)")
    return passed("time limit", f"a job past its {limit} limit was stopped and reads TIMEOUT")


def gpu_finding(check, card, outcome, judge):
    """judge(line) -> (ok, message); a probe that skipped (no GPU on its node) is 'not checked'."""
    lines, problem = _said_if_completed(check, card, outcome, f"read the job's log: dlokit.job_outcome("
                                                              f"{card.job_id!r}) and search_log")
    if problem:
        return problem
    if "skip" in lines[0]:
        return not_checked(check, lines[0]["skip"])
    ok, message = judge(lines)
    return passed(check, message) if ok else failed(check, message, "report it to the site with the job's log")


def compile_finding(card, outcome):
    lines, problem = _said_if_completed("compile", card, outcome, "read the job's log")
    if problem:
        return problem
    return compile_judged(lines[0])


def compile_judged(line: dict):
    """The probe's line as a finding that names the device it compiled for (a CPU node's pass says nothing of Triton)."""
    on_gpu = line.get("device") == "cuda"
    where = f"on {line.get('gpu') or 'the GPU'} (Inductor's Triton kernels)" if on_gpu else \
        "on the CPU (Inductor's C++; no GPU in the job, so Triton was not tested)"
    if "error" in line:
        fix = ("install the triton that matches this torch (pip install triton; it ships with torch's CUDA wheels) "
               "and make TORCHINDUCTOR_CACHE_DIR a folder you can write") if on_gpu else \
            "install a C++ compiler on the nodes (g++; or load its module in setup) and make TORCHINDUCTOR_CACHE_DIR " \
            "a folder you can write"
        return failed("compile", f"{where}: {line['error']}", fix)
    if not line["same"]:
        return failed("compile", f"{where}: the compiled function's answer differs from eager's", "report it to the site")
    return passed("compile", f"compiled {where} and matched eager in {line['seconds']} s "
                             f"(cache {line['cache'] or 'default'})")


def data_finding(card, outcome, folder: str):
    lines, problem = _said_if_completed("data", card, outcome, "read the job's log")
    if problem:
        return problem
    line = lines[0]
    if folder:
        layout = line["layout"]
        empty = [split for split, seen in layout.items() if not seen["classes"] or not seen["images_in_first_classes"]]
        if empty:
            return failed("data", f"{folder} lacks {' and '.join(f'{s}/<class>/<images>' for s in empty)} on the node",
                          "point DATA at a folder with the ImageNet layout (train/ and val/, one folder per class), "
                          "or leave it None to generate one")
        return passed("data", f"{folder}: {layout['train']['classes']} classes in train/, {layout['val']['classes']} "
                              "in val/, images found")
    if not line["writable"]:
        return failed("data", f"the node cannot write the generated data set in {line['generated']}: {line.get('error')}",
                      "give the notebooks a DATA folder, or run them from a checkout the nodes can write")
    return passed("data", f"no DATA given: the generated set can be written in {line['generated']} from the node")
