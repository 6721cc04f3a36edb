"""The class report: what every student has done, per TP, for the instructor during the session.

    python -m dlokit.classroom report RUNS_DIR [--logs LOG_DIR] [--notebooks PATH ...] [--html report.html]
    python -m dlokit.classroom verify-race [--profile NAME] [--test DIR]   # dlokit.race.verify: re-scored entries
    python -m dlokit.classroom folders --group INSTRUCTORS [--profile NAME]   # the class's shared folders, made once
    python -m dlokit.classroom board [--profile NAME] [--publish]          # the leaderboard, checked for the students
    dlokit.classroom.class_report(runs_dir, logs_dir=..., notebooks=[...])   # the same table, in a notebook cell

First a students x TPs grid (✅ done, ❌ stuck, ➖ not applicable here, ⏳ running, · not started) and who is stuck
where, on what cause; then each job (its state and cause). The DataFrame, class_report(), has one row per student x
TP: the check results (✅/❌/➖, from the executed notebooks' stored outputs), the jobs, the failures with their
causes, GPU-hours and energy. Where each comes from:

* student: the job name the notebook submitted with (its NICKNAME): run records' `name`, job cards' `name`,
  and a notebook's `NICKNAME = "..."` line (its default, `os.environ.get("JUPYTERHUB_USER", ...)`, counts as
  the Unix user whose home holds the notebook: the hub's student);
* TP: the tag the job was submitted with (`day.submit(..., tp="TP1.2")`, `gpu_jobs_submitter(..., tag=...)`;
  race jobs are tagged "race"), written into the run record (`tag`) and the job card; untagged jobs are grouped
  as "untagged". A check result belongs to the TP its name starts with ("TP1.2 mixed precision"), other checks
  to "other";
* jobs: a job is counted once, whatever its segments (a requeued race run); its state and cause come from
  dlokit.job_outcome when the job cards are given (--logs: the folder holding one folder per user), else
  from the run record's status and error. Every file is the student's own: nothing is unpickled, only regular
  files are read (a FIFO, a device or a symbolic link is refused and named in the student's row), and a job
  card counts only for the folder it lies in;
* by design: a job a notebook meant to fail (TP2.3's run without find_unused_parameters, TP4.2's DDP out of
  memory, a trial the HPO pruner stopped) is counted by design, not failed, when it ended as its job card expects
  (`day.submit(..., expected={state: why})` stores it there; --logs), or when the day's check (checks.day_jobs)
  listed it among those that failed as meant: its result's `by_design` job ids, stored in the executed notebook,
  for that student's jobs (data, never a line of text read back). A demonstration that did not end as its card
  expects (it completed) is a failure, with what it was meant to show and, where its record says, the TODO that
  made it complete (checks.glance.completed_because: Day 2's find_unused run without DDP, TODO TP2.2);
* a failure's cause: the line that says what went wrong (the exception's message, not the hints printed under it),
  from the run record's error first, else from the scheduler's word (dlokit.job_outcome);
* GPU-hours and energy: dlokit.in_job.energy (elapsed x devices; NVML, RAPL or n/a).
"""
from __future__ import annotations

import argparse
import ast
import html
import re
import stat
import sys
import time
import unicodedata
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import pandas as pd

from .analysis.run import list_run_ids, load_run
from .checks.framework import MARKS, results_in_notebook
from .checks.glance import completed_because
from .in_job import untrusted
from .in_job.untrusted import printable
from .in_job.energy import jobs_usage
from .submission.jobs import SILENT_END, BadCard, card_outcome, load_card
from .analysis.race_history import SEGMENT, base_id

UNTAGGED, OTHER = "untagged", "other"
ENDED_WELL = ("COMPLETED", "completed")
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "running or killed")
COLUMNS = ["student", "tp", "status", "stuck_on", "checks", "checks_passed", "checks_failed", "jobs", "completed",
           "failed", "by_design", "running", "failures", "gpu_hours", "energy_wh", "energy"]
TP_NAME = re.compile(r"TP\d+\.\d+")
DONE, STUCK, NOT_APPLICABLE, RUNNING, NOT_STARTED = "✅", "❌", "➖", "⏳", "·"
MEANINGS = {DONE: "done", STUCK: "stuck", NOT_APPLICABLE: "not applicable here", RUNNING: "running",
            NOT_STARTED: "not started"}


