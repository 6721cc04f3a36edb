"""Real single-node Slurm cluster from scripts/local_slurm (start.sh / stop.sh); TIMEOUT through
the kit is in test_submission.py.

Needs root (start.sh installs the Debian packages when missing). Each cluster lives in a tmp
STATE_DIR with free, non-default ports, so it cannot clash with a developer's own cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_ports

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts" / "local_slurm"
HOG = REPO / "tests" / "job_scripts" / "hog.py"
FINAL_STATES = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL")
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                       reason="the local Slurm cluster runs as root (SlurmUser=root)"),
    pytest.mark.skipif(bool(os.environ.get("DLOKIT_SKIP_SLURM")), reason="DLOKIT_SKIP_SLURM is set"),
]


class Cluster:
    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        ctld, slurmd, dbd, db = free_ports(4)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
        self.env.update(
            DLOKIT_SLURMCTLD_PORT=str(ctld),
            DLOKIT_SLURMD_PORT=str(slurmd),
            DLOKIT_SLURMDBD_PORT=str(dbd),
            DLOKIT_MARIADB_PORT=str(db),
            SLURM_CONF=str(state_dir / "etc" / "slurm.conf"),
        )
        self.jobs_dir = state_dir / "jobs"

    def script(self, name: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(SCRIPTS / name), str(self.state_dir)],
            env=self.env, capture_output=True, text=True, timeout=timeout,
        )

    def run(self, *cmd: str) -> str:
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{cmd}: {out.stderr}"
        return out.stdout

    def pids(self) -> dict[str, int]:
        run = self.state_dir / "run"
        return {d: int((run / f"{d}.pid").read_text()) for d in DAEMONS if (run / f"{d}.pid").exists()}

    def sbatch(self, *args: str, wrap: str) -> str:
        self.jobs_dir.mkdir(exist_ok=True)
        out = self.run("sbatch", "--parsable", f"--chdir={self.jobs_dir}", "--output=%j.out",
                       *args, "--wrap", wrap)
        return out.strip().split(";")[0]

    def output(self, job: str) -> str:
        return (self.jobs_dir / f"{job}.out").read_text()

    def sacct(self, job: str) -> tuple[str, str]:
        """(State, ExitCode) of the job allocation, '' while accounting has no record."""
        out = self.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode").strip()
        if not out:
            return "", ""
        state, code = out.splitlines()[0].split("|")
        return state.split()[0], code  # "CANCELLED by 0" -> "CANCELLED"

    def wait(self, job: str, timeout: float = 60, states=FINAL_STATES) -> tuple[str, str]:
        end = time.monotonic() + timeout
        while True:
            state, code = self.sacct(job)
            if state in states or time.monotonic() > end:
                return state, code
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        t0 = time.monotonic()
        res = c.script("start.sh")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "ready" in res.stdout
        print(f"local Slurm cold start: {time.monotonic() - t0:.1f}s")
        yield c
    finally:
        c.script("stop.sh", timeout=120)


def test_env_sh_and_node(cluster):
    env_sh = cluster.state_dir / "env.sh"
    out = subprocess.run(["bash", "-c", 'source "$1" && echo "$SLURM_CONF"', "_", str(env_sh)],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == cluster.env["SLURM_CONF"]
    node = cluster.run("sinfo", "-h", "-o", "%P %T %c %G").split()
    # the machine's real cores, the ones the local backend uses too (start.sh: nproc)
    assert node[0] == "gpu*" and node[2] == str(len(os.sched_getaffinity(0)))
    assert node[1] in ("idle", "mixed")
    assert "gpu:4" in node[3]


def test_job_completed(cluster):
    job = cluster.sbatch(wrap="echo hello-dlokit")
    assert cluster.wait(job) == ("COMPLETED", "0:0")
    assert "hello-dlokit" in cluster.output(job)


def test_job_failed(cluster):
    job = cluster.sbatch(wrap="exit 3")
    assert cluster.wait(job) == ("FAILED", "3:0")


def test_job_two_fake_gpus(cluster):
    job = cluster.sbatch("--gres=gpu:2", wrap='echo "CVD=$CUDA_VISIBLE_DEVICES"')
    assert cluster.wait(job)[0] == "COMPLETED"
    line = next(x for x in cluster.output(job).splitlines() if x.startswith("CVD="))
    assert len(line.removeprefix("CVD=").split(",")) == 2, line


def test_srun_two_tasks(cluster):
    job = cluster.sbatch("--ntasks=2", wrap='srun bash -c "echo task=\\$SLURM_PROCID"')
    assert cluster.wait(job)[0] == "COMPLETED"
    tasks = sorted(x for x in cluster.output(job).splitlines() if x.startswith("task="))
    assert tasks == ["task=0", "task=1"]


def test_job_cancelled(cluster):
    job = cluster.sbatch(wrap="sleep 300")
    assert cluster.wait(job, states=("RUNNING",))[0] == "RUNNING"
    cluster.run("scancel", job)
    assert cluster.wait(job)[0] == "CANCELLED"


def test_start_twice_is_noop(cluster):
    before = cluster.pids()
    res = cluster.script("start.sh")
    assert res.returncode == 0, res.stderr
    assert "already running" in res.stderr
    assert cluster.pids() == before


def test_more_tasks_than_cores_with_overcommit(cluster):
    """4 fake GPUs on a node with fewer real cores: --overcommit lets a 4-task job start (tasks share cores)."""
    job = cluster.sbatch("--exclusive", "--overcommit", "--ntasks=4", "--gres=gpu:4",
                         wrap='srun bash -c "echo task=\\$SLURM_PROCID"')
    assert cluster.wait(job)[0] == "COMPLETED"
    assert sorted(x for x in cluster.output(job).splitlines() if x.startswith("task=")) == [
        f"task={k}" for k in range(4)]


def test_a_step_over_its_memory_is_killed_and_its_peak_recorded(cluster):
    job = cluster.sbatch("--mem=200M", wrap=f"srun {sys.executable} {HOG} 1000 5")
    state, code = cluster.wait(job)
    for _ in range(20):  # under load slurmdbd once had the FAILED state before the exit code (0:0): a moment later
        if code != "0:0":
            break
        time.sleep(0.5)
        state, code = cluster.sacct(job)
    assert state in ("OUT_OF_MEMORY", "FAILED") and code != "0:0", (state, code)
    assert "exceeded memory limit" in cluster.output(job)
    steps = cluster.run("sacct", "-n", "-P", "-j", job, "-o", "JobID,MaxRSS").split()
    peak_kb = max(int(rss[:-1]) for _, rss in (s.split("|") for s in steps) if rss.endswith("K"))
    assert peak_kb > 200 * 1024, steps


def test_restart_keeps_running_jobs(cluster):
    jobs = [cluster.sbatch(wrap="sleep 6; echo done") for _ in range(2)]
    for job in jobs:
        assert cluster.wait(job, states=("RUNNING",))[0] == "RUNNING"
    before = cluster.pids()
    res = cluster.script("restart.sh")
    assert res.returncode == 0, res.stdout + res.stderr
    assert cluster.pids()["slurmctld"] != before["slurmctld"]
    assert [cluster.wait(job)[0] for job in jobs] == ["COMPLETED", "COMPLETED"]
    assert all("done" in cluster.output(job) for job in jobs)


def _processes_of(state_dir: Path, pids) -> list[str]:
    """Live (non-zombie) processes that are one of pids or mention state_dir."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if p.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            text = p.joinpath("cmdline").read_bytes() + p.joinpath("environ").read_bytes()
        except OSError:
            continue
        if int(p.name) in pids or str(state_dir).encode() in text:
            found.append(f"{p.name} {p.joinpath('comm').read_text().strip()}")
    return found


def test_second_cluster_start_stop(cluster, tmp_path):
    """A second cluster coexists with the first; stop.sh ends all its daemons and jobs."""
    other = Cluster(tmp_path / "other")
    try:
        assert other.script("start.sh").returncode == 0
        pids = set(other.pids().values())
        assert len(pids) == len(DAEMONS)
        # each its own ClusterName: the kit keeps their jobs apart by it (they number them alike)
        names = {re.search(r"(?m)^ClusterName\s*=\s*(\S+)", c.run("scontrol", "show", "config")).group(1)
                 for c in (cluster, other)}
        assert len(names) == 2, names
        other.sbatch(wrap="sleep 300")  # a running job must not survive stop.sh
        t0 = time.monotonic()
        res = other.script("stop.sh")
        print(f"local Slurm stop: {time.monotonic() - t0:.1f}s")
        assert res.returncode == 0, res.stderr
        assert _processes_of(other.state_dir, pids) == []
        assert (other.state_dir / "log" / "slurmctld.log").exists()
        assert other.script("stop.sh").returncode == 0  # idempotent
    finally:
        other.script("stop.sh")
    # The first cluster is unaffected.
    assert cluster.wait(cluster.sbatch(wrap="true"))[0] == "COMPLETED"
