"""A student's edit between two runs of a cell: a changed file is submitted again (not reused by its command line),
a syntax error is refused before anything is submitted, and a failed job names the student's file and line in the
queue, the TP's next cell and the check."""
from __future__ import annotations

import pandas as pd
import pytest

import dlokit
from dlokit.analysis import load_run, profiler
from dlokit.checks.records import why_not_finished
from dlokit.submission import jobs, queue
from dlokit.submission.submit import ScriptSyntaxError

SCRIPT = "import optim_setup\nprint('records in runs/here')\noptim_setup.build()\n"


def student_files(workspace, module: str):
    """A student's folder: train_classifier.py, which imports their optim_setup.py (`module`)."""
    folder = workspace / "tp_scripts"
    folder.mkdir(exist_ok=True)
    (folder / "train_classifier.py").write_text(SCRIPT)
    (folder / "optim_setup.py").write_text(module)
    return folder / "train_classifier.py"


def test_a_changed_student_file_is_submitted_again_and_an_unchanged_one_is_reused(workspace, capsys):
    script = student_files(workspace, "def build():\n    return 0.1\n")
    day = dlokit.Day("zoe", dlokit.use_profile("local"), script, "synthetic")
    [first] = day.submit(str(script), wait=False, reuse=True)
    assert set(jobs.find_card(first).extra["script_sha256"]) == {"train_classifier.py", "optim_setup.py"}
    assert day.submit(str(script), wait=False, reuse=True) == [first]
    assert f"not submitted again: job {first}" in capsys.readouterr().out

    (script.parent / "optim_setup.py").write_text("def build():\n    return 0.2\n")  # the TODO fixed
    [second] = day.submit(str(script), wait=False, reuse=True)
    assert second != first
    assert f"your optim_setup.py changed since job {first}: submitted again" in capsys.readouterr().out
    assert [o.state for o in dlokit.wait([first, second], timeout_s=120)] == ["COMPLETED"] * 2


def test_a_syntax_error_is_refused_before_submission_with_its_file_line_and_caret(workspace):
    script = student_files(workspace, "def build():\n    return (0.1\n")
    dlokit.use_profile("local")
    with pytest.raises(ScriptSyntaxError) as refused:
        dlokit.gpu_jobs_submitter(str(script), name="zoe", verbose=False)
    lines = str(refused.value).splitlines()
    assert lines[0] == "optim_setup.py does not compile: nothing was submitted"
    assert lines[1] == f'  File "{script.parent / "optim_setup.py"}", line 2'
    assert lines[2:4] == ["    return (0.1", "           ^"] and lines[-1].startswith("SyntaxError: ")
    assert refused.value._render_traceback_() == lines  # what a notebook shows: these lines, no traceback
    assert not list(workspace.glob("jobs/**/*_job.json"))


def test_a_failed_job_names_the_students_file_and_line_in_the_queue_the_next_cell_and_the_check(workspace, capsys):
    script = student_files(workspace, "import math\n\n\ndef build():\n    return trace_dri + 1\n")
    dlokit.use_profile("local")
    [job] = dlokit.gpu_jobs_submitter(str(script), name="zoe", verbose=False)
    [outcome] = dlokit.wait([job], timeout_s=120)
    said = "NameError: name 'trace_dri' is not defined (optim_setup.py, line 5)"
    assert outcome.state == "FAILED" and outcome.error == said

    row = queue._ended_row(jobs.find_card(job))
    page = queue._table_html(pd.DataFrame([row], columns=queue.COLUMNS), "zoe")
    assert said.replace("'", "&#x27;") in page and "records in" not in page

    profiler.breakdowns_of([job], ["batch 16"])  # TP1.4's next cell
    printed = capsys.readouterr().out
    assert f"batch 16 (job {job}): failed: {said}" in printed and "complete the TODO" not in printed
    assert said in why_not_finished(job, load_run(job))  # the check's sentence
