"""python -m dlokit.material {build,check,compare} — see dlokit.material."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dlokit.material import edit_links
from dlokit.material.build import BuildError, build, default_pairs, stale
from dlokit.material.diff import compare
from dlokit.material.markers import MarkerError


def _pairs(args) -> list[tuple[Path, Path]]:
    if bool(args.solutions) != bool(args.out):
        sys.exit("give both --solutions and --out, or neither")
    pairs = [(Path(args.solutions), Path(args.out))] if args.solutions else default_pairs(args.root)
    if not pairs:
        sys.exit(f"no solutions folder found under {args.root} (looked for tp_scripts/solutions)")
    return pairs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlokit.material", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("build", "write student files from the solutions"),
                       ("check", "exit 1 if a build would change anything")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--solutions", help="solutions folder (default: tp_scripts/solutions)")
        sub.add_argument("--out", help="student folder")
        sub.add_argument("--root", default=".", help="repository root for the default folders")
    sub = commands.add_parser("compare", help="diff a student file against its solution")
    sub.add_argument("student")
    sub.add_argument("solution", nargs="?")
    sub.add_argument("--tp", help="only the blocks of this TP (e.g. TP1.3)")
    args = parser.parse_args(argv)
    try:
        if args.command == "compare":
            print(compare(args.student, args.solution, html=False, tp=args.tp))
            return 0
        if args.command == "build":
            for solutions, out in _pairs(args):
                changed = build(solutions, out)
                print(f"{solutions} -> {out}: {len(changed)} file(s) written or removed")
                for path in changed:
                    print(f"  {path}")
            for notebook in edit_links.refresh(Path(args.root)):
                print(f"{notebook}: its edit links' line numbers updated")
            return 0
        problems = [p for solutions, out in _pairs(args) for p in stale(solutions, out)]
        problems += edit_links.stale_links(Path(args.root))
        for problem in problems:
            print(problem)
        if problems:
            print(f"{len(problems)} student file(s) out of date: run `python -m dlokit.material build`")
        return 1 if problems else 0
    except (MarkerError, BuildError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
