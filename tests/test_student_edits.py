"""A student's edit between two runs of a cell: a changed file is submitted again (not reused by its command line)."""
from __future__ import annotations

import dlokit
from dlokit.submission import jobs

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
