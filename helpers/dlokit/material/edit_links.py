"""The notebooks' links to the file a student edits, with the lines of its TODOs, kept true by the build.

A TP's text says where to edit with a link JupyterLab opens in its editor at the first TODO (JupyterLab's root is
the repository, README):

    ✏️ [tp_scripts/train_classifier.py](../tp_scripts/train_classifier.py#line=277): `TODO TP1.1`, lines 278, 446

`python -m dlokit.material build` rewrites the line numbers from the student file (the fragment and `lines …` are
the build's part of the text), `check` lists a link whose lines are out of date, and one that names a TODO the
file does not hold. Once a student's own edits have moved the lines, the link text names the TODO to search for.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from dlokit.material.markers import todo_pattern

LINK = re.compile(r"✏️ \[(?P<label>[^\]\n]+)\]\((?P<href>\.\./[\w/.-]+\.py)(?:#line=\d+)?\): "
                  r"`TODO (?P<tp>TP\d+\.\d+)`(?P<lines>, lines? [\d, ]+)?")


def todo_lines(script: Path, tp: str) -> list[int]:
    """The 1-based lines of `# TODO <tp>` in a student file."""
    pattern = todo_pattern(tp)
    return [n for n, line in enumerate(script.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]


def _rewrite(text: str, notebook: Path, problems: list[str]) -> str:
    def fill(match: re.Match) -> str:
        script = (notebook.parent / match["href"]).resolve()
        lines = todo_lines(script, match["tp"]) if script.is_file() else []
        if not lines:
            problems.append(f"{notebook.name}: {match['href']} holds no `TODO {match['tp']}`")
            return match[0]
        said = f", line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}"
        # JupyterLab 4's file editor reads #line=N as RFC 5147 does, the place after N lines: line L is #line=L-1
        return f"✏️ [{match['label']}]({match['href']}#line={lines[0] - 1}): `TODO {match['tp']}`{said}"

    return LINK.sub(fill, text)


def refreshed(notebook: Path) -> tuple[str, list[str]]:
    """(the notebook's text with its edit links' lines as the student files have them, problems)."""
    text = notebook.read_text(encoding="utf-8")
    data, problems = json.loads(text), []
    for cell in data.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new = _rewrite(source, notebook, problems)
        if new != source:
            cell["source"] = new.splitlines(keepends=True)
    out = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    return (text if json.loads(text) == data else out), problems


def notebooks(root: Path) -> list[Path]:
    return sorted((Path(root) / "notebooks").glob("*.ipynb"))


def refresh(root: Path) -> list[Path]:
    """Rewrite the notebooks whose edit links are out of date; returns them. ValueError on a link to no TODO."""
    changed, problems = [], []
    for notebook in notebooks(root):
        text, found = refreshed(notebook)
        problems += found
        if text != notebook.read_text(encoding="utf-8"):
            notebook.write_text(text, encoding="utf-8")
            changed.append(notebook)
    if problems:
        raise ValueError("; ".join(problems))
    return changed


def stale_links(root: Path) -> list[str]:
    """What `check` reports: notebooks whose edit links' lines are out of date, links to no TODO."""
    found = []
    for notebook in notebooks(root):
        text, problems = refreshed(notebook)
        found += problems
        if text != notebook.read_text(encoding="utf-8"):
            found.append(f"{notebook}: an edit link's line numbers are out of date")
    return found