# ---- what each source says ---------------------------------------------------------------------------------

NAME_CHARS = 32  # a nickname or a tag in the grid: a longer one (a forged record's) is cut


def _job(student, tp, job_id, state, cause, usage, submitted=0.0, error="", owner=None) -> dict:
    """One job: `cause` the scheduler's word (or the record's error), `error` the run record's own; `owner` the uid
    whose files say so."""
    return {"owner": owner, "student": printable(student or "(no name)", NAME_CHARS), "tp": printable(tp or UNTAGGED, NAME_CHARS),
            "job_id": printable(job_id, 160), "state": printable(state, 160), "cause": printable(cause, lines=True),
            "usage": usage, "submitted": submitted, "error": printable(error, lines=True), "by_design": False, "missed": False}


def _unix(stamp) -> float:
    """A run record's started_at (ISO 8601) as seconds; 0 when it says none."""
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return 0.0


def jobs_from_records(runs_dir: Path) -> dict[str, dict]:
    """One job per base run id (the segments of a requeued job together), from the run records alone. A segment
    joins its job only when its folder is the job's owner's: anyone can make `<id>.r1` in the shared runs folder."""
    runs = {run_id: load_run(run_id, runs_dir) for run_id in list_run_ids(runs_dir)}
    segments, found = defaultdict(list), {}
    for run_id, run in runs.items():
        base = runs.get(base_id(run_id))
        joined = base is not None and base.owner == run.owner
        segments[base_id(run_id) if joined else run_id].append(run)
    for job_id, job_runs in segments.items():
        job_runs.sort(key=lambda run: int(match["k"]) if (match := SEGMENT.fullmatch(run.run_id)) else 0)
        first, last = job_runs[0], job_runs[-1]
        if last.unreadable:
            found[job_id] = _job(first.info.get("name"), first.info.get("tag"), job_id, "UNKNOWN",
                                 f"run record not read: {last.unreadable}", None, owner=first.owner)
            continue
        state, cause = last.summary.get("status") or last.state, last.error or ""
        if state == "checkpointed":
            cause = f"checkpointed on {last.summary.get('signal')} at step {last.summary.get('steps')}, not resumed"
        found[job_id] = _job(first.info.get("name"), first.info.get("tag"), job_id, state, cause,
                             jobs_usage(job_runs), _unix(first.info.get("started_at")), last.error or "",
                             owner=first.owner)
    return found


def cards(logs_dir: Path) -> list[tuple[object, Path]]:
    """(job card, its user's log folder) for every readable card under logs_dir/<user>/<job name>/. A card
    names its own folder: the folder it lies in is used instead, so that a student's card cannot send the
    report to read another folder's files."""
    found = []
    for path in sorted(Path(logs_dir).glob("*/*/*_job.json")):
        try:
            card = load_card(path)
        except BadCard:
            continue
        card.folder = str(path.parent)
        found.append((card, path.parent.parent))
    return found


def add_outcomes(jobs: dict[str, dict], logs_dir: Path, runs_dir: Path) -> None:
    """The scheduler's word on each job (and the jobs that failed before writing any record)."""
    for card, user_folder in cards(logs_dir):
        if Path(card.runs_dir).resolve() != Path(runs_dir).resolve():
            continue  # another runs folder: another class, or another profile
        try:
            outcome = card_outcome(card)
            state, cause, meant = outcome.state, outcome.cause, bool(outcome.expected)
        except Exception as error:  # an unreachable scheduler must not stop the report
            state, cause, meant = "UNKNOWN", f"{type(error).__name__}: {error}", False
        run_id = card.run_dir.name  # the records' id: the job id, and a Slurm job's cluster
        job = jobs.get(run_id)
        if job is None:
            job = jobs[run_id] = _job(card.name, card.extra.get("tag"), card.job_id, state, cause, None,
                                      owner=user_folder.lstat().st_uid)
        if job["student"] == "(no name)":  # its run record was not read: the card names the student
            job["student"] = printable(card.name, NAME_CHARS)
        job["submitted"] = card.submitted_at if isinstance(card.submitted_at, (int, float)) else job["submitted"]
        job["state"], job["cause"] = printable(state, 160), printable(cause, lines=True) if cause else job["cause"]
        job["by_design"] = job["by_design"] or meant  # its card expected this end (a pruned HPO trial, a demo)
        ends = card.expected if isinstance(card.expected, dict) else {}
        if ends and state not in ACTIVE and state not in ends and state != "UNKNOWN":  # a demo that did not fail
            job["missed"] = True
            because = completed_because(run_id, runs_dir) if state in ENDED_WELL else ""
            job["cause"] = f"{job['cause']}: it completed because {because}" if because else job["cause"]
        if job["tp"] == UNTAGGED and card.extra.get("tag"):
            job["tp"] = printable(card.extra["tag"], NAME_CHARS)


