"""compare(student, solution): what the student's file still lacks, as a diff."""
from __future__ import annotations

import difflib
from pathlib import Path

from dlokit.material.build import GENERATED, strip_header
from dlokit.material.markers import solution_version
from dlokit.material.notebooks import code_cells

DIFF_STYLE = """<style>
table.diff {font-family: monospace; font-size: 12px; border: 1px solid #ccc}
.diff_header {background: #eee; padding: 0 4px} td.diff_next {background: #f4f4f4}
.diff_add {background: #c6f7c6} .diff_chg {background: #fff3a8} .diff_sub {background: #f8c6c6}
</style>"""


def find_solution(student_path) -> Path:
    """The matching file in the nearest `solutions/` folder: a/b/x.py -> a/b/solutions/x.py, a/solutions/b/x.py..."""
    student = Path(student_path).resolve()
    for folder in student.parents:
        candidate = folder / "solutions" / student.relative_to(folder)
        if candidate.is_file() and candidate != student:
            return candidate
    raise FileNotFoundError(f"no solutions/ counterpart of {student_path}")


def _lines(path: Path, solution: bool) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".ipynb":
        cells = code_cells(text, str(path), solution=solution)
        text = "".join(f"# --- cell {i}\n{cell.rstrip()}\n" for i, cell in enumerate(cells))
    elif solution:
        text = solution_version(text, str(path))
    else:
        text = strip_header(text)
    return [line for line in text.splitlines() if GENERATED not in line]


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def compare(student_path, solution_path=None, html: bool | None = None, context: int = 3):
    """Diff of the student file against the solution (markers removed).

    In a notebook: an HTML side-by-side table (difflib.HtmlDiff); elsewhere: unified diff text.
    """
    student = Path(student_path)
    solution = Path(solution_path) if solution_path else find_solution(student)
    before, after = _lines(student, solution=False), _lines(solution, solution=True)
    if html is None:
        html = _in_notebook()
    if html:
        from IPython.display import HTML

        table = difflib.HtmlDiff(wrapcolumn=90).make_table(before, after, str(student), str(solution),
                                                           context=True, numlines=context)
        return HTML(DIFF_STYLE + table)
    diff = difflib.unified_diff(before, after, str(student), str(solution), n=context, lineterm="")
    return "\n".join(diff)
