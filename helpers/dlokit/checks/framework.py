"""The check-cell framework: a result with three outcomes, how it is shown, the decorator, the scoreboard.

A check answers with one of three statuses:

* ``passed``  ✅  the script did what the TP asks (seen in its run record);
* ``failed``  ❌  it did not, or the run is missing/unfinished; the message says what to do;
* ``not applicable``  ➖  this hardware cannot show it; the message reads
  "not applicable on this hardware: <why>" (e.g. tensor-core speed-ups on a CPU-only machine).

A result may also carry *parts*: the separately judged aspects of one TP, typically the code (judged
from what the script observed) and the effect (speed, memory: measured, and compared with what the
lesson predicts). A part has the same statuses plus ``info`` (ℹ️: measured and shown, not judged).
A check that passes on its code while its speed part is not applicable here stays ✅, with a
"➖ speed: not applicable on this hardware: ..." line under it.

Every result is displayed (HTML in Jupyter, text elsewhere) and carried under the MIME type
``application/vnd.dlokit.check+json`` (see CheckResult.as_json for its keys); the notebook tests read it
back with results_in_notebook().
"""
from __future__ import annotations

import functools
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from dlokit.in_job import untrusted

MIME = "application/vnd.dlokit.check+json"
PASSED, FAILED, NOT_APPLICABLE = "passed", "failed", "not applicable"
INFO = "info"  # parts only: measured and reported, not judged
STATUSES = (PASSED, FAILED, NOT_APPLICABLE)
MARKS = {PASSED: "✅", FAILED: "❌", NOT_APPLICABLE: "➖", INFO: "ℹ️"}
COLOURS = {PASSED: "#1a7f37", FAILED: "#cf222e", NOT_APPLICABLE: "#6e7781", INFO: "#0969da"}
NOT_APPLICABLE_PREFIX = "not applicable on this hardware: "

RESULTS: list["CheckResult"] = []  # every check shown in this session, for scoreboard()
CHECKS: dict[str, str] = {}  # check function name -> check name, filled by @check


@dataclass
class Part:
    """One judged or measured aspect of a check: ``code``, ``speed``, ``memory``, ``pinned memory``..."""

    name: str
    status: str
    message: str

    def __post_init__(self):
        if self.status not in (*STATUSES, INFO):
            raise ValueError(f"unknown part status {self.status!r}")

    @property
    def mark(self) -> str:
        return MARKS[self.status]

    def __str__(self) -> str:
        said = self.message if self.message.startswith(f"{self.name}: ") else f"{self.name}: {self.message}"
        return f"{self.mark} {said}"  # a message that names its part already (it may head the check) says it once

    def as_json(self) -> dict:
        return {"name": self.name, "status": self.status, "mark": self.mark, "message": self.message}


@dataclass
class CheckResult:
    """What a check cell says. ``status`` is one of STATUSES (a bool is accepted: True = passed)."""

    check: str
    status: str
    message: str
    details: list[str] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.status, bool):
            self.status = PASSED if self.status else FAILED
        if self.status not in STATUSES:
            raise ValueError(f"unknown check status {self.status!r}; expected one of {STATUSES}")
        self.details = [str(d) for d in self.details]
        self.parts = [p if isinstance(p, Part) else Part(**p) for p in self.parts]

    @property
    def passed(self) -> bool:
        """False only when the check failed: ✅ and ➖ (not applicable here) are both not failures."""
        return self.status != FAILED

    @property
    def applicable(self) -> bool:
        return self.status != NOT_APPLICABLE

    @property
    def mark(self) -> str:
        return MARKS[self.status]

    def part(self, name: str) -> Part | None:
        return next((p for p in self.parts if p.name == name), None)

    def _part_lines(self) -> list[str]:
        """One line per part; a part whose message is the headline shows only its mark and name."""
        return [f"{p.mark} {p.name}" if p.message == self.message else str(p) for p in self.parts]

    def __str__(self) -> str:
        lines = [f"{self.mark} {self.check}: {self.message}"]
        lines += [f"   {line}" for line in self._part_lines()] + [f"   • {d}" for d in self.details]
        return "\n".join(lines)

    def as_json(self) -> dict:
        """The MIME bundle's payload: check, status, passed, mark, message, parts, details, info."""
        return {"check": self.check, "status": self.status, "passed": self.passed, "mark": self.mark,
                "message": self.message, "parts": [p.as_json() for p in self.parts], "details": self.details,
                "info": _jsonable(self.info)}

    def _repr_mimebundle_(self, include=None, exclude=None):
        colour = COLOURS[self.status]
        parts = "".join(f'<li style="list-style:none;margin-left:-1.2em">{html.escape(line)}</li>'
                        for line in self._part_lines())
        items = "".join(f"<li>{html.escape(d)}</li>" for d in self.details)
        body = (f'<div style="border-left:4px solid {colour};padding:4px 10px;margin:4px 0">'
                f"<b>{self.mark} {html.escape(self.check)}</b>: {html.escape(self.message)}"
                f"{'<ul style=margin:2px>' + parts + items + '</ul>' if parts or items else ''}</div>")
        return {"text/plain": str(self), "text/html": body, MIME: self.as_json()}


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


