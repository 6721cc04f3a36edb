"""The class report reads every student's job folder as the instructor: nothing a student can write is ever
unpickled, and no file they plant (a FIFO, a link) can hang the report or make it read elsewhere.

A real student runs a real job, then replaces its result pickle with one that runs a command when loaded and
its usage record and its run record's summary with FIFOs; root (the instructor) runs `python -m dlokit.classroom report --logs`: the command
never runs, the report ends, and the student's row says what was refused.

Needs root (it creates a Unix user and runs the kit as them with runuser)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_many_users import JOBS, REPO, SUBMIT, USERS, as_user, class_folder, result  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("useradd"),
                                 reason="needs root, runuser and useradd (real Unix users)"),
              pytest.mark.xdist_group("many-users")]

PLANT = """
import os, pickle, subprocess, sys
from pathlib import Path
folder, pid, marker, record = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])

class Payload:  # runs a command as whoever unpickles it
    def __reduce__(self):
        return subprocess.call, (["sh", "-c", 'echo ran-as-$(id -un) > "$0"', marker],)

(folder / f"{pid}_0_result.pkl").write_bytes(pickle.dumps(Payload()))
usage = folder / f"{pid}_0_usage.json"
usage.unlink()
os.mkfifo(usage)  # opened for reading, it blocks until someone writes
os.mkfifo(folder / "4194999_job.json")  # a "job card" that is a FIFO too
(record / "summary.json").unlink()
os.mkfifo(record / "summary.json")  # and the run record's summary
print('{"planted": true}')
"""


def test_a_students_planted_files_never_run_nor_hang_the_instructors_report(class_folder, tmp_path):
    job = result(as_user(USERS[0], class_folder, SUBMIT, f"{JOBS / 'recorded_sleep.py'} 0.3", "planted"))
    assert job["state"] == "COMPLETED", job
    marker = class_folder / "ran-as"  # the class folder is open to all: the payload could write here
    pid = Path(job["log"]).name.split("_")[0]
    record = class_folder / "runs" / job["job"] / "rank0"
    assert result(as_user(USERS[0], class_folder, PLANT, job["folder"], pid, str(marker), str(record)))["planted"]

    page = tmp_path / "report.html"
    report = subprocess.run([sys.executable, "-m", "dlokit.classroom", "report", str(class_folder / "runs"),
                             "--logs", str(class_folder / "dlokit_jobs"), "--html", str(page)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO / "helpers")})
    assert report.returncode == 0, report.stdout + report.stderr
    assert not marker.exists(), marker.read_text()  # the pickle was never loaded, by root or anyone
    html = page.read_text()
    row = next(line for line in html.split("<tr>") if job["job"] in line)
    assert "planted" in row and "UNKNOWN" in row, row  # the student's job, its outcome not known...
    assert f"{pid}_0_usage.json was not read (a FIFO, not a regular file" in row, row  # ...and what was refused
