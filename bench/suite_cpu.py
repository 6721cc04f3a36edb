"""Where the CPU of a whole command (the test suite, the course) goes, by kind of process.

The suite's length on CI's two cores is its CPU work (the cores are busy ~90 % of it), and pytest's --durations
only says which tests were long, not what burned the CPU inside them. The kernel's process accounting (BSD acct,
Debian's `acct` package) records every process that ends: its name, CPU time and parent, servers and Slurm
jobs included. As root:

    apt-get install -y acct
    touch /tmp/suite.pacct && accton /tmp/suite.pacct
    bash scripts/test.sh                     # or bash scripts/course.sh
    accton off && python bench/suite_cpu.py /tmp/suite.pacct

Kinds: a script forked warm shows its own name (warm_start sets it); a process named python that used 3 CPU-s or
more imported torch afresh (a cold start: about 5 CPU-s here); each is told apart by its launcher (a Slurm step,
torchrun, a pytest worker or notebook kernel, setup's bytecode compilation).
"""
from __future__ import annotations

import argparse
import collections
import subprocess

COLD_CPU_S = 3.0  # a fresh interpreter that imported torch and torchvision: ~5 CPU-s on this machine
BUILD = {"cc1plus", "as", "ld", "collect2", "g++", "c++", "x86_64-linux-gnu-g++-12", "lto-wrapper"}
DAEMONS = {"mariadbd", "slurmctld", "slurmd", "slurmdbd", "munged", "slurmstepd"}


def processes(pacct: str) -> dict[int, dict]:
    """pid -> {comm, cpu_s, ppid}, from dump-acct's table (utime and stime in 1/100 s)."""
    table = subprocess.run(["dump-acct", pacct], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in table.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) >= 11:
            found[int(fields[9])] = {"comm": fields[0], "ppid": int(fields[10]),
                                     "cpu_s": (float(fields[2]) + float(fields[3])) / 100}
    return found


def kind(pid: int, procs: dict[int, dict]) -> str:
    comm = procs[pid]["comm"]
    parents, up = [], procs[pid]["ppid"]
    while up in procs and len(parents) < 30:
        parents.append(procs[up]["comm"])
        up = procs[up]["ppid"]
    if comm in BUILD:
        return "C++ builds (torch.compile's kernels)"
    if comm in DAEMONS:
        return "Slurm, MariaDB, munge"
    if comm.startswith("chrom"):
        return "Chromium"
    if not comm.startswith("python"):
        return f"in a Slurm job: {comm}" if "slurmstepd" in parents else comm
    cold = procs[pid]["cpu_s"] >= COLD_CPU_S
    if "slurmstepd" in parents:
        return "Slurm job scripts (cold)" if cold else "Slurm job machinery (submitit)"
    if parents[:1] == ["pt_elastic"]:
        return "torchrun ranks (cold)"
    if parents[:1] == ["uv"]:
        return "setup: bytecode compilation"
    if not cold:
        return "short Python processes (job launchers, warm clients, tools)"
    if not parents:  # its parent left before it (a daemon): the warm-start servers
        return "warm-start servers (their own imports)"
    if parents[:2] == ["bash", "bash"] or parents[:2] == ["python", "bash"]:
        return "pytest and its workers"
    return "notebook kernels, scripts the tests start cold"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pacct", help="the accounting file accton wrote")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    procs = processes(args.pacct)
    cpu, count = collections.Counter(), collections.Counter()
    for pid, proc in procs.items():
        k = kind(pid, procs)
        cpu[k] += proc["cpu_s"]
        count[k] += 1
    total = sum(cpu.values())
    print(f"{total:,.0f} CPU-s in {len(procs):,} processes")
    print(f"{'CPU-s':>8} {'share':>6} {'processes':>9}  kind")
    for k, seconds in cpu.most_common(args.top):
        print(f"{seconds:8.0f} {seconds / total:6.1%} {count[k]:9d}  {k}")


if __name__ == "__main__":
    main()