# ---- building results (the check's name is filled in by @check) --------------------------------

def three_digits(value, missing: str = "?") -> str:
    """A recorded number as a check's text shows it, to 3 significant digits (0.295, not 0.29472988843917847);
    what is not a number, as it was recorded (`missing` when nothing was)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.3g}"
    try:
        return f"{float(value):.3g}"
    except (TypeError, ValueError):
        return missing if value is None else str(value)


def passed(message: str, details=(), parts=(), **info) -> CheckResult:
    return CheckResult("", PASSED, message, list(details), list(parts), info)


def failed(message: str, details=(), parts=(), **info) -> CheckResult:
    return CheckResult("", FAILED, message, list(details), list(parts), info)


def not_applicable(why: str, details=(), parts=(), **info) -> CheckResult:
    """Status 'not applicable'; the message is 'not applicable on this hardware: <why>'."""
    return CheckResult("", NOT_APPLICABLE, NOT_APPLICABLE_PREFIX + why, list(details), list(parts), info)


def part(name: str, status: str, message: str) -> Part:
    if status == NOT_APPLICABLE and not message.startswith(NOT_APPLICABLE_PREFIX):
        message = NOT_APPLICABLE_PREFIX + message
    return Part(name, status, message)


def same_computation(name: str, effect: str, base_runs, arms: dict) -> Part | None:
    """An ℹ️ part in place of a measured effect when an arm's records show it computed what the baseline computed
    (dlokit.lessons.untreated: the TODO named): its speed is no effect to judge, and never a ✅. None when every
    arm's treatment happened."""
    from dlokit import lessons

    same = [f"{label}: {why}" for label, runs in arms.items() if base_runs and (why := lessons.untreated(effect, base_runs, runs))]
    return part(name, INFO, f"same computation, no effect to judge ({'; '.join(same)})") if same else None


def from_parts(parts, message: str, details=(), **info) -> CheckResult:
    """Combine parts: failed if one failed (its message first), else passed if one passed (with
    `message`), else not applicable (the first part's reason)."""
    parts = [p for p in parts if p is not None]
    failures = [p for p in parts if p.status == FAILED]
    if failures:
        return CheckResult("", FAILED, failures[0].message, list(details), parts, info)
    if any(p.status == PASSED for p in parts):
        return CheckResult("", PASSED, message, list(details), parts, info)
    why = next((p.message for p in parts if p.status == NOT_APPLICABLE), NOT_APPLICABLE_PREFIX + message)
    return CheckResult("", NOT_APPLICABLE, why, list(details), parts, info)


# ---- showing them -------------------------------------------------------------------------------

def show(result: CheckResult) -> CheckResult:
    """Display a result once (rich in Jupyter, text in a terminal) and remember it for scoreboard()."""
    RESULTS.append(result)
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(result)
            return result
    except ImportError:
        pass
    print(result)
    return result


