"""Solution markers: one source file gives both the solution and the student version.

    # >>> SOLUTION TP1.2: run the forward pass under autocast
    <solution lines>
    # --- STUDENT                       (optional)
    # <student lines, commented with '# '>
    # <<< SOLUTION

The student version replaces the block with '# TODO TP1.2: run the forward pass under autocast'
(same indentation) and the uncommented student lines, or `pass` where the block was a whole suite.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# A script without a marked block whose student copy must sit beside the student's files (it imports them): a line
# `# dlokit.material: copy` anywhere in it has the build copy it whole, with a header saying there is nothing to edit.
COPY = re.compile(r"^[ \t]*#\s*dlokit\.material:\s*copy\b")
START = re.compile(r"^(?P<indent>[ \t]*)#\s*>>>\s*SOLUTION\b\s*(?P<label>[^:]*?)\s*(?::\s*(?P<text>.*?))?\s*$")
STUDENT = re.compile(r"^[ \t]*#\s*---\s*STUDENT\b")
END = re.compile(r"^[ \t]*#\s*<<<\s*SOLUTION\b")


class MarkerError(ValueError):
    """A marker out of place, reported as 'file:line: message'."""

    def __init__(self, source: str, line: int, message: str):
        super().__init__(f"{source}:{line}: {message}")
        self.source, self.line, self.message = source, line, message


@dataclass
class Block:
    start: int
    end: int = -1
    indent: str = ""
    label: str = ""
    text: str = ""
    solution: list[str] = field(default_factory=list)
    student: list[str] | None = None

    def todo(self) -> str:
        head = f"TODO {self.label}".rstrip()
        return f"{self.indent}# {head}: {self.text}" if self.text else f"{self.indent}# {head}"


def todo_pattern(tp: str) -> re.Pattern:
    """The `# TODO <tp>` comment a block leaves in the student's file (Block.todo), found in a line."""
    return re.compile(rf"#\s*TODO {re.escape(tp)}\b")


def has_markers(text: str) -> bool:
    return any(START.match(line) or END.match(line) for line in text.splitlines())


def is_copied(text: str) -> bool:
    """A script the build copies whole to the student folder (`# dlokit.material: copy`)."""
    return any(COPY.match(line) for line in text.splitlines())


def parse_blocks(lines: list[str], source: str = "<text>") -> list[Block]:
    """The marked blocks of a file's lines (0-based indices); MarkerError when unbalanced."""
    blocks, current = [], None
    for index, line in enumerate(lines):
        number = index + 1
        if START.match(line):
            if current:
                raise MarkerError(source, number, f"'>>> SOLUTION' inside the block opened at line {current.start + 1}")
            match = START.match(line)
            current = Block(index, indent=match["indent"], label=match["label"], text=match["text"] or "")
        elif STUDENT.match(line):
            if current is None:
                raise MarkerError(source, number, "'--- STUDENT' outside a '>>> SOLUTION' block")
            if current.student is not None:
                raise MarkerError(source, number, f"second '--- STUDENT' in the block opened at line {current.start + 1}")
            current.student = []
        elif END.match(line):
            if current is None:
                raise MarkerError(source, number, "'<<< SOLUTION' without an opening '>>> SOLUTION'")
            current.end = index
            blocks.append(current)
            current = None
        elif current is not None:
            if current.student is None:
                current.solution.append(line)
            else:
                current.student.append(_uncomment(line, source, number))
    if current:
        raise MarkerError(source, current.start + 1, "'>>> SOLUTION' never closed by '<<< SOLUTION'")
    return blocks


def _uncomment(line: str, source: str, number: int) -> str:
    body = line.lstrip(" \t")
    indent = line[: len(line) - len(body)]
    if not body:
        return ""
    if body.startswith("# "):
        return indent + body[2:]
    if body == "#":
        return ""
    raise MarkerError(source, number, "student lines must be commented out with '# '")


def _is_code(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _width(line: str) -> int:
    return len(line.expandtabs(8)) - len(line.expandtabs(8).lstrip())


def _needs_pass(output: list[str], lines: list[str], block: Block) -> bool:
    """True when the block was the whole body of a suite ('if ...:' with nothing else under it)."""
    before = next((line for line in reversed(output) if _is_code(line)), None)
    after = next((line for line in lines[block.end + 1:] if _is_code(line)), None)
    opens_suite = before is not None and before.rstrip().endswith(":") and _width(before) < _width(block.indent + "x")
    return opens_suite and (after is None or _width(after) < _width(block.indent + "x"))


def student_version(text: str, source: str = "<text>") -> str:
    """The text with every marked block replaced by its TODO line and student lines."""
    lines = text.splitlines()
    output, position = [], 0
    for block in parse_blocks(lines, source):
        output += lines[position:block.start]
        output.append(block.todo())
        student = block.student or []
        output += student
        if not any(_is_code(line) for line in student) and _needs_pass(output, lines, block):
            output.append(f"{block.indent}pass")
        position = block.end + 1
    output += lines[position:]
    return "\n".join(output) + ("\n" if text.endswith("\n") else "")


def solution_version(text: str, source: str = "<text>") -> str:
    """The text without markers and student lines: the code as the solution runs it."""
    lines = [line for _, line in solution_lines(text, source)]
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def solution_lines(text: str, source: str = "<text>") -> list[tuple[str | None, str]]:
    """solution_version's lines, each with the label of the block it comes from ("TP1.3"; None outside blocks)."""
    lines = text.splitlines()
    output, position = [], 0
    for block in parse_blocks(lines, source):
        output += [(None, line) for line in lines[position:block.start]]
        output += [(block.label, line) for line in block.solution]
        position = block.end + 1
    return output + [(None, line) for line in lines[position:]]
