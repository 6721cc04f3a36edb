"""What one job's Python start costs: cold (a fresh interpreter) against warm (forked from the kit's warm-start
server, dlokit.in_job.warm_start, as every local task's script now is).

    python bench/job_start.py              # 6 of each, alternated: cold, warm, cold, warm ...
    python bench/job_start.py --repeats 10

Every row is the same tiny 1-rank run of the real training script (4 `--test` steps of mobilenet_v3_small on
32 px images, no DataLoader workers), the size of the course's and the tests' jobs, started by the command a local
task runs (`warm_start.command`): cold with DLOKIT_WARM_START=0, warm once the server is up (a first warm run
starts it and is not counted). Wall time of the whole command, and CPU time (user + system) of the script and
everything it started: getrusage of the command when cold, the server's wait4 of the script when warm (the client
writes it to --usage). Medians with a 95 % bootstrap interval, and the ratio warm / cold with its interval
(dlokit.analysis.stats).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tp_scripts" / "solutions" / "train_classifier.py"
GENERATOR = REPO / "data" / "make_synthetic_imagenet.py"
sys.path.insert(0, str(REPO / "helpers"))

from dlokit.analysis.stats import estimate_of_samples, ratio_of_samples  # noqa: E402
from dlokit.in_job import warm_start  # noqa: E402


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict, folder: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one start of the script through a local task's command."""
    usage = folder / "usage.json"
    usage.unlink(missing_ok=True)
    log = folder / "job.log"
    wall, cpu = time.perf_counter(), children_cpu()
    with open(log, "w") as out:
        code = subprocess.run(warm_start.command(sys.executable, argv, usage=str(usage)), env=env, stdout=out,
                              stderr=subprocess.STDOUT).returncode
    wall, cpu = time.perf_counter() - wall, children_cpu() - cpu
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"the script exited with {code}: {' '.join(argv)}\n{tail}")
    if usage.exists():  # warm: the script was the server's child
        cpu += json.loads(usage.read_text())["cpu_s"]
    return wall, cpu


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
        env = {**os.environ, "DLOKIT_RUNS_DIR": str(Path(tmp) / "runs"), "OMP_NUM_THREADS": "1",
               "XDG_RUNTIME_DIR": tmp,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "helpers"), os.environ.get("PYTHONPATH")]))}
        cold, warm = {**env, warm_start.SWITCH: "0"}, {**env, warm_start.SWITCH: "1"}
        started = time.perf_counter()
        timed(argv, warm, Path(tmp))  # starts this bench's own server
        print(f"the first warm run, which started the server: {time.perf_counter() - started:.2f} s")
        rows = {"cold": [], "warm": []}
        for _ in range(args.repeats):
            rows["cold"].append(timed(argv, cold, Path(tmp)))
            rows["warm"].append(timed(argv, warm, Path(tmp)))
        for facts in (Path(tmp) / "dlokit-warm").glob("*.json"):
            os.kill(json.loads(facts.read_text())["pid"], 15)
    print(f"{platform.node()} | {os.cpu_count()} cores | Python {platform.python_version()} | "
          f"{args.repeats} runs of each, alternated")
    values = {(name, column): [run[column] for run in runs] for name, runs in rows.items() for column in (0, 1)}
    print(f"{'start':6} {'wall s, median [95 % interval]':>32} {'CPU s, median [95 % interval]':>32}")
    for name in rows:
        cells = [estimate_of_samples([values[name, column]]) for column in (0, 1)]
        print(f"{name:6} " + " ".join(f"{c.value:>13.2f} [{c.low:.2f}–{c.high:.2f}]".rjust(32) for c in cells))
    for column, what in ((0, "wall"), (1, "CPU")):
        ratio = ratio_of_samples([values["cold", column]], [values["warm", column]])
        saved = estimate_of_samples([values["cold", column]]).value - estimate_of_samples([values["warm", column]]).value
        print(f"warm / cold, {what}: ×{ratio.value:.2f} [{ratio.low:.2f}–{ratio.high:.2f}] "
              f"({saved:.2f} s less per job process)")


if __name__ == "__main__":
    main()
