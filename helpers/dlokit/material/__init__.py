"""Student and solution material from one source: marked blocks in solution files.

    python -m dlokit.material build     # tp_scripts/solutions -> tp_scripts (files with solution markers only)
    python -m dlokit.material check     # exit 1 and list student files a build would change (or duplicated)
    compare("tp_scripts/train_classifier.py")   # diff against tp_scripts/solutions/train_classifier.py

Shared modules without markers are never copied: they live once, in tp_scripts/, and the solutions import
them from there. student_copy(scripts, dest) makes a standalone student folder elsewhere (tests, trials).
"""
from dlokit.material.build import (BuildError, build, default_pairs, has_solution, plan, render, stale,
                                   student_copy)
from dlokit.material.diff import compare, find_solution
from dlokit.material.markers import Block, MarkerError, has_markers, parse_blocks, solution_version, student_version

__all__ = ["Block", "BuildError", "MarkerError", "build", "compare", "default_pairs", "find_solution",
           "has_markers", "has_solution", "parse_blocks", "plan", "render", "solution_version", "stale",
           "student_copy", "student_version"]
