"""Student material generated from marked solution files: markers, build, check, compare."""
import json
import re
import subprocess
import sys
import textwrap
from html import unescape
from pathlib import Path

import pytest

from dlokit.material import (MarkerError, build, compare, default_pairs, find_solution, solution_version, stale,
                             student_copy, student_version)
from dlokit.material.build import DEFAULT_PAIRS, RULE

REPO = Path(__file__).resolve().parents[1]

TRAIN = textwrap.dedent('''\
    #!/usr/bin/env python
    """Tiny training step.

    Run by notebooks/day9.ipynb (not by notebooks/gone.ipynb, which does not exist).
    """
    import torch


    def step(model, images, device, amp_dtype=None):
        images = images.to(device)
        # >>> SOLUTION TP1.2: run the forward pass under autocast
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(images)
        # --- STUDENT
        # logits = model(images)
        # <<< SOLUTION
        return logits


    def to_channels_last(model):
        # >>> SOLUTION TP1.3: convert the model to channels_last
        model = model.to(memory_format=torch.channels_last)
        # <<< SOLUTION
        return model


    def init(backend):
        if backend:
            # >>> SOLUTION TP2.1
            torch.distributed.init_process_group(backend)
            # <<< SOLUTION
        return backend
    ''')


def dedent(text):
    return textwrap.dedent(text).lstrip("\n")


def test_student_version_replaces_blocks():
    student = student_version(TRAIN)
    assert "    # TODO TP1.2: run the forward pass under autocast\n    logits = model(images)\n" in student
    assert "autocast(" not in student and ">>>" not in student and "STUDENT" not in student
    assert "    # TODO TP1.3: convert the model to channels_last\n    return model" in student
    assert "        # TODO TP2.1\n        pass\n    return backend" in student
    compile(student, "student.py", "exec")


def test_solution_version_drops_markers_and_student_lines():
    solution = solution_version(TRAIN)
    assert "with torch.autocast(" in solution and "# logits = model(images)" not in solution
    assert ">>>" not in solution and "<<<" not in solution


@pytest.mark.parametrize("source, expected", [
    ("# >>> SOLUTION: no label\nx = 1\n# <<< SOLUTION\n", "# TODO: no label\n"),
    ("# >>> SOLUTION\nx = 1\n# <<< SOLUTION\n", "# TODO\n"),
    ("#>>>SOLUTION TP3: tight: colons kept\nx = 1\n#<<<SOLUTION\n", "# TODO TP3: tight: colons kept\n"),
    ("x = 0\n# >>> SOLUTION T\nx = 1\n# --- STUDENT\n# if x:\n#     x = 2\n#\n# x += 1\n# <<< SOLUTION\n",
     "x = 0\n# TODO T\nif x:\n    x = 2\n\nx += 1\n"),
    ("def f():\n    # >>> SOLUTION T\n    return 1\n    # --- STUDENT\n    # # a hint only\n    # <<< SOLUTION\n",
     "def f():\n    # TODO T\n    # a hint only\n    pass\n"),
    ("def f():\n    '''doc'''\n    # >>> SOLUTION T\n    return 1\n    # <<< SOLUTION\n",
     "def f():\n    '''doc'''\n    # TODO T\n"),
    ("# >>> SOLUTIONS are not markers\nx = 1\n", "# >>> SOLUTIONS are not markers\nx = 1\n"),
    ("a = 1\r\n# >>> SOLUTION T\r\nb = 2\r\n# <<< SOLUTION", "a = 1\n# TODO T"),
])
def test_marker_edge_cases(source, expected):
    assert student_version(source) == expected


