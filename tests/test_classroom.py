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


# ---- a class at a glance: several students' records, written as the training scripts write them -----------------

# TP2.3's run without find_unused_parameters, as PyTorch words it (the record's error) and as the job's log ends
UNUSED = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This "
          "error indicates that your module has parameters that were not used in producing loss.\n"
          "Parameter indices which did not receive grad for rank 0: 24 25 26\n"
          " In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL to "
          "print out information about which particular parameters did not receive gradient on this rank")
UNUSED_LOG_TAIL = ("[rank0]: Parameter indices which did not receive grad for rank 0: 24 25 26\n"
                   "[rank0]:  In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO")


def record(runs: Path, run_id: str, student: str, tp: str, status: str | None = "completed", error: str = "",
           minute: int = 0) -> str:
    """A rank-0 run record (run.json, metrics, and the summary unless the run is still going)."""
    rank = runs / run_id / "rank0"
    rank.mkdir(parents=True)
    (rank / "run.json").write_text(json.dumps(
        {"schema": 1, "run_id": run_id, "name": student, "tag": tp, "script": "train_classifier.py", "argv": [],
         "rank": 0, "world_size": 1, "started_at": f"2026-11-28T10:{minute:02d}:00+0000", "config": {},
         "hardware": {}, "measurement": {}}))
    (rank / "metrics.jsonl").write_text("")
    if status:
        (rank / "summary.json").write_text(json.dumps({"status": status, "run_id": run_id, "rank": 0,
                                                       "wall_time_s": 30.0, **({"error": error} if error else {})}))
    return run_id


def day_check(job_ids, expected, states, monkeypatch) -> CheckResult:
    """checks.day_jobs as the day's last cell runs it, on these jobs' states."""
    from dlokit.checks.glance import day_jobs
    from dlokit.submission import jobs

    monkeypatch.setattr(jobs, "job_outcome", lambda job: jobs.Outcome(job, states[job], cause=UNUSED))
    return day_jobs(job_ids, expected=expected)


@pytest.fixture
def class_of_four(tmp_path, monkeypatch):
    runs, notebooks = tmp_path / "runs", tmp_path / "notebooks"
    notebooks.mkdir()
    alice = [record(runs, "a11", "alice", "TP1.1"), record(runs, "a12", "alice", "TP1.2"),
             record(runs, "a23x", "alice", "TP2.3", "failed", UNUSED), record(runs, "a23y", "alice", "TP2.3")]
    record(runs, "b11", "bob", "TP1.1")
    record(runs, "b12a", "bob", "TP1.2", "failed", "ValueError: --batch-size must be at least 2", minute=1)
    record(runs, "b12b", "bob", "TP1.2", "failed", "ValueError: --batch-size must be at least 2", minute=2)
    record(runs, "c11", "carol", "TP1.1")
    record(runs, "c23x", "carol", "TP2.3", "failed", UNUSED)  # she has not reached the day's check yet
    record(runs, "d12a", "dave", "TP1.2", "failed", "ValueError: --lr must be positive", minute=1)
    record(runs, "d12b", "dave", "TP1.2", minute=2)  # fixed it: not stuck
    record(runs, "d11", "dave", "TP1.1", status=None)  # still running
    states = {"a11": "COMPLETED", "a12": "COMPLETED", "a23x": "FAILED", "a23y": "COMPLETED"}
    executed_notebook(notebooks / "day2_alice.ipynb", "alice",
                      [CheckResult("TP2.3 unused parameters", "passed", "without the flag DDP stopped"),
                       day_check(alice, {"a23x": "FAILED"}, states, monkeypatch)])
    executed_notebook(notebooks / "day1_carol.ipynb", "carol",
                      [CheckResult("TP1.1 model and batches on the device", "failed", "the model stayed on the CPU")])
    # erin's day check lists carol's job as hers (by_design is data the report reads: never another's), and its text
    # words her own failure like a demonstration's ("(as TP meant)"), which the report does not read back
    record(runs, "e23x", "erin", "TP2.3", "failed", "ValueError: --layer-drop must be below 1")
    executed_notebook(notebooks / "day2_erin.ipynb", "erin",
                      [CheckResult("the day's jobs", "passed", "all 1 jobs ended as they should",
                                   ["job e23x: FAILED (as TP meant)"], info={"by_design": ["c23x", {"x": 1}]})])
    return runs, notebooks


