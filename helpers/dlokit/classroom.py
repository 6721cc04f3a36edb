"""The class report: what every student has done, per TP, for the instructor during the session.

    python -m dlokit.classroom report RUNS_DIR [--logs LOG_DIR] [--notebooks PATH ...] [--html report.html]
    python -m dlokit.classroom verify-race [--profile NAME] [--test DIR]   # dlokit.race.verify: re-scored entries
    python -m dlokit.classroom folders --group INSTRUCTORS [--profile NAME]   # the class's shared folders, made once
    python -m dlokit.classroom board [--profile NAME] [--publish]          # the leaderboard, checked for the students
    dlokit.classroom.class_report(runs_dir, logs_dir=..., notebooks=[...])   # the same table, in a notebook cell

One row per student x TP: the check results (✅/❌/➖, from the executed notebooks' stored outputs), the jobs,
the failures with their causes, GPU-hours and energy. Where each comes from:

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
* GPU-hours and energy: dlokit.in_job.energy (elapsed x devices; NVML, RAPL or n/a).
"""
from __future__ import annotations

import argparse
import ast
import html
import json
import re
import stat
import sys
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd

from .analysis.run import list_run_ids, load_run
from .checks.framework import MARKS, results_in_notebook
from .in_job.energy import jobs_usage
from .submission.jobs import BadCard, card_outcome, load_card, record_refused
from .analysis.race_history import SEGMENT, base_id

UNTAGGED, OTHER = "untagged", "other"
ENDED_WELL = ("COMPLETED", "completed")
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "running or killed")
COLUMNS = ["student", "tp", "checks", "checks_passed", "checks_failed", "jobs", "completed", "failed", "running",
           "failures", "gpu_hours", "energy_wh", "energy"]
TP_NAME = re.compile(r"TP\d+\.\d+")


# ---- what each source says ---------------------------------------------------------------------------------

def _job(student, tp, job_id, state, cause, usage) -> dict:
    return {"student": student or "(no name)", "tp": tp or UNTAGGED, "job_id": job_id, "state": state,
            "cause": cause, "usage": usage}


def jobs_from_records(runs_dir: Path) -> dict[str, dict]:
    """One job per base run id (the segments of a requeued job together), from the run records alone."""
    segments, found = defaultdict(list), {}
    for run_id in list_run_ids(runs_dir):
        refused = record_refused(Path(runs_dir) / run_id)
        if refused:  # a FIFO would hang the reader: the run is named, not read
            found[run_id] = _job(None, None, run_id, "UNKNOWN", f"run record not read: {refused}", None)
            continue
        segments[base_id(run_id)].append(load_run(run_id, runs_dir))
    for job_id, runs in segments.items():
        runs.sort(key=lambda run: int(match["k"]) if (match := SEGMENT.fullmatch(run.run_id)) else 0)
        first, last = runs[0], runs[-1]
        state, cause = last.summary.get("status") or last.state, last.error or ""
        if state == "checkpointed":
            cause = f"checkpointed on {last.summary.get('signal')} at step {last.summary.get('steps')}, not resumed"
        found[job_id] = _job(first.info.get("name"), first.info.get("tag"), job_id, state, cause, jobs_usage(runs))
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
    for card, _ in cards(logs_dir):
        if Path(card.runs_dir).resolve() != Path(runs_dir).resolve():
            continue  # another runs folder: another class, or another profile
        try:
            outcome = card_outcome(card)
            state, cause = outcome.state, outcome.cause
        except Exception as error:  # an unreachable scheduler must not stop the report
            state, cause = "UNKNOWN", f"{type(error).__name__}: {error}"
        job = jobs.get(card.job_id)
        if job is None:
            job = jobs[card.job_id] = _job(card.name, card.extra.get("tag"), card.job_id, state, cause, None)
        if job["student"] == "(no name)":  # its run record was not read: the card names the student
            job["student"] = card.name
        job["state"], job["cause"] = state, cause or job["cause"]
        if job["tp"] == UNTAGGED and card.extra.get("tag"):
            job["tp"] = card.extra["tag"]


def notebook_nickname(path: Path) -> str | None:
    """The NICKNAME a notebook assigns in its code cells."""
    try:
        notebook = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", []))
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
            rows.append({"student": student or "(no name)", "tp": tp.group(0) if tp else OTHER, "check": name,
                         "status": status, "mark": result.get("mark") or MARKS.get(status, "?"), "notebook": path.name})
    return rows


# ---- the report -------------------------------------------------------------------------------------------

def _cause_line(job: dict) -> str:
    cause = (job["cause"] or "").strip().splitlines()
    return f"{job['job_id']} {job['state']}" + (f": {cause[-1][:160]}" if cause else "")