@pytest.mark.parametrize("source, line, message", [
    ("x = 1\n# >>> SOLUTION A\ny = 2\n", 2, "never closed"),
    ("x = 1\n# <<< SOLUTION\n", 2, "without an opening"),
    ("# >>> SOLUTION A\n# >>> SOLUTION B\n# <<< SOLUTION\n", 2, "inside the block opened at line 1"),
    ("# --- STUDENT\n", 1, "outside"),
    ("# >>> SOLUTION A\n# --- STUDENT\n# a\n# --- STUDENT\n# <<< SOLUTION\n", 4, "second"),
    ("# >>> SOLUTION A\nx = 1\n# --- STUDENT\nx = 2\n# <<< SOLUTION\n", 4, "commented out"),
])
def test_unbalanced_markers_name_file_and_line(source, line, message):
    with pytest.raises(MarkerError, match=message) as caught:
        student_version(source, "tp.py")
    assert caught.value.line == line and str(caught.value).startswith(f"tp.py:{line}: ")


def notebook(*cells):
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": kind, "metadata": {"tags": tags}, "source": source,
         **({"outputs": [{"output_type": "stream", "name": "stdout", "text": "42"}], "execution_count": 3}
            if kind == "code" else {})}
        for kind, source, tags in cells]}, indent=1)


MARKED = "# >>> SOLUTION TP0: pick a value\nVALUE = 2\n# --- STUDENT\n# VALUE = None\n# <<< SOLUTION\n"


