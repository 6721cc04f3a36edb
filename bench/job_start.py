"""What one job's Python start costs: a fresh interpreter against a process forked from a warm one.

    python bench/job_start.py              # 6 of each, alternated: fresh, warm, fresh, warm ...
    python bench/job_start.py --repeats 10

Every row is the same tiny 1-rank run of the real training script (4 `--test` steps of mobilenet_v3_small on
32 px images, no DataLoader workers), the size of the course's and the tests' jobs:
- fresh: `python train_classifier.py ...`, what every job does now (the local backend, srun);
- warm: the same script run by runpy in a child forked from this process, which imported torch, torchvision and
  torch._dynamo once before (a zygote, as tests/preloaded.py starts the tests' own launches).
Wall time and CPU time (user + system of the child and everything it started, from getrusage) per run, with the
median and a 95 % bootstrap interval of the median, and the ratio warm / fresh with its interval
(dlokit.analysis.stats). The difference is what a warm start would save per job process; the suite starts some 400
such processes, the course about 100.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tp_scripts" / "solutions" / "train_classifier.py"
GENERATOR = REPO / "data" / "make_synthetic_imagenet.py"
PRELOAD = ("torch", "torchvision", "torch._dynamo")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_fresh(argv: list[str], env: dict, log: Path) -> int:
    with open(log, "w") as out:
        return subprocess.run([sys.executable, *argv], env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def run_warm(argv: list[str], env: dict, log: Path) -> int:
    pid = os.fork()
    if pid == 0:  # the child: the script as `python script args` would run it, its output in `log`
        try:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).parent)
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:
            sys.excepthook(*sys.exc_info())  # the traceback, into the log
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def timed(run, argv, env) -> tuple[float, float]:
    log = Path(env["DLOKIT_RUNS_DIR"]).parent / "job.log"
    wall, cpu = time.perf_counter(), children_cpu()
    code = run(argv, env, log)
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"{run.__name__}: the script exited with {code}: {' '.join(argv)}\n{tail}")
    return time.perf_counter() - wall, children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=6, help="runs of each start, alternated (default: 6)")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error("--repeats must be at least 2 (an interval needs two runs)")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, str(GENERATOR), "--out", str(data), "--classes", "10", "--train-per-class",
                        "8", "--val-per-class", "2", "--size", "40", "--quiet"], check=True)
        argv = [str(SCRIPT), "--data", str(data), "--model", "mobilenet_v3_small", "--image-size", "32",
                "--batch-size", "8", "--test", "--test-nsteps", "4", "--num-workers", "0"]
        env = {**os.environ, "DLOKIT_RUNS_DIR": str(Path(tmp) / "runs"), "OMP_NUM_THREADS": "1"}
        started = time.perf_counter()
        for module in PRELOAD:  # this process becomes the warm one: what the children inherit
            __import__(module)
        print(f"imports of {', '.join(PRELOAD)} in this process: {time.perf_counter() - started:.2f} s")
        rows = {"fresh": [], "warm": []}
        for _ in range(args.repeats):
            rows["fresh"].append(timed(run_fresh, argv, env))
            rows["warm"].append(timed(run_warm, argv, env))
    # imported only now: the warm children inherit torch, torchvision and torch._dynamo, not pandas or scipy
    sys.path.insert(0, str(REPO / "helpers"))
    from dlokit.analysis.stats import estimate_of_samples, ratio_of_samples

    print(f"{platform.node()} | {os.cpu_count()} cores | Python {platform.python_version()} | "
          f"{args.repeats} runs of each, alternated")
    values = {(name, column): [run[column] for run in runs] for name, runs in rows.items() for column in (0, 1)}
    print(f"{'start':6} {'wall s, median [95 % interval]':>32} {'CPU s, median [95 % interval]':>32}")
    for name in rows:
        cells = [estimate_of_samples([values[name, column]]) for column in (0, 1)]
        print(f"{name:6} " + " ".join(f"{c.value:>13.2f} [{c.low:.2f}–{c.high:.2f}]".rjust(32) for c in cells))
    for column, what in ((0, "wall"), (1, "CPU")):
        ratio = ratio_of_samples([values["fresh", column]], [values["warm", column]])
        saved = estimate_of_samples([values["fresh", column]]).value - estimate_of_samples([values["warm", column]]).value
        print(f"warm / fresh, {what}: ×{ratio.value:.2f} [{ratio.low:.2f}–{ratio.high:.2f}] "
              f"({saved:.2f} s less per job process)")


if __name__ == "__main__":
    main()
