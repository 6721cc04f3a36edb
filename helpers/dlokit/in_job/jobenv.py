"""The environment contract between the kit's submitter, the training scripts and the analysis.

Every `DLOKIT_*` variable is named here and nowhere else in the package. The submitter writes them
into each task's environment (`task_environment`); scripts and the run recorder read them through
the functions below, so a script run by hand (no kit) still gets sensible defaults.
"""
from __future__ import annotations

import getpass
import os
import re
import tempfile
from pathlib import Path

# chosen in the notebook (or the shell) before submitting
PROFILE = "DLOKIT_PROFILE"          # profile name used when none is given
PROFILES = "DLOKIT_PROFILES"        # an extra profiles.toml
LOG_DIR = "DLOKIT_LOG_DIR"          # where job logs and job cards go
LOCK_DIR = "DLOKIT_LOCK_DIR"        # where the local backend's device locks live

# written by the submitter into every task
RUNS_DIR = "DLOKIT_RUNS_DIR"        # where run records go
RUN_ID = "DLOKIT_RUN_ID"            # the job id: every rank writes <runs dir>/<run id>/rank<k>/
JOB_NAME = "DLOKIT_JOB_NAME"        # the job name given in the cell (the student's nickname)
TAG = "DLOKIT_TAG"                  # what the job is for, e.g. "TP1.2" or "race" (the class report groups by it)
CPUS_PER_TASK = "DLOKIT_CPUS_PER_TASK"  # cores this task may use (its device's share)

# written by the task wrapper (in_job.task): the task's place on its node, which LOCAL_RANK / LOCAL_WORLD_SIZE no
# longer say once the task sees only its own GPU (they then count the GPUs it sees: 0 of 1)
TASK_ON_NODE = "DLOKIT_TASK_ON_NODE"    # this task's index among its node's tasks
TASKS_ON_NODE = "DLOKIT_TASKS_ON_NODE"  # how many tasks its node runs

# written by the local backend's device launcher (dlokit.submission.devices)
DEVICES = "DLOKIT_DEVICES"          # the devices this job holds: "cpu0,cpu1" (cores) or "gpu0,gpu1"
SHARED = "DLOKIT_SHARED"            # "1": the job measures accuracy, not speed, and shares the machine (alone=False)
LOCK_WAITED_S = "DLOKIT_LOCK_WAITED_S"  # how long the job waited for them

# read by scripts as a default for --data
DATA = "DLOKIT_DATA"

# The exit codes of every script the kit runs, one meaning each; the local launcher, the job outcome
# (dlokit.submission.jobs.card_outcome) and the race's requeue read them.
EXIT_FAILED = 1           # an error: its traceback in the log, its cause in the record
EXIT_BAD_OPTIONS = 2      # an option, or a combination of options, that cannot run (argparse's own code)
EXIT_OUT_OF_MEMORY = 3    # this rank ran out of memory (GPU, or the host under the job's memory limit)
EXIT_PEER_FAILED = 4      # this rank stopped because another one failed: its record names that rank and why
EXIT_REFUSED = 5          # an input another user wrote was refused, never loaded (a checkpoint holding more than weights)
EXIT_REQUEUE = 75         # checkpointed on a signal: run me again with --resume (EX_TEMPFAIL, "try again later")
EXIT_CODES = {EXIT_FAILED: "failed", EXIT_BAD_OPTIONS: "bad options", EXIT_OUT_OF_MEMORY: "out of memory",
              EXIT_PEER_FAILED: "stopped: another rank failed", EXIT_REFUSED: "refused its input",
              EXIT_REQUEUE: "checkpointed, to requeue"}

# torch.compile's on-disk caches (compiled kernels), one per user: the default /tmp/torchinductor_<user> is
# one folder for everyone who runs as the same user on a node, and /tmp is wiped between jobs on many clusters
INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE = "TRITON_CACHE_DIR"


def slurm_run_id(env) -> str:
    """A Slurm job's run id: its job id (an array's `<job>_<task>`) and, where the job says it, its cluster's name
    (`3@clusterA`), since two clusters number their jobs alike and would write into one folder."""
    job = (f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
           if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID") else env["SLURM_JOB_ID"])
    return f"{job}@{env['SLURM_CLUSTER_NAME'].lower()}" if env.get("SLURM_CLUSTER_NAME") else job  # as the card


def task_environment(*, runs_dir: Path, job_name: str, cpus_per_task: int, run_id: str | None = None) -> dict:
    """What the submitter exports to every task of a job."""
    env = {RUNS_DIR: str(runs_dir), JOB_NAME: job_name, CPUS_PER_TASK: str(cpus_per_task), "PYTHONUNBUFFERED": "1",
           **compile_caches()}
    if run_id:
        env[RUN_ID] = run_id
    return env


def compile_caches(environ=None) -> dict:
    """The compiler cache folders of this user's jobs: those already chosen in the environment, else
    ~/.cache/dlokit/inductor and ~/.cache/dlokit/triton (a profile's `env` may point them elsewhere).

    Importing torch._inductor writes torch's shared default (/tmp/torchinductor_<user>) into the
    environment of the process: that value does not count as a choice."""
    environ = os.environ if environ is None else environ
    root = Path.home() / ".cache" / "dlokit"
    inductor = environ.get(INDUCTOR_CACHE)
    if not inductor or os.path.abspath(inductor) == _torch_default_inductor_cache():
        inductor = str(root / "inductor")
    return {INDUCTOR_CACHE: inductor, TRITON_CACHE: environ.get(TRITON_CACHE) or str(root / "triton")}


def _torch_default_inductor_cache() -> str:
    """torch._inductor's default cache folder: <tmp>/torchinductor_<user> (cache_dir_utils.default_cache_dir)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def runs_dir(default: str = "runs") -> Path:
    return Path(os.environ.get(RUNS_DIR, default)).expanduser()


def run_id() -> str | None:
    return os.environ.get(RUN_ID) or None


def job_name() -> str | None:
    return os.environ.get(JOB_NAME) or None


def tag() -> str | None:
    return os.environ.get(TAG) or None


def cpus_per_task(env=None) -> int | None:
    value = (os.environ if env is None else env).get(CPUS_PER_TASK, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def shares_machine(env=None) -> bool:
    return (os.environ if env is None else env).get(SHARED) == "1"


def devices_held() -> list[str]:
    return [d for d in os.environ.get(DEVICES, "").split(",") if d]


def lock_waited_s() -> float | None:
    try:
        return float(os.environ[LOCK_WAITED_S])
    except (KeyError, ValueError):
        return None


def data_default() -> str | None:
    return os.environ.get(DATA) or None
