"""Run the course notebooks headless (papermill) and keep the executed notebooks and their plots.

    python -m dlokit.course --out output                       # every day, then the race, on the reference solutions
    python -m dlokit.course --out output --student             # on the student scripts (TODOs undone)
    python -m dlokit.course --out output notebooks/day1_single_gpu.ipynb -p PROFILE local-slurm

Executed notebooks go to <out>/, every PNG they display to <out>/plots/<notebook>_<n>.png.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dlokit import yardstick

REPO = Path(__file__).resolve().parents[2]
DEFAULT_NOTEBOOKS = sorted((REPO / "notebooks").glob("day*.ipynb")) + [REPO / "notebooks" / "race.ipynb"]  # the race last
SOLUTION_SCRIPTS = "../tp_scripts/solutions"  # the notebooks' SCRIPTS parameter, relative to notebooks/


def ipc_kernel_manager():
    """Kernels talk to the runner over Unix sockets (IPC), not TCP: no "running over TCP without
    encryption" warning, and no port race ("Address already in use") between kernels started together."""
    from jupyter_client.manager import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        # Each kernel's sockets in a folder of their own: jupyter_client's default "kernel-ipc-<n>" files
        # sit in the working directory, where two kernels started together picked the same ones
        # ("Invalid Signature" on every message, then "Kernel didn't respond").
        def __init__(self, **kwargs):
            self._socket_dir = tempfile.mkdtemp(prefix="dlokit-kernel-")
            super().__init__(transport="ipc", ip=os.path.join(self._socket_dir, "kernel"), **kwargs)

        def cleanup_ipc_files(self) -> None:
            super().cleanup_ipc_files()
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    return IPCKernelManager


def execute(notebook: Path, executed: Path, parameters: dict, cwd: Path, kernel: str = "python3") -> None:
    """papermill with the kit's kernel settings (also used by the notebook tests)."""
    import papermill

    # the kernel inherits this: with a plain Agg backend figures would be saved as "<Figure ...>" text
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    papermill.execute_notebook(str(notebook), str(executed), parameters=parameters, kernel_name=kernel,
                               language="python", cwd=str(cwd), progress_bar=sys.stderr.isatty(), log_output=False,
                               kernel_manager_class=ipc_kernel_manager())


def extract_plots(executed: Path, plots_dir: Path) -> list[Path]:
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = []
    notebook = json.loads(executed.read_text())
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png:
                path = plots_dir / f"{executed.stem}_{len(written) + 1:02d}.png"
                path.write_bytes(base64.b64decode(png))
                written.append(path)
    return written


def run_notebook(notebook: Path, out_dir: Path, parameters: dict, kernel: str = "python3") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / notebook.name
    execute(notebook, executed, parameters, notebook.parent, kernel)
    return executed


def _parse_parameters(pairs: list[list[str]]) -> dict:
    parameters = {}
    for key, value in pairs:
        try:
            parameters[key] = json.loads(value)
        except json.JSONDecodeError:
            parameters[key] = value
    return parameters


def _known(parameters: dict, notebook: Path) -> dict:
    """The course-wide SCRIPTS default only goes to notebooks that have such a parameter."""
    cells = json.loads(notebook.read_text()).get("cells", [])
    source = "".join("".join(c.get("source", "")) for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    return {k: v for k, v in parameters.items() if k != "SCRIPTS" or "SCRIPTS" in source}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlokit.course", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/day*.ipynb, then race.ipynb")
    parser.add_argument("--out", type=Path, default=REPO / "output")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="notebook parameter (JSON value or string), e.g. -p PROFILE local-slurm")
    parser.add_argument("--student", action="store_true",
                        help="run the student scripts (tp_scripts/, TODOs as the student left them) instead of the "
                             "reference solutions")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or DEFAULT_NOTEBOOKS
    parameters = {} if args.student else {"SCRIPTS": SOLUTION_SCRIPTS}
    parameters.update(_parse_parameters(args.parameter))
    print(f"running the notebooks on {'the student scripts' if 'SCRIPTS' not in parameters else parameters['SCRIPTS']}"
          f" (profile {parameters.get('PROFILE', 'from each notebook')})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    yardsticks = [yardstick.measure()]  # this machine's speed, before and after: course times compare through it
    print(yardstick.line(yardsticks[0]), flush=True)
    course_start = time.time()
    failed = []
    for index, notebook in enumerate(notebooks, 1):
        start = time.time()
        print(f"[{index}/{len(notebooks)}] running {notebook.name} ...", flush=True)
        try:
            executed = run_notebook(notebook.resolve(), args.out.resolve(), _known(parameters, notebook))
        except Exception as err:  # papermill saves the partly executed notebook; report and go on
            print(f"    FAILED after {time.time() - start:.0f} s: {str(err).strip().splitlines()[-1]}", flush=True)
            print(f"    see {args.out / notebook.name}", flush=True)
            failed.append(notebook.name)
            continue
        plots = extract_plots(executed, args.out / "plots")
        print(f"    done in {time.time() - start:.0f} s -> {executed} ({len(plots)} plots)", flush=True)
    took = time.time() - course_start
    yardsticks.append(yardstick.measure())
    print(f"the notebooks took {took // 60:.0f} min {took % 60:.0f} s; after them, the {yardstick.line(yardsticks[1])}",
          flush=True)
    (args.out / "yardstick.json").write_text(json.dumps({"notebooks_s": round(took, 1), "before": yardsticks[0],
                                                         "after": yardsticks[1]}, indent=1))
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"executed notebooks in {args.out}, plots in {args.out / 'plots'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