@pytest.fixture
def course(tmp_path):
    solutions = tmp_path / "tp_scripts" / "solutions"
    (solutions / "lib").mkdir(parents=True)
    (solutions / "train.py").write_text(TRAIN)
    (solutions / "lib" / "marked.py").write_text(MARKED)
    (solutions / "lib" / "plain.py").write_text("VALUE = 1\n")  # no markers: never generated
    (solutions / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (solutions / "run.sh").chmod(0o755)
    (solutions / "tp1.ipynb").write_text(notebook(
        ("markdown", "# TP1", []),
        ("code", "%matplotlib inline\n# >>> SOLUTION TP1.1: pick a batch size\nbatch = 256\n"
                 "# --- STUDENT\n# batch = ...\n# <<< SOLUTION", []),
        ("code", "# measure the step time\nresult = batch * 2\n# --- STUDENT\n# result = None", ["solution"]),
        ("code", "print(batch)", [])))
    (solutions / "plain.ipynb").write_text(notebook(("code", "print(1)", [])))  # nothing marked: not generated
    (tmp_path / "notebooks" / "solutions").mkdir(parents=True)
    (tmp_path / "notebooks" / "day9.ipynb").write_text(notebook(("code", "print(1)", [])))
    (tmp_path / "notebooks" / "solutions" / "day1.ipynb").write_text(notebook(
        ("code", "x = 1\n# >>> SOLUTION TP1.0: double it\nx *= 2\n# <<< SOLUTION", [])))
    return tmp_path, solutions, tmp_path / "tp_scripts"


def test_build_writes_student_files_of_marked_sources_only(course):
    root, solutions, out = course
    written = build(solutions, out)
    assert sorted(p.relative_to(out).as_posix() for p in written) == ["lib/marked.py", "tp1.ipynb", "train.py"]
    assert not (out / "lib" / "plain.py").exists() and not (out / "run.sh").exists()
    assert not (out / "plain.ipynb").exists()
    train = (out / "train.py").read_text().splitlines()
    assert train[0] == "#!/usr/bin/env python" and train[1] == RULE
    header = "\n".join(train[1:train.index(RULE, 2) + 1])
    assert "YOUR COPY of train.py: the file you edit" in header
    assert "What it does: tiny training step" in header
    assert "Run by notebooks/day9.ipynb." in header and "gone.ipynb" not in header  # only notebooks that exist
    assert "Reference solution: tp_scripts/solutions/train.py" in header
    assert "Generated by `python -m dlokit.material build`" in header
    assert "    # TODO TP1.2: run the forward pass under autocast" in train
    assert (out / "lib" / "marked.py").read_text().endswith("# TODO TP0: pick a value\nVALUE = None\n")
    cells = json.loads((out / "tp1.ipynb").read_text())["cells"]
    assert cells[1]["source"] == "%matplotlib inline\n# TODO TP1.1: pick a batch size\nbatch = ..."
    assert cells[1]["outputs"] == [] and cells[1]["execution_count"] is None
    assert cells[2]["source"] == "# TODO: measure the step time\nresult = None"
    assert cells[3]["outputs"] and cells[3]["source"] == "print(batch)"
    assert "solutions/tp1.ipynb" in json.loads((out / "tp1.ipynb").read_text())["metadata"]["dlokit"]["generated"]
    for path in out.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")
    assert build(solutions, out) == [] and stale(solutions, out) == []


def test_marker_less_module_kept_twice_is_reported(course):
    root, solutions, out = course
    build(solutions, out)
    (out / "lib" / "plain.py").write_text("VALUE = 1\n")  # a hand-made copy of a shared module
    assert stale(solutions, out) == [f"duplicate: {solutions / 'lib' / 'plain.py'} and {out / 'lib' / 'plain.py'} "
                                     f"(no solution markers: keep the module once, in {out})"]
    assert build(solutions, out) == [] and (out / "lib" / "plain.py").exists()  # not the build's file to remove


def test_a_script_marked_copy_is_copied_whole_with_nothing_to_edit(course):
    """A loop without a TODO that imports the student's files beside it (train_llm.py) is generated whole; without
    the line it would be a module kept twice."""
    root, solutions, out = course
    (solutions / "loop.py").write_text('"""The loop."""\n# dlokit.material: copy\nimport marked\n')
    assert "loop.py" in [p.name for p in build(solutions, out)]
    text = (out / "loop.py").read_text()
    assert "A COPY of loop.py, run with your files beside it: nothing to edit here." in text and "Copied from" in text
    assert text.endswith('"""The loop."""\n# dlokit.material: copy\nimport marked\n') and stale(solutions, out) == []
    (out / "loop.py").write_text("import marked\n")  # edited by hand: the build puts it back
    assert stale(solutions, out) == [f"stale: {out / 'loop.py'} (from {solutions / 'loop.py'})"]


def test_default_pairs_skip_missing_folders(tmp_path):
    assert DEFAULT_PAIRS == (("tp_scripts/solutions", "tp_scripts"), ("tp_scripts/llm/solutions", "tp_scripts/llm"))
    assert default_pairs(tmp_path) == []
    (tmp_path / "notebooks" / "solutions").mkdir(parents=True)
    assert default_pairs(tmp_path) == []  # notebooks are written as given out: only an explicit pair builds them
    (tmp_path / "tp_scripts" / "solutions").mkdir(parents=True)
    assert default_pairs(tmp_path) == [(tmp_path / "tp_scripts" / "solutions", tmp_path / "tp_scripts")]
    assert run_cli("check", cwd=tmp_path / "notebooks").returncode != 0  # no solutions folder there: says so


def test_student_copy_adds_the_shared_modules(course, tmp_path):
    root, solutions, out = course
    (out / "shared.py").write_text("SHARED = True\n")
    copy = tmp_path / "trial" / "student"
    written = student_copy(out, copy)
    assert sorted(p.relative_to(copy).as_posix() for p in written) == ["lib/marked.py", "shared.py", "tp1.ipynb",
                                                                        "train.py"]
    assert (copy / "shared.py").read_text() == "SHARED = True\n"
    assert "# Run by" not in (copy / "train.py").read_text()  # no notebooks/ beside that copy


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dlokit.material", *args], cwd=cwd, capture_output=True, text=True)


def test_check_detects_stale_missing_and_orphan_files(course):
    root, solutions, out = course
    assert run_cli("check", cwd=root).returncode == 1
    built = run_cli("build", cwd=root)
    assert built.returncode == 0, built.stderr
    assert not (root / "notebooks" / "day1.ipynb").exists()  # notebooks/solutions is not a default pair
    built = run_cli("build", "--solutions", "notebooks/solutions", "--out", "notebooks", cwd=root)
    assert built.returncode == 0, built.stderr
    day1 = json.loads((root / "notebooks" / "day1.ipynb").read_text())
    assert day1["cells"][0]["source"] == "x = 1\n# TODO TP1.0: double it"
    assert run_cli("check", cwd=root).returncode == 0
    (solutions / "train.py").write_text(TRAIN.replace("return logits", "return logits.float()"))
    (solutions / "lib" / "marked.py").rename(solutions / "lib" / "renamed.py")
    checked = run_cli("check", "--solutions", "tp_scripts/solutions", "--out", "tp_scripts", cwd=root)
    assert checked.returncode == 1
    assert "stale: tp_scripts/train.py" in checked.stdout
    assert "missing: tp_scripts/lib/renamed.py" in checked.stdout
    assert "orphan: tp_scripts/lib/marked.py" in checked.stdout
    run_cli("build", cwd=root)
    assert not (out / "lib" / "marked.py").exists() and run_cli("check", cwd=root).returncode == 0
    (solutions / "lib" / "renamed.py").write_text("VALUE = 3\n")  # its markers removed: no longer generated
    checked = run_cli("check", cwd=root)
    assert checked.returncode == 1 and "orphan: tp_scripts/lib/renamed.py" in checked.stdout
    run_cli("build", cwd=root)
    assert not (out / "lib" / "renamed.py").exists() and run_cli("check", cwd=root).returncode == 0


def test_build_reports_unbalanced_marker_and_writes_nothing(course):
    root, solutions, out = course
    (solutions / "broken.py").write_text("x = 1\n\n# >>> SOLUTION TP9: never closed\ny = 2\n")
    result = run_cli("build", cwd=root)
    assert result.returncode == 2 and "tp_scripts/solutions/broken.py:3: '>>> SOLUTION' never closed" in result.stderr
    assert not (out / "train.py").exists()


def test_build_refuses_code_that_does_not_compile(course):
    root, solutions, out = course
    (solutions / "bad.py").write_text("if True:\n    # >>> SOLUTION T\n    x = 1\n    # --- STUDENT\n    # x = (\n    # <<< SOLUTION\n")
    result = run_cli("build", cwd=root)
    assert result.returncode == 2 and "bad.py:" in result.stderr and "does not compile" in result.stderr
    assert not (out / "train.py").exists()


def test_compare_finds_solution_and_shows_what_is_left(course):
    root, solutions, out = course
    build(solutions, out)
    assert find_solution(out / "lib" / "marked.py") == (solutions / "lib" / "marked.py").resolve()
    diff = compare(out / "train.py")
    assert "+    with torch.autocast(device.type" in diff and "-    logits = model(images)" in diff
    assert "Generated by" not in diff and ">>> SOLUTION" not in diff and "YOUR COPY" not in diff
    assert "====" not in diff and "#!/usr/bin/env python" not in diff  # header gone, first line kept
    (out / "lib" / "marked.py").write_text((out / "lib" / "marked.py").read_text().replace("None", "2"))
    diff = compare(out / "lib" / "marked.py")  # a finished TODO: only its comment line differs
    assert "-# TODO TP0: pick a value" in diff and "+VALUE" not in diff and "-VALUE" not in diff
    html = compare(out / "tp1.ipynb", html=True).data
    assert '<pre class="dlokit-diff">' in html and "<table" not in html and "+batch = 256" in html
    cli = run_cli("compare", "tp_scripts/train.py", cwd=root)
    assert cli.returncode == 0 and "+    model = model.to(memory_format=torch.channels_last)" in cli.stdout
    with pytest.raises(FileNotFoundError):
        find_solution(root / "elsewhere.py")


def test_compare_as_the_notebooks_write_it_shows_one_tp_numbered_like_the_editor_in_one_column():
    """`dlokit.material.compare(...)` after `import dlokit` alone; its HTML fits a 968 px output (12 px monospace:
    about 7 px a character, no side-by-side table); its numbers are the student file's lines."""
    import dlokit

    alone = subprocess.run([sys.executable, "-c", "import dlokit; print(dlokit.material.compare.__name__)"],
                           capture_output=True, text=True)
    assert alone.stdout.strip() == "compare", alone.stderr
    student = REPO / "tp_scripts" / "train_classifier.py"
    html = dlokit.material.compare(student, tp="TP1.3", html=True).data
    assert "<table" not in html and "white-space: pre-wrap" in html and "font-size: 12px" in html
    rows = re.findall(r'<div class="(\w+)">(.*?)</div>', html)
    assert rows and max(len(unescape(text)) for _, text in rows) <= 130
    text = dlokit.material.compare(student, tp="TP1.3", html=False)
    changed = [line for line in text.splitlines() if re.match(r"^ *\d* [-+]", line)]
    assert any("TODO TP1.3" in line for line in changed) and any("channels_last" in line for line in changed)
    assert not any("TP2.4" in line or "mixer" in line for line in changed)  # Day 2's block nearby: context only
    lines = student.read_text().splitlines()
    numbered = [m for m in map(re.compile(r"^ *(\d+) [ -](.*)$").match, text.splitlines()) if m]
    assert numbered and all(lines[int(m[1]) - 1] == m[2] for m in numbered)
    with pytest.raises(ValueError, match="no block of TP9.9"):
        dlokit.material.compare(student, tp="TP9.9")


@pytest.mark.skipif(not (REPO / "tp_scripts" / "solutions").is_dir() and not (REPO / "notebooks" / "solutions").is_dir(),
                    reason="no solution material in the repository yet")
def test_repository_student_material_is_up_to_date():
    result = run_cli("check", cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_edit_links_follow_the_todo_lines(tmp_path):
    """A notebook's ✏️ link opens the student file at its TODO's first line and names its lines; the build keeps
    them true, check lists them when they are not, and a link to a TODO the file does not hold is an error."""
    from dlokit.material import edit_links

    (tmp_path / "tp_scripts").mkdir()
    script = tmp_path / "tp_scripts" / "train.py"
    script.write_text("import torch\n\n    # TODO TP9.1\nx = 1\n    # TODO TP9.1\n")
    (tmp_path / "notebooks").mkdir()
    notebook = tmp_path / "notebooks" / "day9.ipynb"
    link = "✏️ [tp_scripts/train.py](../tp_scripts/train.py{}): `TODO TP9.1`"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "markdown", "metadata": {}, "source": [f"## TP9.1\n\n{link.format('')}"]}],
                                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n")
    assert edit_links.stale_links(tmp_path) == [f"{notebook}: an edit link's line numbers are out of date"]
    assert edit_links.refresh(tmp_path) == [notebook]
    assert f"{link.format('#line=2')}, lines 3, 5" in notebook.read_text() and edit_links.stale_links(tmp_path) == []
    script.write_text("# a line more\n" + script.read_text())  # the TODOs moved down
    assert edit_links.stale_links(tmp_path) and edit_links.refresh(tmp_path) == [notebook]
    assert f"{link.format('#line=3')}, lines 4, 6" in notebook.read_text()
    script.write_text("import torch\n")
    with pytest.raises(ValueError, match="holds no `TODO TP9.1`"):
        edit_links.refresh(tmp_path)


def test_every_tp_that_edits_a_file_links_it():
    """Each TODO of the student files is linked from a notebook's TP text, and each link names a TODO."""
    from dlokit.material import edit_links

    linked = {(m["href"].removeprefix("../"), m["tp"]) for notebook in edit_links.notebooks(REPO)
              for m in edit_links.LINK.finditer(notebook.read_text(encoding="utf-8"))}
    todos = {(path.relative_to(REPO).as_posix(), tp) for path in (REPO / "tp_scripts").rglob("*.py")
             if "solutions" not in path.parts
             for tp in set(__import__("re").findall(r"#\s*TODO (TP\d+\.\d+)", path.read_text(encoding="utf-8")))}
    assert todos - linked == set(), f"TODOs no notebook links: {sorted(todos - linked)}"
