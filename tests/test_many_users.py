"""A class on one machine: two real Unix users run the embedded default from one shared notebook folder, as on a
workshop server with JupyterHub. Each job queues for the machine's devices whatever user holds them, each user's
job logs and run records are theirs alone (and the instructors' group's, in a class folder made for it), the race
board shows another student's entry as not verified, and a folder a user cannot write is named with the fix.

Needs root (it creates two Unix users and runs the kit as each of them with runuser)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import searchable_by_all

REPO = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).parent / "job_scripts"
USERS = ("dlokitu1", "dlokitu2")
INSTRUCTOR, INSTRUCTORS = "dlokiti1", "dlokitins"  # a teacher, and the group the class folders are made for

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("useradd"),
                                 reason="needs root, runuser and useradd (real Unix users)"),
              # one worker: the module's folders are opened to the users for as long as its fixture lives
              pytest.mark.xdist_group("many-users")]

SUBMIT = """
import json, sys, dlokit
from dlokit.submission import jobs
dlokit.use_profile("local")
[job] = dlokit.gpu_jobs_submitter(sys.argv[1], n_gpu=1, name=sys.argv[2], time_max="00:02:00", verbose=False)
print(json.dumps({"job": job}), flush=True)
[outcome] = dlokit.wait(job, timeout_s=240)
card = jobs.find_card(job)
print(json.dumps({"job": job, "state": outcome.state, "cause": outcome.cause, "log": str(card.log_path()),
                  "folder": card.folder}), flush=True)
"""


@pytest.fixture(scope="module")
def class_folder():
    """Two students and the folder they share (open to all, as an instructor would make it)."""
    shared = Path(tempfile.mkdtemp(prefix="dlokit-class-"))
    shared.chmod(0o1777)
    for top in ("dlokit_jobs", "runs"):  # the shared folders: made for the students, never by one of them
        subprocess.run(["install", "-d", "-m", "1777", str(shared / top)], check=True)
    for user in USERS:
        if subprocess.run(["id", user], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--no-create-home", "--user-group", user], check=True)
        home = shared / ".homes" / user
        home.mkdir(parents=True)
        shutil.chown(home, user, user)
    # the students run this checkout's Python (its venv, and the interpreter the venv points to)
    with searchable_by_all(REPO, JOBS, Path(os.path.realpath(sys.executable))):
        yield shared
    shutil.rmtree(shared, ignore_errors=True)


def as_user(user: str, shared: Path, code: str, *args: str) -> subprocess.Popen:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO / "helpers"),
           "DLOKIT_LOCK_DIR": str(shared / "locks"), "MPLBACKEND": "Agg"}
    command = ["runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
               f"HOME={shared / '.homes' / user}", sys.executable, "-c", code, *args]
    return subprocess.Popen(command, cwd=shared, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert process.returncode == 0 and lines, f"rc {process.returncode}\n{out}\n{err}"
    return lines[-1]


def interval(log: str) -> dict:
    return json.loads(next(line for line in Path(log).read_text().splitlines() if line.startswith("{")))


def test_two_students_one_after_the_other_then_at_once(class_folder):
    first = result(as_user(USERS[0], class_folder, SUBMIT, f"{JOBS / 'interval.py'} 0.2", "first"))
    assert first["state"] == "COMPLETED", first
    # the second user: the lock folder was made by the first, the job and runs folders are the class's
    second = result(as_user(USERS[1], class_folder, SUBMIT, f"{JOBS / 'recorded_sleep.py'} 0.5", "second"))
    assert second["state"] == "COMPLETED", second
    assert (class_folder / "runs" / second["job"] / "rank0" / "run.json").exists()

    # at once: each measuring job takes the whole CPU, so they queue, in submission order, and none fails
    together = [as_user(user, class_folder, SUBMIT, f"{JOBS / 'interval.py'} 1.5", "together") for user in USERS]
    done = [result(p) for p in together]
    assert [d["state"] for d in done] == ["COMPLETED", "COMPLETED"], done
    spans = sorted((interval(d["log"])["start"], interval(d["log"])["end"]) for d in done)
    assert spans[0][1] <= spans[1][0], spans


def test_a_waiting_job_names_the_user_whose_job_holds_the_devices(class_folder):
    # the holder's job keeps the devices until the waiter has looked (meet.py: its mark, then the waiter's),
    # and the waiter submits once that job runs: no race with how fast either user's Python starts
    release = class_folder / "release"
    release.mkdir()
    release.chmod(0o1777)  # both users leave their mark (mkdir's mode would pass through the umask)
    holder = as_user(USERS[0], class_folder, SUBMIT, f"{JOBS / 'interval.py'} 0.1 {release} 2", "holder")
    waiter = as_user(USERS[1], class_folder, """
