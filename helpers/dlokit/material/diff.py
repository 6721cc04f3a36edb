"""compare(student, solution): what the student's file still lacks, as a diff numbered like the student's editor.

    dlokit.material.compare("../tp_scripts/train_classifier.py", tp="TP1.3")   # only TP1.3's blocks
"""
from __future__ import annotations

import difflib
import html as markup
from pathlib import Path

from dlokit.material.build import GENERATED, header_span
from dlokit.material.markers import solution_lines, todo_pattern
from dlokit.material.notebooks import code_cells

# one column of rows, wrapped inside the output (a side-by-side table was twice the notebook's width)
DIFF_STYLE = """<style>
pre.dlokit-diff {font-family: monospace; font-size: 12px; white-space: pre-wrap; overflow-wrap: anywhere;
  max-width: 100%; margin: 0; border: 1px solid #ccc; padding: 4px}
pre.dlokit-diff .head {color: #666} pre.dlokit-diff .hunk {color: #0969da}
pre.dlokit-diff .sub {background: #f8c6c6} pre.dlokit-diff .add {background: #c6f7c6}
</style>"""
KINDS = {" ": "same", "-": "sub", "+": "add"}


def find_solution(student_path) -> Path:
    """The matching file in the nearest `solutions/` folder: a/b/x.py -> a/b/solutions/x.py, a/solutions/b/x.py..."""
    student = Path(student_path).resolve()
    for folder in student.parents:
        candidate = folder / "solutions" / student.relative_to(folder)
        if candidate.is_file() and candidate != student:
            return candidate
    raise FileNotFoundError(f"no solutions/ counterpart of {student_path}")


def _notebook_text(path: Path, solution: bool) -> str:
    cells = code_cells(path.read_text(encoding="utf-8"), str(path), solution=solution)
    return "".join(f"# --- cell {i}\n{cell.rstrip()}\n" for i, cell in enumerate(cells))


def student_lines(path: Path) -> list[tuple[int, str]]:
    """The student's lines with the numbers their editor shows, the generated header left out (a notebook: its
    code cells one after the other, numbered in that text)."""
    if path.suffix == ".ipynb":
        return list(enumerate(_notebook_text(path, solution=False).splitlines(), 1))
    lines = path.read_text(encoding="utf-8").splitlines()
    header = header_span(lines)
    return [(number, line) for number, line in enumerate(lines, 1)
            if number - 1 not in header and GENERATED not in line]


def labelled_solution(path: Path) -> list[tuple[str | None, str]]:
    """The solution's lines, markers removed, each with the label of its block (a notebook's: none)."""
    if path.suffix == ".ipynb":
        return [(None, line) for line in _notebook_text(path, solution=True).splitlines()]
    return [(label, line) for label, line in solution_lines(path.read_text(encoding="utf-8"), str(path))
            if GENERATED not in line]


def hunks(before, after, context: int, tp: str | None = None) -> list[list[tuple[str, int | None, str]]]:
    """The diff's hunks as rows (mark ' ', '-' or '+', the student's line number or None, text), `context` lines
    around each change. With `tp`, only that TP's changes (those adding a line of its solution blocks, or taking out
    the student's `TODO <tp>` line): another change shows the student's lines as they are, as context."""
    todo = todo_pattern(tp) if tp else None
    rows = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, [t for _, t in before], [t for _, t in after],
                                                       autojunk=False).get_opcodes():
        removed, added = before[i1:i2], after[j1:j2]
        if tag == "equal" or (todo and not any(label == tp for label, _ in added)
                              and not any(todo.search(text) for _, text in removed)):
            rows += [(" ", number, text) for number, text in removed]
        else:
            rows += [("-", number, text) for number, text in removed] + [("+", None, text) for _, text in added]
    spans = []  # [first, last] changed row of each hunk: changes closer than twice the context share one
    for index in (i for i, (mark, _, _) in enumerate(rows) if mark != " "):
        if spans and index - spans[-1][1] <= 2 * context + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return [rows[max(0, first - context): last + context + 1] for first, last in spans]


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def compare(student_path, solution_path=None, html: bool | None = None, context: int = 3, tp: str | None = None):
    """The student file against the solution (markers removed), as a unified diff whose line numbers are the
    student file's own; `tp` ("TP1.3"): only the hunks of that TP. In a notebook an HTML block that wraps inside
    the output, elsewhere text."""
    student = Path(student_path)
    solution = Path(solution_path) if solution_path else find_solution(student)
    before, after = student_lines(student), labelled_solution(solution)
    if tp and not any(label == tp for label, _ in after) and not any(todo_pattern(tp).search(t) for _, t in before):
        labels = sorted({label for label, _ in after if label})
        raise ValueError(f"no block of {tp} in {solution}" + (f": its TPs are {', '.join(labels)}" if labels else ""))
    rows = [("head", f"--- your file: {student}"), ("head", f"+++ the solution: {solution}")]
    found = hunks(before, after, context, tp)
    for hunk in found:
        first = next((number for _, number, _ in hunk if number), None)
        rows.append(("hunk", f"@@ your line {first} @@"))
        rows += [(KINDS[mark], f"{number or '':>5} {mark}{text}") for mark, number, text in hunk]
    if not found:
        rows.append(("head", f"no difference left{f' in {tp}' if tp else ''}: your file does what the solution does"))
    if html is None:
        html = _in_notebook()
    if not html:
        return "\n".join(text for _, text in rows)
    from IPython.display import HTML

    body = "".join(f'<div class="{kind}">{markup.escape(text) or " "}</div>' for kind, text in rows)
    return HTML(f'{DIFF_STYLE}<pre class="dlokit-diff">{body}</pre>')