def class_report(runs_dir, logs_dir=None, notebooks=()) -> pd.DataFrame:
    """The table: one row per student x TP (see the module's docstring for where each column comes from)."""
    runs_dir = Path(runs_dir)
    jobs = jobs_from_records(runs_dir)
    if logs_dir is not None:
        add_outcomes(jobs, Path(logs_dir), runs_dir)
    checks = checks_from_notebooks(notebooks)
    groups = defaultdict(lambda: {"jobs": [], "checks": []})
    for job in jobs.values():
        groups[(job["student"], job["tp"])]["jobs"].append(job)
    for check in checks:  # the latest result of each check per student (a cell run again replaces it)
        group = groups[(check["student"], check["tp"])]["checks"]
        group[:] = [c for c in group if c["check"] != check["check"]] + [check]
    rows = []
    for (student, tp), group in sorted(groups.items()):
        done = group["jobs"]
        failed = [j for j in done if j["state"] not in ENDED_WELL and j["state"] not in ACTIVE]
        usages = [j["usage"] for j in done if j["usage"] is not None]
        usage = sum(usages[1:], usages[0]) if usages else None
        energy_known = usage is not None and usage.energy_wh is not None and len(usages) == len(done)
        rows.append({
            "student": student, "tp": tp,
            "checks": "; ".join(f"{c['mark']} {c['check']}" for c in group["checks"]),
            "checks_passed": sum(c["status"] == "passed" for c in group["checks"]),
            "checks_failed": sum(c["status"] == "failed" for c in group["checks"]),
            "jobs": len(done), "completed": sum(j["state"] in ENDED_WELL for j in done),
            "failed": len(failed), "running": sum(j["state"] in ACTIVE for j in done),
            "failures": " | ".join(_cause_line(j) for j in failed),
            "gpu_hours": round(usage.gpu_hours or 0.0, 6) if usage else 0.0,
            "energy_wh": usage.energy_wh if energy_known else None,
            "energy": usage.energy_text if energy_known else ("n/a" if done else ""),
        })
    return pd.DataFrame(rows, columns=COLUMNS)


STYLE = """<style>
body { font-family: sans-serif; margin: 1.5em; }
table.dlokit-class { border-collapse: collapse; font-size: 13px; }
table.dlokit-class th, table.dlokit-class td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: left;
  vertical-align: top; }
table.dlokit-class th { background: #f0f0f0; }
td.bad { color: #cf222e; }
</style>"""


def report_html(table: pd.DataFrame, title: str = "DLO-Kit class report") -> str:
    """A whole HTML page of the table (the instructor opens it in a browser; it names when it was made)."""
    shown = table.copy()
    shown["gpu_hours"] = shown["gpu_hours"].map(lambda v: f"{v:.3g}")
    shown = shown.drop(columns=["energy_wh"])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    body = []
    for row in shown.itertuples(index=False):
        cells = []
        for column, value in zip(shown.columns, row):
            bad = (column in ("failed", "checks_failed") and value) or (column == "failures" and value)
            cells.append(f"<td{' class=bad' if bad else ''}>{html.escape(str(value))}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    students = table["student"].nunique() if len(table) else 0
    jobs = int(table["jobs"].sum()) if len(table) else 0
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>{STYLE}</head>"
            f"<body><h1>{html.escape(title)}</h1><p>{students} student(s), {jobs}"
            f" job(s), made {time.strftime('%Y-%m-%d %H:%M:%S')}</p>"
            f"<table class='dlokit-class'><tr>{head}</tr>{''.join(body)}</table></body></html>")


def show(runs_dir, logs_dir=None, notebooks=()):
    """For a notebook cell: the report as a styled table."""
    from IPython.display import HTML

    return HTML(report_html(class_report(runs_dir, logs_dir, notebooks)))


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
    flagged = table[table["flag"] != ""]
    print(f"{len(table)} entries scored, {len(flagged)} flagged")
    return 0


def _folders(profile: str | None, group: str) -> int:
    from .in_job.shared_folders import FolderError, make_class_folder
    from .submission.profiles import current_profile, use_profile

    chosen = use_profile(profile) if profile else current_profile()
    try:
        for path in (chosen.logs, chosen.runs, chosen.leaderboard, chosen.runs / "hpo"):
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
        print(f"rejected: {name}: {why}")
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
    report = sub.add_parser("report", help="per student x TP: checks, jobs, failures, GPU-hours, energy")
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
    table = class_report(runs, args.logs, args.notebooks)
    with pd.option_context("display.max_colwidth", 60, "display.width", 200):
        print(table.drop(columns=["energy_wh"]).to_string(index=False) if len(table) else "no run, job or check found")
    if args.html:
        try:
            Path(args.html).write_text(report_html(table))
        except OSError as error:
            print(f"python -m dlokit.classroom: error: cannot write {args.html}: {error.strerror}", file=sys.stderr)
            return 2
        print(f"written: {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
