"""A class on one machine: two real Unix users run the embedded default from one shared notebook folder, as on a
workshop server with JupyterHub. Each job queues for the machine's devices whatever user holds them, each user's
job logs are theirs alone, and a folder a user cannot write is named with the fix.

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

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("useradd"),
                                reason="needs root, runuser and useradd (real Unix users)")

SUBMIT = """
import json, sys, dlokit
from dlokit import jobs
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
    # the second user: the lock folder, the job folder and the runs folder were all made by the first
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
    holder = as_user(USERS[0], class_folder, SUBMIT, f"{JOBS / 'interval.py'} 6", "holder")
    time.sleep(0.5)  # submitted first
    waiter = as_user(USERS[1], class_folder, """
import json, sys, time, dlokit
dlokit.use_profile("local")
[job] = dlokit.gpu_jobs_submitter(sys.argv[1], n_gpu=1, name="waiter", time_max="00:02:00", verbose=False)
for _ in range(200):
    outcome = dlokit.job_outcome(job)
    if outcome.state == "PENDING" and "holder" in outcome.cause:
        break
    time.sleep(0.1)
print(json.dumps({"state": outcome.state, "cause": outcome.cause}), flush=True)
dlokit.wait(job, timeout_s=240)
""", f"{JOBS / 'interval.py'} 0.1")
    seen = result(waiter)
    result(holder)
    assert seen["state"] == "PENDING" and f"{USERS[0]}'s job holder" in seen["cause"], seen


def test_each_students_job_logs_are_theirs_alone(class_folder):
    mine = result(as_user(USERS[0], class_folder, SUBMIT, f"{JOBS / 'interval.py'} 0.1", "private"))
    folder = Path(mine["folder"]).parent  # dlokit_jobs/<user>
    assert folder.stat().st_mode & 0o077 == 0, oct(folder.stat().st_mode)
    peek = subprocess.run(["runuser", "-u", USERS[1], "--", "cat", mine["log"]], capture_output=True, text=True)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr
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