def notebook_nickname(path: Path) -> str | None:
    """The NICKNAME a notebook assigns in its code cells."""
    try:
        notebook = untrusted.read_json(path, untrusted.NOTEBOOK_BYTES)
    except OSError:
        return None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", [])
        source = "".join(line for line in source if isinstance(line, str)) if isinstance(source, list) else str(source)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NICKNAME" for t in node.targets):
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    return node.value.value
                hub_default = _hub_user_default(node.value)
                if hub_default is not None:
                    return _home_owner(path) or hub_default
    return None


def _hub_user_default(value: ast.expr) -> str | None:
    """X in `os.environ.get("JUPYTERHUB_USER", X)` (the notebooks' default NICKNAME), else None."""
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "os.environ.get" and len(value.args) == 2 \
            and all(isinstance(a, ast.Constant) for a in value.args) and value.args[0].value == "JUPYTERHUB_USER":
        return value.args[1].value
    return None


def _home_owner(path: Path) -> str | None:
    """The user whose home holds this notebook, when they own it too: on the hub each student's notebooks
    live in their home and run with JUPYTERHUB_USER set to their name."""
    try:
        import pwd

        owner = pwd.getpwuid(path.stat().st_uid)
    except (ImportError, KeyError, OSError):
        return None
    home = Path(owner.pw_dir)
    return owner.pw_name if owner.pw_uid != 0 and home != Path("/") and home in path.resolve().parents else None