def check(name: str):
    """Decorator of a check function: names its result (the name is written only here), shows it,
    and turns any unexpected error into a ❌ that says so (a check cell never stops the notebook)."""

    def wrap(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            try:
                result = function(*args, **kwargs)
                if not isinstance(result, CheckResult):
                    raise TypeError(f"{function.__name__} returned {type(result).__name__}, not a CheckResult")
                result.check = name
            except Exception as error:
                result = CheckResult(name, FAILED, f"the check itself could not run ({type(error).__name__}: "
                                     f"{error}); look at the job's log with dlokit.search_log()")
            return show(result)

        run.check_name = name
        CHECKS[function.__name__] = name
        return run

    return wrap


def scoreboard():
    """A table of every check shown in this session (latest result per check): a DataFrame that a notebook shows
    whole (no message cut) and, after a ❌, with what to do next."""
    latest = {}
    for result in RESULTS:
        latest[result.check] = result
    return Scoreboard([{"check": r.check, "result": r.mark, "status": r.status, "message": r.message}
                       for r in latest.values()], columns=["check", "result", "status", "message"])


def _scoreboard_class():
    import pandas as pd

    class Scoreboard(pd.DataFrame):
        @property
        def _constructor(self):
            return Scoreboard

        def _whole(self) -> bool:  # a slice or a re-indexed copy is shown as any DataFrame
            return {"check", "result", "status", "message"} <= set(self.columns)

        def _repr_html_(self):
            if not self._whole():
                return super()._repr_html_()
            rows = "".join(
                f"<tr><td style='white-space:nowrap;text-align:left'>{html.escape(str(r.check))}</td>"
                f"<td>{r.result}</td><td style='text-align:left;white-space:normal'>{html.escape(str(r.message))}</td></tr>"
                for r in self.itertuples())
            table = (f"<table class='dlokit-scoreboard'><tr><th>check</th><th></th><th>message</th></tr>{rows}</table>"
                     if len(self) else "<p>no check shown yet</p>")
            advice = what_next(self)
            return table + (f"<p>{html.escape(advice)}</p>" if advice else "")

        def __repr__(self):
            if not self._whole():
                return super().__repr__()
            advice = what_next(self)
            lines = [f"{r.result} {r.check}: {r.message}" for r in self.itertuples()]
            return "\n".join(lines + ([advice] if advice else [])) or "no check shown yet"

    return Scoreboard


Scoreboard = _scoreboard_class()
TP_NAME = re.compile(r"TP\d+\.\d+")


def what_next(board) -> str:
    """After a ❌: which TPs failed, and how to see what is left in their files; '' when none failed."""
    failed = [str(check) for check, status in zip(board["check"], board["status"]) if status == FAILED]
    if not failed:
        return ""
    tps = sorted({tp for check in failed for tp in TP_NAME.findall(check)})
    todos = student_todos(tps)
    stuck = (" Stuck on a TODO? " + ", ".join(f'dlokit.material.compare("{f}", tp="{tp}")' for f, tp in todos)
             + " shows what your file still lacks against the solution, in that TP's blocks.") if todos else ""
    return (f"What next: {len(failed)} check(s) ❌ ({', '.join(failed)}). Each message says what to change: fix "
            "it in your file (the ✏️ link of its TP), run that TP's cells again, then this cell." + stuck)


def student_todos(tps) -> list[tuple[str, str]]:
    """(student file, as a notebook beside tp_scripts/ names it, TP) for each TP of `tps` whose `TODO <tp>` the
    file holds."""
    from dlokit.material.markers import todo_pattern

    root = Path("..") / "tp_scripts"
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.rglob("*.py")):
        if "solutions" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found += [(path.as_posix(), tp) for tp in tps if todo_pattern(tp).search(text)]
    return found


def results_in_notebook(path) -> list[dict]:
    """Every check result stored in an executed notebook's outputs (the MIME payloads, as dicts)."""
    notebook = untrusted.read_json(path, untrusted.NOTEBOOK_BYTES)  # maybe a student's: see dlokit.in_job.untrusted
    found = []
    for cell in _objects(notebook.get("cells") if isinstance(notebook, dict) else None):
        for output in _objects(cell.get("outputs")):
            data = output.get("data")
            if isinstance(data, dict) and MIME in data:
                value = data[MIME]
                try:
                    value = json.loads(value) if isinstance(value, str) else value
                except (ValueError, RecursionError):
                    continue
                if isinstance(value, dict):
                    found.append(value)
    return found


def _objects(value) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
