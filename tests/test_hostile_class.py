"""A hostile class, with real Unix users (two students, one instructor) on the embedded default: the class folder made
by the instructors' documented set-up from empty, then every kind of bad file one student can plant where they may
write — their own runs, another's `<id>.r1`, the leaderboard, the checks, their job logs — and every view a student
or the instructor calls: each returns (a hang fails the test at its time-out), names the bad file, and shows the
honest student's results unchanged.

Needs root (useradd, runuser)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from test_many_users import (INSTRUCTOR, INSTRUCTORS, JOBS, SUBMIT, USERS, as_user, class_folder,  # noqa: F401
                             instructors_class, result)

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root (real Unix users)"),
              pytest.mark.xdist_group("many-users")]
ANN, BOB = USERS
VIEW_TIMEOUT_S = 240  # a view that blocks on a FIFO never returns: this only bounds how long the test waits for it


def run_as(user: str, folder: Path, code: str, *args: str) -> dict:
    process = as_user(user, folder, code, *args)
    out, err = process.communicate(timeout=VIEW_TIMEOUT_S)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert process.returncode == 0 and lines, f"rc {process.returncode}\n{out}\n{err}"
    return {key: value for line in lines for key, value in line.items()}


CLASSROOM = "import sys\nfrom dlokit.classroom import main\nsys.exit(main(sys.argv[1:]))"


def classroom(user: str, folder: Path, *argv: str) -> tuple[int, str, str]:
    """`python -m dlokit.classroom ARGV` as that user, in the class folder."""
    process = as_user(user, folder, CLASSROOM, *argv)
    out, err = process.communicate(timeout=VIEW_TIMEOUT_S)
    return process.returncode, out, err


def set_up(folder: Path) -> subprocess.CompletedProcess:
    """The documented set-up (docs/instructors.md), as root in the class folder, on the embedded default."""
    return subprocess.run([sys.executable, "-m", "dlokit.classroom", "folders", "--group", INSTRUCTORS], cwd=folder,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "helpers")})


@pytest.fixture(scope="module")
def empty_class(instructors_class):  # noqa: F811
    """An empty class folder on a workshop server: open to all, as the hub's shared folder is; nothing inside."""
    folder = instructors_class.parent / "hostile"
    subprocess.run(["install", "-d", "-m", "1777", str(folder)], check=True)
    for user in (*USERS, INSTRUCTOR):
        subprocess.run(["install", "-d", "-o", user, str(folder / ".homes" / user)], check=True)
    return folder


def test_a_first_submission_into_a_class_folder_without_its_set_up_asks_for_it(class_folder):  # noqa: F811
    bare = class_folder / "no-set-up"
    subprocess.run(["install", "-d", "-m", "1777", str(bare)], check=True)
    process = as_user(ANN, bare, SUBMIT, f"{JOBS / 'interval.py'} 0.1", "first")
    out, err = process.communicate(timeout=120)
    assert process.returncode != 0 and "dlokit.classroom folders" in err.strip().splitlines()[-1], out + err
    assert not (bare / "dlokit_jobs").exists() and not (bare / "runs").exists()  # no folder the student would own


@pytest.fixture(scope="module")
def taught(empty_class):
    """The set-up, then each student's first job."""
    made = set_up(empty_class)
    assert made.returncode == 0, made.stdout + made.stderr
    jobs = {user: result(as_user(user, empty_class, SUBMIT, f"{JOBS / 'recorded_sleep.py'} 0.4", user))
            for user in USERS}
    assert [job["state"] for job in jobs.values()] == ["COMPLETED", "COMPLETED"], jobs
    return empty_class, {user: job["job"] for user, job in jobs.items()}


def test_the_set_up_makes_every_shared_folder_and_nobody_moves_anothers(taught):
    folder, jobs = taught
    for shared in ("dlokit_jobs", "runs", "runs/leaderboard", "runs/hpo"):
        info = (folder / shared).stat()
        assert stat.S_IMODE(info.st_mode) == 0o3777 and info.st_uid == 0, (shared, oct(info.st_mode))
    moves = run_as(BOB, folder, """
import json, os, sys
tries = {}
for name, path in [("logs", f"dlokit_jobs/{sys.argv[1]}"), ("run", f"runs/{sys.argv[2]}")]:
    try:
        os.rename(path, path + ".gone")
        tries[name] = "renamed"
    except OSError as error:
        tries[name] = error.strerror
print(json.dumps(tries))
""", ANN, jobs[ANN])
    assert moves == {"logs": "Operation not permitted", "run": "Operation not permitted"}, moves