import json, sys, time, dlokit
from pathlib import Path
release = Path(sys.argv[2])
deadline = time.time() + 120
while not any(release.glob("*.here")) and time.time() < deadline:  # the holder's job runs
    time.sleep(0.1)
dlokit.use_profile("local")
[job] = dlokit.gpu_jobs_submitter(sys.argv[1], n_gpu=1, name="waiter", time_max="00:02:00", verbose=False)
for _ in range(200):
    outcome = dlokit.job_outcome(job)
    if outcome.state == "PENDING" and "holder" in outcome.cause:
        break
    time.sleep(0.1)
print(json.dumps({"state": outcome.state, "cause": outcome.cause}), flush=True)
(release / "waiter.here").touch()
dlokit.wait(job, timeout_s=240)
""", f"{JOBS / 'interval.py'} 0.1", str(release))
    seen = result(waiter)
    held = result(holder)
    assert seen["state"] == "PENDING" and f"{USERS[0]}'s job holder" in seen["cause"], seen
    assert held["state"] == "COMPLETED" and interval(held["log"])["met"], held  # released by the waiter's mark


def can_read(user: str, path: Path | str) -> bool:
    peek = subprocess.run(["runuser", "-u", user, "--", "cat", str(path)], capture_output=True, text=True)
    assert peek.returncode == 0 or "Permission denied" in peek.stderr, peek.stderr
    return peek.returncode == 0


def test_each_students_job_logs_and_records_are_theirs_alone(class_folder):
    mine = result(as_user(USERS[0], class_folder, SUBMIT, f"{JOBS / 'recorded_sleep.py'} 0.3", "private"))
    folder = Path(mine["folder"]).parent  # dlokit_jobs/<user>
    assert folder.stat().st_mode & 0o077 == 0, oct(folder.stat().st_mode)
    record = class_folder / "runs" / mine["job"]
    assert record.stat().st_mode & 0o077 == 0, oct(record.stat().st_mode)
    assert can_read(USERS[0], mine["log"]) and can_read(USERS[0], record / "rank0" / "run.json")
    assert not can_read(USERS[1], mine["log"]) and not can_read(USERS[1], record / "rank0" / "run.json")
    # the kit itself finds no job of the other student's either
    other = result(as_user(USERS[1], class_folder, """
import json, sys, dlokit
from pathlib import Path
try:
    outcome = str(dlokit.job_outcome(sys.argv[1], log_dir=Path(sys.argv[2])))
except LookupError as error:
    outcome = f"LookupError: {error}"
print(json.dumps({"outcome": outcome}))
""", mine["job"], str(folder)))
    assert other["outcome"].startswith("LookupError"), other


def test_a_folder_the_student_cannot_write_is_named_with_the_fix(class_folder):
    closed = class_folder / "closed"
    closed.mkdir()
    (closed / "dlokit_jobs").mkdir(mode=0o755)  # made by root, as an older kit would have
    process = as_user(USERS[1], closed, SUBMIT, f"{JOBS / 'interval.py'} 0.1", "closed")
    out, err = process.communicate(timeout=120)
    assert process.returncode != 0
    last = err.strip().splitlines()[-1]
    assert "FolderError" in last and str(closed / "dlokit_jobs") in last and "chmod 1777" in last, err


@pytest.fixture(scope="module")
def instructors_class(class_folder):
    """A class folder as the docs tell an instructor to make it: open to all, setgid for the instructors' group."""
    subprocess.run(["groupadd", "-f", INSTRUCTORS], check=True)
    if subprocess.run(["id", INSTRUCTOR], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "-G", INSTRUCTORS, INSTRUCTOR], check=True)
    lab = class_folder / "lab"
    for name in ("dlokit_jobs", "runs"):
        subprocess.run(["install", "-d", "-m", "3777", "-g", INSTRUCTORS, str(lab / name)], check=True)
    lab.chmod(0o1777)  # the tests' lock folder is made in it
    for user in (*USERS, INSTRUCTOR):
        home = lab / ".homes" / user
        home.mkdir(parents=True)
        shutil.chown(home, user)
    return lab


NAMED_GROUP = SUBMIT.replace('dlokit.use_profile("local")', 'dlokit.use_profile("local", instructors_group=sys.argv[3])')
NAMED_GROUP = NAMED_GROUP.replace("verbose=False", "verbose=True")


