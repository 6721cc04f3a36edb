"""Does the course give the same conclusions every time? Run it N times on the reference solutions and tabulate,
per TP, the verdict of each run.

    python bench/course_repeatability.py --runs 3 --out /tmp/repeat       # about 10 minutes a run on 2 cores
    python bench/course_repeatability.py --runs 3 notebooks/day4_large_models.ipynb     # one day only
    python bench/course_repeatability.py --runs 3 --reuse CLONE/output CLONE/notebooks/runs   # course.sh's as run 1

Each run is `python -m dlokit.course` (every day, then the race) with its own run records and job logs, as a
fresh clone would have. Read back from the executed notebooks: every check's status (and its judged parts), every
lesson verdict (dlokit.lessons: agrees / contradicts / within noise / not applicable), the ❌ shown, and the jobs
that failed or timed out (the check "the day's jobs"); from the course notes, what each day chose for the next (the
batch, the precision, the layout, the loader, the optimiser). The table goes to stdout and to <out>/repeatability.md;
the script exits 1 when a verdict differs between runs, a ❌ was shown, or a job failed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECK_MIME = "application/vnd.dlokit.check+json"
VERDICT_MIME = "application/vnd.dlokit.verdict+json"


def run_course(out: Path, notebooks: list[str]) -> float:
    """One course run into `out` (executed notebooks, runs, logs); returns its wall time in seconds."""
    env = {**os.environ, "DLOKIT_RUNS_DIR": str(out / "runs"), "DLOKIT_LOG_DIR": str(out / "jobs")}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "dlokit.course", "--out", str(out / "notebooks"), *notebooks], env=env, check=False,
                   stdout=open(out / "course.log", "w"), stderr=subprocess.STDOUT)
    return time.monotonic() - started


def conclusions(notebook: Path) -> dict[str, str]:
    """{key: verdict} for every check and lesson verdict an executed notebook shows, in order."""
    found, seen = {}, Counter()
    day = notebook.stem
    for cell in json.loads(notebook.read_text()).get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if CHECK_MIME in data:
                result = data[CHECK_MIME] if isinstance(data[CHECK_MIME], dict) else json.loads(data[CHECK_MIME])
                parts = ", ".join(f"{p['name']} {p['status']}" for p in result["parts"] if p["status"] != "passed")
                found[f"{day} | check: {result['check']}"] = result["status"] + (f" ({parts})" if parts else "")
            if VERDICT_MIME in data:
                verdict = data[VERDICT_MIME] if isinstance(data[VERDICT_MIME], dict) else json.loads(data[VERDICT_MIME])
                seen[verdict["effect"]] += 1
                key = f"{day} | lesson: {verdict['effect']}" + (f" #{seen[verdict['effect']]}"
                                                                 if seen[verdict["effect"]] > 1 else "")
                found[key] = verdict["outcome"]
    return found


def choices(runs_dir: Path) -> dict[str, str]:
    """{key: value} for what each day chose and saved for the next (dlokit.submission.week: the batch, the
    precision, the layout, the loader, the optimiser): a choice that moves with the noise changes every later day."""
    from dlokit.submission.week import CHOICES

    found = {}
    for path in sorted(runs_dir.glob("course-notes-*.json")):
        notes = json.loads(path.read_text())
        for choice in CHOICES:
            if choice.key in notes:
                value = notes[choice.key]
                found[f"week | choice: {choice.key}"] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return found


def crosses(notebook: Path) -> int:
    """❌ shown in the notebook's outputs (its markdown explains the marks too; the class report's legend too)."""
    from dlokit.classroom import LEGEND

    cells = json.loads(notebook.read_text()).get("cells", [])
    return sum(json.dumps(output, ensure_ascii=False).replace(LEGEND, "").count("❌")
               for cell in cells for output in cell.get("outputs", []))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dlokit-repeatability"))
    parser.add_argument("--reuse", nargs=2, action="append", default=[], metavar=("NOTEBOOKS", "RUNS"),
                        help="a course already run (e.g. by scripts/course.sh on a fresh clone: CLONE/output and "
                             "CLONE/notebooks/runs), counted as one of the runs")
    parser.add_argument("notebooks", nargs="*", help="default: the whole course (e.g. notebooks/day4_large_models.ipynb)")
    args = parser.parse_args(argv)
    table: dict[str, list[str]] = defaultdict(lambda: [""] * args.runs)
    walls, marks = [], []
    for k in range(args.runs):
        if k < len(args.reuse):
            executed, runs = (Path(p) for p in args.reuse[k])
            walls.append(float("nan"))
        else:
            out = args.out / f"run{k + 1}"
            out.mkdir(parents=True, exist_ok=True)
            walls.append(run_course(out, args.notebooks))
            executed, runs = out / "notebooks", out / "runs"
        notebooks = sorted(executed.glob("*.ipynb"))
        marks.append(sum(crosses(nb) for nb in notebooks))
        for notebook in notebooks:
            for key, verdict in conclusions(notebook).items():
                table[key][k] = verdict
        for key, value in choices(runs).items():
            table[key][k] = value
        print(f"run {k + 1}: {walls[-1]:.0f} s{' (reused)' if k < len(args.reuse) else ''}, {len(table)} conclusions "
              f"so far, ❌ shown: {marks[-1]}", flush=True)
    differing = [key for key, values in table.items() if len(set(values)) > 1]
    lines = [f"{args.runs} runs of `python -m dlokit.course` on the solutions; wall time per run: "
             + ", ".join(f"{w:.0f} s" for w in walls) + f"; ❌ shown per run: {marks}", "",
             "| notebook \\| conclusion | " + " | ".join(f"run {k + 1}" for k in range(args.runs)) + " | same |",
             "|---|" + "---|" * (args.runs + 1)]
    for key, values in table.items():
        lines.append(f"| {key} | " + " | ".join(values) + f" | {'yes' if len(set(values)) == 1 else 'NO'} |")
    lines += ["", f"{len(table) - len(differing)} of {len(table)} conclusions the same in every run"
              + (f"; differing: {', '.join(differing)}" if differing else "")]
    report = "\n".join(lines)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "repeatability.md").write_text(report + "\n")
    failed_jobs = [key for key, values in table.items() if "the day's jobs" in key and set(values) != {"passed"}]
    return 1 if differing or any(marks) or failed_jobs else 0


if __name__ == "__main__":
    sys.exit(main())