def notebook_files(paths) -> list[Path]:
    """The notebooks under these paths: regular files only (a student's FIFO named *.ipynb would hang the report)."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += [p for p in sorted(path.rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts and _regular(p)]
        elif path.suffix == ".ipynb" and path.is_file():  # named by the instructor: a link is theirs
            found.append(path)
    return found


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def checks_from_notebooks(paths) -> list[dict]:
    """One row per check result stored in the executed notebooks: student, tp, check, status, mark."""
    rows = []
    for path in notebook_files(paths):
        student = notebook_nickname(path)
        try:
            results = results_in_notebook(path)
        except (OSError, ValueError):
            continue
        for result in results:
            name = str(result.get("check", ""))
            tp = TP_NAME.match(name)
            status = result.get("status")
            rows.append({"student": printable(student or "(no name)", NAME_CHARS), "tp": tp.group(0) if tp else OTHER,
                         "check": printable(name, 120), "status": status,
                         "mark": MARKS.get(status, "?"), "notebook": printable(path.name, 120),
                         "message": printable(result.get("message", "")), "details": result.get("details") or [],
                         "info": result.get("info") or {}})
    return rows


def mark_by_design(jobs: dict[str, dict], checks: list[dict]) -> None:
    """Each job of a student that their day check (checks.day_jobs) listed as failed as its TP meant is by design."""
    for check in checks:
        info = check.get("info")
        listed = info.get("by_design") if isinstance(info, dict) else None
        for job_id in listed if isinstance(listed, list) else []:
            job = jobs.get(str(job_id))
            if job and job["student"] == check["student"] and job["state"] not in ACTIVE + ENDED_WELL:
                job["by_design"] = True


# ---- the report -------------------------------------------------------------------------------------------

RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")  # torch.distributed's prefix on each line a rank printed
EXCEPTION_LINE = re.compile(r"^([A-Za-z_]\w*\.)*[A-Z]\w*(Error|Exception|Interrupt|Exit)\b")
WRAPPERS = ("submitit.core.utils.FailedJobError", "FailedJobError", "subprocess.CalledProcessError")  # whole stderr
ARGPARSE_ERROR = re.compile(r"^\S+: error: ")
KIT_WORDED = ("OUT_OF_MEMORY", "TIMEOUT", "CANCELLED", "NODE_FAIL")  # job_outcome's cause starts with what happened
SIGNALLED = ("killed by a signal", SILENT_END)  # job_outcome writes how the job ended last


def _lines(text) -> list[str]:
    return [RANK_PREFIX.sub("", line).strip() for line in str(text or "").splitlines() if line.strip()]


def headline(job: dict) -> str:
    """The line of a job's cause that says what went wrong: the exception's message (a RuntimeError's first line,
    not the hints printed under it; the run record's error first), argparse's error, how the kit saw the job end;
    else the cause's last line."""
    cause = _lines(job["cause"])
    if cause and (job["state"] in KIT_WORDED or cause[-1].startswith(SIGNALLED)):
        return cause[0] if job["state"] in KIT_WORDED else cause[-1]
    lines = _lines(job["error"]) + cause
    said = [line for line in lines if EXCEPTION_LINE.match(line) and not line.startswith(WRAPPERS)]
    said = said or [line for line in lines if ARGPARSE_ERROR.match(line)]
    return said[0] if said else (cause or lines or [""])[-1]


def _failed(job: dict) -> bool:
    """A job that did not end as it should: it failed, or it was meant to fail and did not (a demonstration)."""
    ended_badly = job["state"] not in ENDED_WELL or job.get("missed")
    return ended_badly and job["state"] not in ACTIVE and not job["by_design"]


def _status(jobs: list[dict], checks: list[dict]) -> tuple[str, str]:
    """One student's mark for one TP, and what they are stuck on: a failed check, else (no check yet) their
    latest job when it failed."""
    failed_checks = [c for c in checks if c["status"] == "failed"]
    if failed_checks:
        return STUCK, f"check {failed_checks[-1]['check']}: {failed_checks[-1]['message']}"
    if any(job["state"] in ACTIVE for job in jobs):
        return RUNNING, ""
    if checks:
        return (DONE if any(c["status"] == "passed" for c in checks) else NOT_APPLICABLE), ""
    latest = max(jobs, key=lambda job: (job["submitted"], job["job_id"]), default=None)
    if latest is not None and _failed(latest):
        return STUCK, f"job {latest['job_id']} {latest['state']}: {headline(latest)}"
    return (DONE if jobs else NOT_STARTED), ""


def name_owners(jobs: dict[str, dict]) -> None:
    """A nickname written by more than one Unix user (a record or a card of another's that claims it) is shown with
    each writer's user name, so that nobody's row holds what someone else wrote."""
    owners = defaultdict(set)
    for job in jobs.values():
        if job["owner"] is not None:
            owners[job["student"]].add(job["owner"])
    for job in jobs.values():
        if job["student"] == "(no name)" and job["owner"] is not None:
            job["student"] = printable(f"(no name: {untrusted.user_name(job['owner'])})", 2 * NAME_CHARS)
        elif len(owners[job["student"]]) > 1 and job["owner"] is not None:
            job["student"] = printable(f"{job['student']} ({untrusted.user_name(job['owner'])})", 2 * NAME_CHARS)


def gather(runs_dir, logs_dir=None, notebooks=()) -> tuple[dict[str, dict], list[dict]]:
    """Every job (by id) and every check result of the class, the jobs failed by design marked so."""
    runs_dir = Path(runs_dir)
    jobs = jobs_from_records(runs_dir)
    if logs_dir is not None:
        add_outcomes(jobs, Path(logs_dir), runs_dir)
    from .race.verify import VERIFY_TAG

    name_owners(jobs)

    jobs = {job_id: job for job_id, job in jobs.items() if job["tp"] != VERIFY_TAG}  # the instructor's scoring jobs
    checks = checks_from_notebooks(notebooks)
    mark_by_design(jobs, checks)
    return jobs, checks


def class_report(runs_dir, logs_dir=None, notebooks=()) -> pd.DataFrame:
    """The table: one row per student x TP (see the module's docstring for where each column comes from)."""
    return summary(*gather(runs_dir, logs_dir, notebooks))


def summary(jobs: dict[str, dict], checks: list[dict]) -> pd.DataFrame:
    """One row per student x TP of these jobs and check results."""
    groups = defaultdict(lambda: {"jobs": [], "checks": []})
    for job in jobs.values():
        groups[(job["student"], job["tp"])]["jobs"].append(job)
    for check in checks:  # the latest result of each check per student (a cell run again replaces it)
        group = groups[(check["student"], check["tp"])]["checks"]
        group[:] = [c for c in group if c["check"] != check["check"]] + [check]
    rows = []
    for (student, tp), group in sorted(groups.items(), key=lambda item: (item[0][0], _tp_key(item[0][1]))):
        done = group["jobs"]
        failed = [j for j in done if _failed(j)]
        usages = [j["usage"] for j in done if j["usage"] is not None]
        usage = sum(usages[1:], usages[0]) if usages else None
        energy_known = usage is not None and usage.energy_wh is not None and len(usages) == len(done)
        status, stuck_on = _status(done, group["checks"])
        rows.append({
            "student": student, "tp": tp, "status": status, "stuck_on": stuck_on,
            "checks": "; ".join(f"{c['mark']} {c['check']}" for c in group["checks"]),
            "checks_passed": sum(c["status"] == "passed" for c in group["checks"]),
            "checks_failed": sum(c["status"] == "failed" for c in group["checks"]),
            "jobs": len(done), "completed": sum(j["state"] in ENDED_WELL and not j.get("missed") for j in done),
            "failed": len(failed), "by_design": sum(j["by_design"] for j in done),
            "running": sum(j["state"] in ACTIVE for j in done),
            "failures": " | ".join(f"{j['job_id']} {j['state']}: {headline(j)}" for j in failed),
            "gpu_hours": round(usage.gpu_hours or 0.0, 6) if usage else 0.0,
            "energy_wh": usage.energy_wh if energy_known else None,
            "energy": usage.energy_text if energy_known else ("n/a" if done else ""),
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def _tp_key(tp: str) -> tuple:
    """TP1.2 before TP1.10 before TP2.1; then race, other, untagged."""
    numbers = re.fullmatch(r"TP(\d+)\.(\d+)", tp)
    return (0, int(numbers[1]), int(numbers[2]), "") if numbers else (1, 0, 0, tp)


def class_grid(table: pd.DataFrame, cells: pd.Series | None = None, empty: str = NOT_STARTED) -> pd.DataFrame:
    """Students x TPs: each student's mark for each TP (or `cells`, one per row of the table); `empty` where the
    student has nothing for that TP yet."""
    if table.empty:
        return pd.DataFrame()
    grid = table.assign(cell=table["status"] if cells is None else cells).pivot(index="student", columns="tp",
                                                                                  values="cell")
    return grid[sorted(grid.columns, key=_tp_key)].fillna(empty)


def legend(table: pd.DataFrame) -> str:
    """What each mark of this table's grid means, for the marks it shows: "✅ done  ➖ not applicable here"."""
    shown = set(class_grid(table).to_numpy().ravel())
    return "  ".join(f"{mark} {meaning}" for mark, meaning in MEANINGS.items() if mark in shown)


def stuck(table: pd.DataFrame) -> pd.DataFrame:
    """Who is stuck where, on what: one row per student x TP marked ❌, by TP (where the class stumbles)."""
    rows = table[table["status"] == STUCK][["tp", "student", "stuck_on"]]
    return rows.sort_values(["tp", "student"], key=lambda c: c.map(_tp_key) if c.name == "tp" else c,
                            ignore_index=True)


def job_detail(jobs: dict[str, dict]) -> pd.DataFrame:
    """One row per job: its student, TP, state (by design or not) and cause, its GPU-hours and energy."""
    rows = [{"student": j["student"], "tp": j["tp"], "job_id": j["job_id"], "state": j["state"],
             "by_design": j["by_design"], "cause": headline(j) if _failed(j) or j["state"] not in ENDED_WELL else "",
             "whole_cause": "\n".join(t for t in (j["error"], j["cause"]) if t),
             "gpu_hours": round(j["usage"].gpu_hours or 0.0, 6) if j["usage"] else 0.0,
             "energy": j["usage"].energy_text if j["usage"] and j["usage"].energy_wh is not None else "n/a"}
            for j in sorted(jobs.values(), key=lambda j: (j["student"], _tp_key(j["tp"]), j["submitted"], j["job_id"]))]
    return pd.DataFrame(rows, columns=["student", "tp", "job_id", "state", "by_design", "cause", "whole_cause",
                                       "gpu_hours", "energy"])


# ---- the report, in a terminal ------------------------------------------------------------------------------

TEXT_WIDTH = 120


def _width(text: str) -> int:
    """Columns a terminal gives this text (✅ and ❌ take two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 0 if unicodedata.combining(ch) else 1
               for ch in text)


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - _width(text))


def _cut(text: str, width: int = TEXT_WIDTH) -> str:
    return text if _width(text) <= width else text[:width - 1] + "…"


def grid_lines(grid: pd.DataFrame, width: int = TEXT_WIDTH) -> list[str]:
    """The grid as text, in blocks of TP columns that fit `width`."""
    if grid.empty:
        return []
    first = max(_width(str(s)) for s in [*grid.index, "student"]) + 2
    widths = {tp: max(_width(tp), 2) + 2 for tp in grid.columns}
    blocks, block = [], []
    for tp in grid.columns:
        if block and first + sum(widths[t] for t in block) + widths[tp] > width:
            blocks.append(block)
            block = []
        block.append(tp)
    lines = []
    for block in [*blocks, block]:
        lines.append(_pad("student", first) + "".join(_pad(tp, widths[tp]) for tp in block))
        lines += [_pad(_cut(str(student), first - 2), first) + "".join(_pad(grid.at[student, tp], widths[tp])
                                                                         for tp in block) for student in grid.index]
        lines.append("")
    return [line.rstrip() for line in lines]


def per_student(table: pd.DataFrame) -> pd.DataFrame:
    """Each student's totals over the TPs."""
    counts = ["checks_passed", "checks_failed", "jobs", "completed", "failed", "by_design", "running", "gpu_hours"]
    totals = table.groupby("student")[counts].sum()
    totals["stuck"] = table[table["status"] == STUCK].groupby("student")["tp"].agg(", ".join)
    return totals.fillna({"stuck": ""}).reset_index()


def report_text(table: pd.DataFrame, width: int = TEXT_WIDTH) -> str:
    """The report for a terminal, no line past `width`: the grid first, then who is stuck on what, then each
    student's totals (each job's detail: --html)."""
    if table.empty:
        return "no run, job or check found"
    lines = [_headline_line(table), legend(table), ""] + grid_lines(class_grid(table), width)
    blocked = stuck(table)
    lines.append(f"stuck ({len(blocked)}):" if len(blocked) else "nobody stuck")
    lines += [_cut(f"  {row.tp:<7} {row.student:<10} {row.stuck_on}", width) for row in blocked.itertuples()]
    totals = per_student(table)
    with pd.option_context("display.max_colwidth", 30, "display.width", width):
        lines += ["", "per student:", *[_cut(line, width) for line in totals.to_string(index=False).splitlines()]]
    return "\n".join(lines)


def _headline_line(table: pd.DataFrame) -> str:
    return (f"{table['student'].nunique()} student(s), {int(table['jobs'].sum())} job(s), "
            f"made {time.strftime('%Y-%m-%d %H:%M:%S')}")


# ---- the report, as a page --------------------------------------------------------------------------------

MARK_CLASS = {DONE: "done", STUCK: "stuck", NOT_APPLICABLE: "na", RUNNING: "running", NOT_STARTED: "none"}
# The rules are scoped to .dlokit-report: in a notebook a <style> applies to the whole JupyterLab page
STYLE = """<style>
.dlokit-report { font-family: sans-serif; }
.dlokit-report .dlokit-scroll { overflow-x: auto; max-width: 100%; }
table.dlokit-class { border-collapse: collapse; font-size: 13px; }
table.dlokit-class th, table.dlokit-class td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: left;
  vertical-align: top; }
table.dlokit-class thead th { background: #f0f0f0; }
table.dlokit-grid td, table.dlokit-grid th { padding: 1px 2px; text-align: center; font-size: 12px; }
.mark { display: inline-block; min-width: 2.2em; text-align: center; border-radius: 3px; padding: 2px 0; }
.mark.done { background: #dafbe1; } .mark.stuck { background: #ffcecb; } .mark.na { background: #eaeef2; }
.mark.running { background: #fff8c5; } .mark.none { color: #8c959f; }
td.bad { color: #cf222e; }
span[title] { cursor: help; }
</style>"""


def _escaped(frame: pd.DataFrame) -> pd.DataFrame:
    """Every cell, index and column name as text safe in HTML (the students wrote them)."""
    shown = frame.map(lambda value: html.escape(str(value)))
    shown.index = [html.escape(str(i)) for i in frame.index]
    shown.columns = [html.escape(str(c)) for c in frame.columns]
    return shown


def _mark(mark: str, title: str) -> str:
    return f'<span class="mark {MARK_CLASS.get(mark, "none")}" title="{html.escape(title)}">{mark}</span>'


def _grid_html(table: pd.DataFrame) -> str:
    cells = [_mark(row.status, f"{row.student}, {row.tp}: " + (row.stuck_on or row.checks or f"{row.jobs} job(s)"))
             for row in table.itertuples()]
    grid = class_grid(table.assign(student=table["student"].map(html.escape), tp=table["tp"].map(html.escape)),
                      pd.Series(cells, index=table.index), _mark(NOT_STARTED, "not started"))
    return grid.rename_axis(index=None, columns=None).to_html(escape=False, classes="dlokit-class dlokit-grid",
                                                               border=0)


def _jobs_html(detail: pd.DataFrame) -> str:
    shown = _escaped(detail.drop(columns=["whole_cause", "by_design"]))
    shown["state"] = [state + (" (by design)" if meant else "") for state, meant in zip(shown["state"],
                                                                                        detail["by_design"])]
    shown["cause"] = [f'<span title="{html.escape(whole)}">{html.escape(_cut(cause, 240))}</span>' if cause else ""
                      for cause, whole in zip(detail["cause"], detail["whole_cause"])]
    return shown.to_html(index=False, escape=False, classes="dlokit-class", border=0)


def report_body(table: pd.DataFrame, title: str, jobs: pd.DataFrame | None = None, folded: bool = False) -> str:
    """The report: the students x TPs grid (in a box of its own that scrolls if a class is wider than the page),
    who is stuck where on what, then each job (`jobs`: job_detail's table; `folded`: under a click)."""
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>{html.escape(_headline_line(table)) if len(table) else 'no run, job or check found'}</p>"]
    if len(table):
        blocked = stuck(table)
        parts += [f"<p>{html.escape(legend(table))}</p>", f"<div class='dlokit-scroll'>{_grid_html(table)}</div>",
                  f"<h2>Stuck ({len(blocked)})</h2>",
                  blocked.to_html(index=False, classes="dlokit-class", border=0) if len(blocked) else "<p>nobody</p>"]
    if jobs is not None and len(jobs):
        each = f"<div class='dlokit-scroll'>{_jobs_html(jobs)}</div>"
        parts += [f"<details><summary>Each job ({len(jobs)})</summary>{each}</details>" if folded
                  else f"<h2>Each job</h2>{each}"]
    return f"{STYLE}<div class='dlokit-report'>{''.join(parts)}</div>"


def report_html(table: pd.DataFrame, title: str = "DLO-Kit class report", jobs: pd.DataFrame | None = None) -> str:
    """A whole HTML page (the instructor opens it in a browser; it names when it was made)."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body style='margin: 1.5em'>{report_body(table, title, jobs)}</body></html>")


def show(runs_dir, logs_dir=None, notebooks=()):
    """For a notebook cell: the report (the grid, who is stuck, each job folded under a click)."""
    from IPython.display import HTML

    jobs, checks = gather(runs_dir, logs_dir, notebooks)
    return HTML(report_body(summary(jobs, checks), "DLO-Kit class report", job_detail(jobs), folded=True))


# ---- command line --------------------------------------------------------------------------------------------

def _verify_race(profile: str | None, test: str | None) -> int:
    from .submission.profiles import use_profile
    from .race.verify import VerifyError, verify_race

    if profile:
        use_profile(profile)
    try:
        table = verify_race(test_dir=test)
    except VerifyError as error:
        print(f"python -m dlokit.classroom verify-race: error: {error}", file=sys.stderr)
        return 2
    with pd.option_context("display.max_colwidth", 120, "display.width", 200):
        print(table.to_string(index=False) if len(table) else "no accepted leaderboard entry")
    scored, flagged = table["test_top1"].notna().sum(), (table["flag"] != "").sum()
    print(f"{len(table)} entries, {scored} scored, {len(table) - scored} not scored, {flagged} flagged")
    return 0


def _folders(profile: str | None, group: str) -> int:
    from .in_job.shared_folders import FolderError, make_class_folder
    from .submission.profiles import current_profile, use_profile

    chosen = use_profile(profile) if profile else current_profile()
    try:
        # the logs' root, not this user's part of it (`logs` adds the user): each user makes their own part inside
        for path in (chosen.logs.parent, chosen.runs, chosen.leaderboard, chosen.runs / "hpo"):
            make_class_folder(path, group)
            print(f"{path}: mode 3777, group {group}")
    except FolderError as error:
        print(f"python -m dlokit.classroom folders: error: {error}", file=sys.stderr)
        return 2
    return 0


def _board(profile: str | None, publish: bool) -> int:
    from .race.leaderboard import Leaderboard, LeaderboardError
    from .submission.profiles import use_profile

    if profile:
        use_profile(profile)
    board = Leaderboard()
    with pd.option_context("display.max_colwidth", 60, "display.width", 200):
        table = board.table()
        print(table.to_string(index=False) if len(table) else "no entry on the board")
    for name, why in board.read()[1]:
        print(printable(f"rejected: {name}: {why}", 300))
    if publish:
        try:
            print(f"published for the students: {board.publish()}")
        except LeaderboardError as error:
            print(f"python -m dlokit.classroom board: error: {error}", file=sys.stderr)
            return 2
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlokit.classroom", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    report = sub.add_parser("report", help="students x TPs at a glance, who is stuck on what; each job's state, "
                                           "cause, GPU-hours and energy")
    report.add_argument("runs_dir", help="the class's runs folder (the profile's runs_dir)")
    report.add_argument("--logs", help="the log folder holding one folder per user (job cards: failures, causes)")
    report.add_argument("--notebooks", nargs="*", default=[],
                        help="executed notebooks, or folders searched for them (the check results)")
    report.add_argument("--html", help="also write the report as an HTML page here")
    verify = sub.add_parser("verify-race", help="score every leaderboard entry's final weights on the test split")
    verify.add_argument("--profile", default=None, help="the class's profile (its leaderboard, runs and race_test_dir)")
    verify.add_argument("--test", default=None, help="the test split (default: the profile's race_test_dir)")
    folders = sub.add_parser("folders", help="make the class's shared folders (job logs, runs, leaderboard, HPO): "
                                             "mode 3777, the instructors' group")
    folders.add_argument("--profile", default=None, help="the class's profile (its log_dir, runs_dir, leaderboard_dir)")
    folders.add_argument("--group", required=True, help="the instructors' group (no student in it)")
    board = sub.add_parser("board", help="the race's leaderboard as an instructor reads it; --publish: the check "
                                         "every student then sees")
    board.add_argument("--profile", default=None, help="the class's profile (its leaderboard and runs)")
    board.add_argument("--publish", action="store_true", help="write the check for the students")
    args = parser.parse_args(argv)
    if args.verb == "verify-race":
        return _verify_race(args.profile, args.test)
    if args.verb == "folders":
        return _folders(args.profile, args.group)
    if args.verb == "board":
        return _board(args.profile, args.publish)
    runs = Path(args.runs_dir)
    if not runs.is_dir():
        print(f"python -m dlokit.classroom: error: {runs} is not a folder (give the runs folder, e.g. "
              "notebooks/runs)", file=sys.stderr)
        return 2
    if args.logs and not Path(args.logs).is_dir():
        print(f"python -m dlokit.classroom: error: --logs {args.logs} is not a folder", file=sys.stderr)
        return 2
    missing = [p for p in args.notebooks if not Path(p).exists()]
    if missing:
        print(f"python -m dlokit.classroom: error: --notebooks {', '.join(missing)}: no such file or folder",
              file=sys.stderr)
        return 2
    jobs, checks = gather(runs, args.logs, args.notebooks)
    table = summary(jobs, checks)
    print(report_text(table))
    if args.html:
        try:
            Path(args.html).write_text(report_html(table, jobs=job_detail(jobs)))
        except OSError as error:
            print(f"python -m dlokit.classroom: error: cannot write {args.html}: {error.strerror}", file=sys.stderr)
            return 2
        print(f"written: {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
