"""A job the course runs to fail on purpose (TP4.2's DDP out of memory, TP2.3's run without
find_unused_parameters) reads "failed as expected (why)" on its card, in the queue and in the runs table, never as a
plain failure; one that does not end as expected says what was expected."""
from __future__ import annotations

import sys
import textwrap

import pandas as pd
import pytest

import dlokit
from dlokit import analysis, checks
from dlokit.submission import jobs, queue

WHY = "the demo loader raises by design"
FAILING = """
    from dlokit.in_job.runrecord import RunRecorder

    record = RunRecorder({"job": "demo"})
    record.log("step", step=0, t_step=0.1)
    raise ValueError("no batch here")
"""


def demo_script(folder, body: str) -> str:
    path = folder / "demo.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_job_expected_to_fail_reads_failed_as_expected(workspace):
    [job_id] = dlokit.gpu_jobs_submitter(demo_script(workspace, FAILING), name="demo", time_max="00:02:00",
                                         expected={"FAILED": WHY})
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "FAILED" and outcome.expected == WHY, str(outcome)
    assert f"FAILED: failed as expected ({WHY})" in str(outcome) and "no batch here" in outcome.cause

    card = jobs.find_card(job_id)
    assert jobs.load_card(card.path).expected == {"FAILED": WHY}  # on the card, on disk

    row = queue._ended_row(card)
    html = queue._table_html(pd.DataFrame([row], columns=queue.COLUMNS), "demo")
    assert f"failed as expected ({WHY})" in html and "FAILED as expected" in html
    assert "dlokit-state-EXPECTED" in html and 'class="dlokit-state-FAILED"' not in html  # blue, not a red failure

    [state] = analysis.runs_table([job_id])["state"]
    assert state == f"failed as expected ({WHY})"

    result = checks.day_jobs([job_id])  # the card's expectation, with nothing passed to the check
    assert result.status == "passed" and result.details == [f"job {job_id}: FAILED (as TP meant)"]
    assert result.message == "all 1 jobs ended as they should (1 failed by design: see below)"


def test_a_demonstration_that_completes_says_what_was_expected(workspace):
    script = demo_script(workspace, "print('fits after all')\n")
    [job_id] = dlokit.gpu_jobs_submitter(script, name="demo", time_max="00:02:00",
                                         expected={"OUT_OF_MEMORY": "DDP keeps a whole copy per rank"})
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "COMPLETED" and not outcome.expected
    assert "expected this job to end OUT_OF_MEMORY (DDP keeps a whole copy per rank)" in outcome.cause
    assert checks.day_jobs([job_id]).status == "failed"
    # a scan's run may fit or run out of memory: one that fits is not counted among the failures by design
    assert checks.day_jobs([job_id], expected={job_id: ("COMPLETED", "OUT_OF_MEMORY")}).message == \
        "all 1 jobs ended as they should"


def test_a_plain_failure_stays_a_failure(workspace):
    [job_id] = dlokit.gpu_jobs_submitter(demo_script(workspace, FAILING), name="demo", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "FAILED" and not outcome.expected and "as expected" not in str(outcome)
    [state] = analysis.runs_table([job_id])["state"]
    assert state == "failed"


@pytest.mark.parametrize("expected, says", [({"FAILED": ""}, "say why"), ({"BROKEN": "x"}, "unknown state"),
                                             ("FAILED", "{state: why}")])
def test_expected_is_checked_before_anything_is_submitted(workspace, expected, says):
    with pytest.raises(ValueError, match=says):
        dlokit.gpu_jobs_submitter(f"{sys.executable} --version", name="demo", expected=expected)
    assert not jobs.all_cards("demo")


def test_day_submit_spreads_expected_over_its_commands():
    from dlokit.submission.day import expected_per_job

    oom = {"OUT_OF_MEMORY": "DDP keeps a whole copy per rank"}
    assert expected_per_job(["ddp", "fsdp"], 2, [oom, None]) == [oom, None]
    assert expected_per_job(["a", "b"], [1, 2], [oom, None]) == [oom, oom, None, None]
    assert expected_per_job("a", 1, oom) == [oom]
    with pytest.raises(ValueError, match="2 entries for 1 commands"):
        expected_per_job(["a"], 1, [oom, None])


SLEEPING = """
    import time

    from dlokit.in_job.runrecord import RunRecorder

    record = RunRecorder({"job": "trial"})
    record.log("step", step=0, t_step=0.1)
    time.sleep(120)
"""


def test_a_job_the_kit_cancels_on_purpose_reads_as_expected_and_nobody_is_stuck(workspace):
    """An HPO trial its pruner stopped (hpo.py cancels it with the why) is no student's failure: the class report
    marked its student stuck on 'CANCELLED: the job was cancelled' before the card carried the why."""
    import time

    from dlokit import classroom

    [job_id] = dlokit.gpu_jobs_submitter(demo_script(workspace, SLEEPING), name="alice", time_max="00:03:00")
    for _ in range(120):  # until the script runs (its first record line), then stop it as hpo.py does
        if list((workspace / "runs").glob("*/rank0/metrics.jsonl")):
            break
        time.sleep(0.5)
    jobs.cancel(job_id, why="pruned by the study's pruner after epoch 1")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "CANCELLED" and outcome.expected == "pruned by the study's pruner after epoch 1"
    assert "failed as expected (pruned by the study's pruner after epoch 1)" in outcome.shown_state

    table = classroom.class_report(workspace / "runs", workspace / "jobs")
    assert (table["status"] != classroom.STUCK).all(), table.to_dict("records")
    assert table["by_design"].sum() == 1


def test_a_long_exception_is_shown_from_its_first_line():
    """PyTorch's reducer error runs to a page: the cause a student reads starts at its exception's line, not in its
    middle; a tail with no exception line, or only its last line, is shown whole (the time-limit signs stay read from
    the whole tail)."""
    from dlokit.submission.jobs import _from_error_line

    tail = "\n".join(["[rank0]:     loss.backward()", "[rank0]:     ^^^^^^^^", "[rank0]: RuntimeError: Expected to have "
                      "finished reduction in the prior iteration.", "[rank0]: Parameter indices which did not receive grad"])
    assert _from_error_line(tail).startswith("[rank0]: RuntimeError: Expected to have finished reduction")
    assert _from_error_line("submitit WARNING: this job is timed-out\nkilled") == "submitit WARNING: this job is timed-out\nkilled"
    last = "  File \"x.py\", line 3\nValueError: bad"
    assert _from_error_line(last) == last