PLANT = """
import getpass, json, os, sys
from pathlib import Path
victim_job, own_job, victim = sys.argv[1], sys.argv[2], sys.argv[3]
runs, board, logs = Path("runs"), Path("runs/leaderboard"), Path("dlokit_jobs") / getpass.getuser()

def rank(run_id):
    folder = runs / run_id / "rank0"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(runs / run_id, 0o755)  # open to every reader
    return folder

# another's job: a segment folder that says it failed
fake = rank(f"{victim_job}.r1")
(fake / "run.json").write_text(json.dumps({"schema": 1, "name": victim, "tag": "race"}))
(fake / "summary.json").write_text(json.dumps({"status": "failed", "error": "sabotaged"}))
# one's own runs: every kind of bad file
os.chmod(runs / own_job, 0o755)
(runs / own_job / "rank0" / "metrics.jsonl").unlink()
os.mkfifo(runs / own_job / "rank0" / "metrics.jsonl")
with open(rank("huge") / "metrics.jsonl", "wb") as huge:
    huge.truncate(3 * 1024 ** 3)  # sparse: 3 GB read as a file, a second of disk
(rank("huge") / "run.json").write_text("{}")
os.symlink(Path(f"runs/{victim_job}/rank0/run.json").absolute(), rank("link") / "run.json")
(rank("utf") / "summary.json").write_bytes(b'{"status": "\\xff"}')
(rank("type") / "run.json").write_text("[1, 2]")
(rank("forged") / "summary.json").write_text(json.dumps({"status": "completed", "wall_time_s": "fast"}))
(rank("forged") / "run.json").write_text(json.dumps({"schema": 1, "name": victim, "tag": "TP1.1\\x1b[31mRED\\n" + "x" * 300}))
(rank("cut") / "run.json").write_text('{"sche')
(rank("folder") / "summary.json").mkdir()
# the leaderboard and the instructors' check
os.mkfifo(board / "zz-fifo.json")
os.symlink("/etc/shadow", board / "zz-link.json")
(board / "zz-folder.json").mkdir()
with open(board / "zz-huge.json", "wb") as huge:
    huge.truncate(2 * 1024 ** 3)
(board / "zz-utf.json").write_bytes(b"\\xff\\xfe")
(board / "zz-type.json").write_text("[]")
(board / f".checked-{sys.argv[4]}.json").write_text(json.dumps({"schema": 1, "published_at": 9e9, "accepted": []}))
# one's own job logs: a FIFO card, a card whose tag carries escape codes
evil = logs / "evil"
evil.mkdir(parents=True, exist_ok=True)
os.mkfifo(evil / "fifo-1_job.json")
print(json.dumps({"planted": True}))
"""

STUDENT_VIEWS = """
import json, sys, dlokit
from dlokit import analysis, race
from dlokit.checks.glance import day_jobs
job = sys.argv[1]
dlokit.use_profile("local")
table = analysis.runs_table([job]).set_index("run_id")
others = analysis.runs_table().set_index("run_id")
accepted, rejected = race.Leaderboard().read()
compared = analysis.compare_runs({"mine": [job], "planted": ["huge", "link"]}, metric="steps").table
print(json.dumps({"compared": dict(zip(compared["arm"], compared["state"].astype(str))),"state": table.loc[job, "state"], "steps": int(table.loc[job, "steps"] or 0),
                  "others": {run_id: str(state) for run_id, state in others["state"].items()},
                  "history": [run.run_id for run in race.history(job).segments],
                  "overlaps": analysis.overlap.overlapping([job])[job],
                  "check": day_jobs([job]).status, "rejected": dict(rejected)}))
"""


def test_every_view_returns_names_the_bad_files_and_keeps_the_honest_results(taught):
    folder, jobs = taught
    run_as(BOB, folder, PLANT, jobs[ANN], jobs[BOB], ANN, INSTRUCTOR)

    ann = run_as(ANN, folder, STUDENT_VIEWS, jobs[ANN])
    assert ann["state"] == "completed" and ann["steps"] >= 1 and ann["check"] == "passed", ann
    assert ann["history"] == [jobs[ANN]], ann  # bob's `<id>.r1` is not a segment of ann's job
    assert ann["compared"]["mine"] == "completed" and "unreadable" in ann["compared"]["planted"], ann["compared"]
    others = ann["others"]
    assert others["huge"].startswith("unreadable") and "over the" in others["huge"], others
    assert "symbolic link" in others["link"] and "not UTF-8" in others["utf"], others
    assert "a FIFO" in others[jobs[BOB]] and "a folder, not a file" in others["folder"], others
    for name in ("zz-fifo.json", "zz-link.json", "zz-folder.json", "zz-huge.json", "zz-utf.json"):
        assert name in ann["rejected"], (name, ann["rejected"])

    bob = run_as(BOB, folder, STUDENT_VIEWS, jobs[BOB])
    assert bob["state"].startswith("unreadable") and "a FIFO" in bob["state"], bob

    code, report, err = classroom(INSTRUCTOR, folder, "report", "runs", "--logs", "dlokit_jobs")
    assert code == 0, report + err
    assert "\x1b" not in report and all(len(line) <= 120 for line in report.splitlines()), report
    ann_rows = [line for line in report.splitlines() if f"{ANN} ({ANN})" in line]
    assert ann_rows and not any("sabotaged" in line or "❌" in line for line in ann_rows), report
    assert f"{ANN} ({BOB})" in report, report  # a record of bob's that says it is ann's is shown as bob's
    assert f"(no name: {BOB})" in report, report  # the unnamed bad records: their writer named

    code, out, err = classroom(INSTRUCTOR, folder, "board", "--publish")
    assert code == 0 and "published for the students" in out, out + err
    assert "\x1b" not in out and "zz-fifo.json" in out, out
    board = folder / "runs" / "leaderboard"
    assert len(list(board.glob(f".checked-{INSTRUCTOR}.*.json"))) == 1  # past bob's squat of its name
    code, out, err = classroom(INSTRUCTOR, folder, "board", "--publish")
    assert code == 0, out + err
    assert len(list(board.glob(f".checked-{INSTRUCTOR}.*.json"))) == 1  # replaced, not one more each time
