"""Student notebooks: the same markers, applied code cell by code cell.

A code cell tagged `solution` is one whole block: its first comment line (if any) becomes the TODO
text, and lines after a '# --- STUDENT' line are the student part. Processed cells lose their outputs.
"""
from __future__ import annotations

import json

from dlokit.material.markers import STUDENT, has_markers, solution_version, student_version

SOLUTION_TAG = "solution"


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _tagged_cell_as_block(source: str) -> str:
    lines = source.splitlines()
    title = lines[0].lstrip("# ").strip() if lines and lines[0].startswith("#") and not STUDENT.match(lines[0]) else ""
    body = lines[1:] if title else lines
    return "\n".join([f"# >>> SOLUTION: {title or 'complete this cell'}", *body, "# <<< SOLUTION"])


def cell_is_marked(cell) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    return cell.get("cell_type") == "code" and (SOLUTION_TAG in tags or has_markers(_source(cell)))


def _convert(text: str, source: str, convert) -> str:
    notebook = json.loads(text)
    for index, cell in enumerate(notebook.get("cells", [])):
        if not cell_is_marked(cell):
            continue
        body = _source(cell)
        if SOLUTION_TAG in cell.get("metadata", {}).get("tags", []) and not has_markers(body):
            body = _tagged_cell_as_block(body)
        cell["source"] = convert(body, f"{source} (cell {index})").rstrip("\n")
        cell["outputs"], cell["execution_count"] = [], None
    return notebook


def student_notebook(text: str, source: str, header: str) -> str:
    """The student notebook as JSON text, with `header` recorded in its metadata."""
    notebook = _convert(text, source, student_version)
    notebook.setdefault("metadata", {})["dlokit"] = {"generated": header}
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def code_cells(text: str, source: str = "<notebook>", solution: bool = False) -> list[str]:
    """Sources of the code cells (solution=True: markers and student lines removed)."""
    notebook = _convert(text, source, solution_version) if solution else json.loads(text)
    return [_source(c) for c in notebook.get("cells", []) if c.get("cell_type") == "code"]