def test_the_class_at_a_glance_a_grid_who_is_stuck_where_and_on_what(class_of_four):
    runs, notebooks = class_of_four
    jobs, checks = classroom.gather(runs, notebooks=[notebooks])
    table = classroom.summary(jobs, checks)
    grid = classroom.class_grid(table)
    assert list(grid.columns) == ["TP1.1", "TP1.2", "TP2.3", "other"]
    assert grid.loc["alice"].tolist() == ["✅", "✅", "✅", "✅"]  # TP2.3's failure was by design
    assert grid.loc["bob"].tolist() == ["✅", "❌", "·", "·"]
    assert grid.loc["carol"].tolist() == ["❌", "·", "❌", "·"]
    assert grid.loc["dave"].tolist() == ["⏳", "✅", "·", "·"]
    assert grid.loc["erin"].tolist() == ["·", "·", "❌", "✅"]
    rows = {(row.student, row.tp): row for row in table.itertuples()}
    assert (rows[("alice", "TP2.3")].failed, rows[("alice", "TP2.3")].by_design) == (0, 1)
    assert (rows[("carol", "TP2.3")].failed, rows[("carol", "TP2.3")].by_design) == (1, 0)
    assert (rows[("erin", "TP2.3")].failed, rows[("erin", "TP2.3")].by_design) == (1, 0)

    blocked = classroom.stuck(table)
    assert blocked[["tp", "student"]].values.tolist() == [["TP1.1", "carol"], ["TP1.2", "bob"], ["TP2.3", "carol"],
                                                          ["TP2.3", "erin"]]
    causes = blocked["stuck_on"].tolist()
    assert causes[0] == "check TP1.1 model and batches on the device: the model stayed on the CPU"
    assert causes[1] == "job b12b failed: ValueError: --batch-size must be at least 2"
    assert causes[2].startswith("job c23x failed: RuntimeError: Expected to have finished reduction")
    assert "In addition" not in causes[2]

    text = classroom.report_text(table)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120, max(lines, key=len)
    assert lines[3].split() == ["student", "TP1.1", "TP1.2", "TP2.3", "other"]  # the grid first
    assert lines[4].split() == ["alice", "✅", "✅", "✅", "✅"] and text.index("student") < text.index("stuck (4)")
    assert lines[1] == "✅ done  ❌ stuck  ⏳ running  · not started"  # the marks the grid shows, no ➖
    alone = classroom.report_text(table[table["student"] == "alice"]).splitlines()
    assert alone[1] == "✅ done" and "❌" not in "\n".join(alone)  # a class with nobody stuck shows no ❌ at all

    page = classroom.report_html(table, jobs=classroom.job_detail(jobs))
    assert page.index("dlokit-grid") < page.index("Stuck (4)") < page.index("Each job")
    assert '<span class="mark stuck" title="carol, TP2.3: job c23x failed: RuntimeError: Expected' in page
    assert "failed (by design)" in page and "In addition" in page.split("Each job")[1]  # the whole cause on hover


def test_a_failure_s_cause_is_what_went_wrong_not_the_traceback_s_tail():
    def job(state, cause, error=""):
        return classroom._job("alice", "TP2.3", "1128-1", state, cause, None, error=error)

    assert classroom.headline(job("FAILED", UNUSED_LOG_TAIL, UNUSED)).startswith("RuntimeError: Expected to have")
    tail = "[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 3\n[rank0]: " + UNUSED
    assert classroom.headline(job("FAILED", tail)).startswith("RuntimeError: Expected to have finished")
    argparse = "usage: train_classifier.py [-h]\ntrain_classifier.py: error: --batch-size must be at least 2"
    assert classroom.headline(job("FAILED", argparse)) == "train_classifier.py: error: --batch-size must be at least 2"
    oom = "out of memory: peak 900 MB, against the limit of 800 MB per task\nMemoryError: ..."
    assert classroom.headline(job("OUT_OF_MEMORY", oom)).startswith("out of memory: peak 900 MB")
    killed = "step 3\nkilled by a signal (SIGKILL): not cancelled through the kit"
    assert classroom.headline(job("FAILED", killed)) == killed.splitlines()[-1]


def test_a_class_of_thirty_reads_in_a_terminal(tmp_path):
    tps = [f"TP{day}.{k}" for day, count in ((1, 6), (2, 5), (3, 6), (4, 8)) for k in range(1, count + 1)]
    jobs = {f"{s}-{tp}": classroom._job(f"student{s:02d}", tp, f"{s}-{tp}", "COMPLETED", "", None)
            for s in range(30) for tp in tps + ["race"]}
    text = classroom.report_text(classroom.summary(jobs, []))
    assert max(len(line) for line in text.splitlines()) <= 120
    assert all(f"student{s:02d}" in text for s in range(30)) and all(tp in text for tp in tps)
    assert len(text.splitlines()) < 120  # two blocks of the grid, then the totals: not one line per student x TP


def test_the_report_reads_each_job_s_expectation_from_its_card(workspace):
    """Four students' TP2.3 demonstrations (real jobs, their cards under --logs, no notebook): alice's failed as its
    card expects (by design), bob's failed with no expectation (a failure), carol's was meant to fail and trained,
    her untouched DDP TODO on 2 ranks (stuck, the TODO named), dave's trained with no expectation (done)."""
    from test_day_jobs import RAISES, TRAINS_WITHOUT_DDP, WHY, job

    ids = [job(workspace, "alice", RAISES, {"FAILED": WHY}, student="alice"),
           job(workspace, "bob", RAISES, None, student="bob"),
           job(workspace, "carol", TRAINS_WITHOUT_DDP, {"FAILED": WHY}, student="carol"),
           job(workspace, "dave", TRAINS_WITHOUT_DDP, None, student="dave")]
    assert [o.state for o in dlokit.wait(ids, timeout_s=240)] == ["FAILED", "FAILED", "COMPLETED", "COMPLETED"]
    table = classroom.class_report(workspace / "runs", workspace / "jobs")
    rows = {row.student: row for row in table.itertuples()}
    assert {s: (r.status, r.completed, r.failed, r.by_design) for s, r in rows.items()} == {
        "alice": ("✅", 0, 0, 1), "bob": ("❌", 0, 1, 0), "carol": ("❌", 0, 1, 0), "dave": ("✅", 1, 0, 0)}
    assert rows["carol"].stuck_on == (f"job {ids[2]} COMPLETED: the course expected this job to end FAILED ({WHY}): it "
                                      "completed because DDP is not set up: its 2 ranks each trained their own copy of "
                                      "the model, so none waited for another — TODO TP2.2")
    assert rows["bob"].stuck_on.startswith(f"job {ids[1]} FAILED: RuntimeError: Expected to have finished reduction")

