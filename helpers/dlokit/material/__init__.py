"""Student and solution material from one source: marked blocks in solution files.

    python -m dlokit.material build     # tp_scripts/solutions -> tp_scripts, notebooks/solutions -> notebooks
    python -m dlokit.material check     # exit 1 and list student files a build would change
    compare("tp_scripts/dlojz1_2.py")   # diff against tp_scripts/solutions/dlojz1_2.py
"""
from dlokit.material.build import BuildError, build, default_pairs, plan, render, stale
from dlokit.material.compare import compare, find_solution
from dlokit.material.markers import Block, MarkerError, has_markers, parse_blocks, solution_version, student_version

__all__ = ["Block", "BuildError", "MarkerError", "build", "compare", "default_pairs", "find_solution",
           "has_markers", "parse_blocks", "plan", "render", "solution_version", "stale", "student_version"]