def test_the_instructors_group_reads_every_student_and_students_read_no_one_else(instructors_class):
    done = [result(as_user(user, instructors_class, SUBMIT, f"{JOBS / 'recorded_sleep.py'} 0.3", "lab"))
            for user in USERS]
    assert [job["state"] for job in done] == ["COMPLETED", "COMPLETED"], done
    for other, job in [(USERS[1], done[0]), (USERS[0], done[1])]:
        run_json = instructors_class / "runs" / job["job"] / "rank0" / "run.json"
        assert can_read(INSTRUCTOR, job["log"]) and can_read(INSTRUCTOR, run_json)
        assert not can_read(other, job["log"]) and not can_read(other, run_json)


RACE = """
import json, math, sys
from pathlib import Path
from dlokit import race
from dlokit.in_job.runrecord import RunRecorder
action, runs, board_folder = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
board = race.Leaderboard(board_folder, runs, budget_gpu_hours=math.inf)
if action == "post":  # a finished race run of this student, then its entry
    with RunRecorder({"model": "resnet18", "batch_size": 8, "image_size": 32}, run_id="1126-101010-abcd",
                     runs_dir=runs, extra={"name": "ann", "argv": ["--epochs", "1"]}) as recorder:
        recorder.log("val", epoch=0, step=6, val_loss=1.0, val_acc=0.5, val_acc5=1.0)
        recorder.finish(steps=6, epochs=1, val_acc=0.5, best_val_acc=0.5)
    board.post("1126-101010-abcd")
elif action == "forge":  # another student posts a better score for that run, under a file name of their own
    entry = json.loads((board_folder / "ann--1126-101010-abcd.json").read_text())
    (board_folder / "ann-copy.json").write_text(json.dumps({**entry, "top1": 0.99, "final_top1": 0.99}))
accepted, rejected = board.read()
print(json.dumps({"accepted": [(e["nickname"], e.get("top1"), e["checked"]) for e in accepted],
                  "rejected": [why for _, why in rejected]}))
"""


def test_the_race_board_shows_another_students_entry_unverified_and_refuses_a_forgery(instructors_class):
    runs, board = instructors_class / "runs", instructors_class / "runs" / "leaderboard"
    subprocess.run(["install", "-d", "-m", "3777", "-g", INSTRUCTORS, str(board)], check=True)  # the class's set-up
    posted = result(as_user(USERS[0], instructors_class, RACE, "post", str(runs), str(board)))
    assert posted["accepted"] == [["ann", 0.5, "record"]], posted  # the owner reads their own record
    seen = result(as_user(USERS[1], instructors_class, RACE, "read", str(runs), str(board)))
    assert seen["accepted"] == [["ann", None, "not verified"]], seen  # the record is private: no value shown
    forged = result(as_user(USERS[1], instructors_class, RACE, "forge", str(runs), str(board)))
    assert forged["accepted"] == [["ann", None, "not verified"]], forged
    assert forged["rejected"] == ["posted by dlokitu2, but run 1126-101010-abcd belongs to dlokitu1"], forged
    teacher = result(as_user(INSTRUCTOR, instructors_class, RACE, "read", str(runs), str(board)))
    assert teacher["accepted"] == [["ann", 0.5, "record"]], teacher  # the instructors' group reads the record
    assert teacher["rejected"] == ["posted by dlokitu2, but run 1126-101010-abcd belongs to dlokitu1"], teacher


def test_a_class_folder_the_instructors_cannot_read_is_named_once(instructors_class, class_folder):
    """The profile names the instructors' group: no word where the folders are theirs, a note where they are not."""
    theirs = as_user(USERS[0], instructors_class, NAMED_GROUP, f"{JOBS / 'interval.py'} 0.1", "named", INSTRUCTORS)
    out, err = theirs.communicate(timeout=300)
    assert theirs.returncode == 0 and "cannot read" not in out, out + err
    other = as_user(USERS[0], class_folder, NAMED_GROUP, f"{JOBS / 'interval.py'} 0.1", "named", INSTRUCTORS)
    out, err = other.communicate(timeout=300)
    notes = [line for line in out.splitlines() if "cannot read" in line]
    assert other.returncode == 0 and len(notes) == 2, out + err  # the job logs' folder and the runs folder
    assert f"install -d -m 3777 -g {INSTRUCTORS} {class_folder / 'runs'}" in notes[1], notes
