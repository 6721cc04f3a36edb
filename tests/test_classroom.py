"""The instructor's class report: two students' real jobs (one failing), their notebooks' check results."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dlokit
from dlokit import classroom
from dlokit.checks.framework import CheckResult

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tp_scripts" / "solutions" / "train_classifier.py"

sys.path.insert(0, str(REPO / "data"))
import make_synthetic_imagenet  # noqa: E402


def executed_notebook(path: Path, nickname: str, results: list[CheckResult]) -> Path:
    """A notebook as Jupyter saves it after a run: the parameters cell, then check cells with their outputs."""
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": 1, "outputs": [],
              "source": [f'NICKNAME = "{nickname}"   # your job name\n', 'PROFILE = "local"\n']}]
    for result in results:
        bundle = result._repr_mimebundle_()
        cells.append({"cell_type": "code", "metadata": {}, "execution_count": 2, "source": ["checks.amp(ids)"],
                      "outputs": [{"output_type": "display_data", "metadata": {}, "data": bundle}]})
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


@pytest.fixture
def class_of_two(workspace):
    data = workspace / "tiny"
    make_synthetic_imagenet.main(["--out", str(data), "--classes", "4", "--train-per-class", "4",
                                  "--val-per-class", "1", "--size", "36", "--quiet"])
    profile = dlokit.use_profile("local")
    job = [str(SCRIPT), "--data", str(data), "--model", "resnet18", "--image-size", "32", "--test",
           "--test-nsteps", "3", "--print-every", "1000"]
    alice = dlokit.gpu_jobs_submitter([[*job, "--batch-size", "8"]], name="alice", tag="TP1.1", verbose=False)
    bob = dlokit.gpu_jobs_submitter([[*job, "--batch-size", "8"], [*job, "--batch-size", "1"]], name="bob",
                                    tag="TP1.2", verbose=False)
    outcomes = dlokit.wait(alice + bob, timeout_s=400)
    assert [o.state for o in outcomes] == ["COMPLETED", "COMPLETED", "FAILED"], outcomes
    notebooks = workspace / "notebooks"
    notebooks.mkdir()
    executed_notebook(notebooks / "day1_single_gpu.ipynb", "alice",
                      [CheckResult("TP1.1 model and batches on the device", "passed", "on the device"),
                       CheckResult("job completed", "passed", "1 run(s) completed")])
    executed_notebook(notebooks / "day1_bob.ipynb", "bob",
                      [CheckResult("TP1.2 mixed precision", "failed", "the logits were float32"),
                       CheckResult("TP1.2 mixed precision", "passed", "bfloat16 logits")])  # ran again: latest kept
    return profile, notebooks


@pytest.mark.slow  # three real jobs, one after the other
def test_class_report_lists_both_students_with_failures_and_checks(class_of_two):
    profile, notebooks = class_of_two
    table = classroom.class_report(profile.runs, profile.logs.parent, [notebooks])
    rows = {(row.student, row.tp): row for row in table.itertuples()}
    assert set(rows) == {("alice", "TP1.1"), ("alice", "other"), ("bob", "TP1.2")}
    alice, bob = rows[("alice", "TP1.1")], rows[("bob", "TP1.2")]
    assert (alice.jobs, alice.completed, alice.failed, alice.checks_passed) == (1, 1, 0, 1)
    assert alice.checks == "✅ TP1.1 model and batches on the device" and rows[("alice", "other")].jobs == 0
    assert (bob.jobs, bob.completed, bob.failed) == (2, 1, 1)
    assert bob.checks == "✅ TP1.2 mixed precision" and bob.checks_failed == 0
    assert "FAILED" in bob.failures and "--batch-size must be at least 2" in bob.failures
    assert alice.gpu_hours > 0 and bob.gpu_hours > 0
    assert alice.energy == "n/a" or "rapl" in alice.energy  # CPU jobs: RAPL where readable, else n/a

    # from the run records alone (no job cards): both students still, the failure unseen (it wrote no record)
    records_only = classroom.class_report(profile.runs)
    assert set(records_only["student"]) == {"alice", "bob"} and records_only["failed"].sum() == 0

    page = classroom.report_html(table)
    assert page.startswith("<!DOCTYPE html>") and "alice" in page and "bob" in page and "2 student(s)" in page

    # the instructor's command (one test: the jobs above are the slow part)
    tmp_path = profile.runs.parent
    command = [sys.executable, "-m", "dlokit.classroom", "report", str(profile.runs), "--logs",
               str(profile.logs.parent), "--notebooks", str(notebooks), "--html", str(tmp_path / "class.html")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "alice" in done.stdout and "bob" in done.stdout and "TP1.2" in done.stdout
    page = (tmp_path / "class.html").read_text()
    assert "alice" in page and "bob" in page and "must be at least 2" in page

    for bad in (["report", str(tmp_path / "nowhere")], ["report", str(profile.runs), "--logs", str(tmp_path / "x")]):
        refused = subprocess.run([sys.executable, "-m", "dlokit.classroom", *bad], capture_output=True, text=True)
        assert refused.returncode == 2 and "error:" in refused.stderr and "Traceback" not in refused.stderr


def test_a_notebook_with_the_hub_default_nickname_names_its_student(tmp_path):
    """The notebooks' default NICKNAME is the hub user: a notebook in no user's home counts as its default."""
    from dlokit.classroom import notebook_nickname

    path = tmp_path / "race.ipynb"
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 1,
            "source": ["import os\n", 'NICKNAME = os.environ.get("JUPYTERHUB_USER", "alice")  # your job name\n']}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert notebook_nickname(path) == "alice"
    cell["source"][1] = 'NICKNAME = os.environ.get("USER", "alice")\n'  # not the hub's variable: no nickname
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert notebook_nickname(path) is None
