"""`dlokit doctor` against the project's real local Slurm: every non-CUDA check passes on a sound profile, each
CUDA check says "not checked: no GPU on this node", and each deliberately broken profile gets its ❌ with the fix.

The doctor runs as an instructor runs it: `python -m dlokit doctor --profile NAME` in a shell (with the real
environment modules initialised, as on a cluster's login node), its profiles in a file named by DLOKIT_PROFILES.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dlokit.doctor.report import CHECKS, GPU_PATHS

MODULES_INIT = Path("/usr/share/modules/init/bash")  # Debian's environment-modules (scripts/setup.sh --with-slurm)


def doctor(tmp_path, profile, profiles_toml="", *options):
    (tmp_path / "profiles.toml").write_text(profiles_toml)
    env = {**os.environ, "DLOKIT_PROFILES": str(tmp_path / "profiles.toml"), "DLOKIT_LOG_DIR": str(tmp_path / "jobs"),
           "DLOKIT_RUNS_DIR": str(tmp_path / "runs")}
    command = shlex.join([sys.executable, "-m", "dlokit", "doctor", "--profile", profile, *options])
    done = subprocess.run(["bash", "-c", f"source {MODULES_INIT} && {command}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
    print(done.stdout, done.stderr)
    return done.returncode, done.stdout


def line_of(output: str, check: str) -> str:
    found = [line for line in output.splitlines() if line[2:].startswith(f"{check}:")]
    assert len(found) == 1, (check, output)
    return found[0]


@pytest.mark.slurm
def test_doctor_passes_every_path_but_cuda_on_the_local_slurm(tmp_path, slurm_cluster_2n):
    """On the two-node cluster, so that the 2-node job runs too (on the one-node cluster it is "not checked: the
    partition has 1 node"; `dlokit doctor --profile local-slurm` took 61 s there, this one 79 s)."""
    code, output = doctor(tmp_path, "local-slurm-2n")
    assert code == 0, output
    for check in CHECKS:
        line = line_of(output, check)
        if check in GPU_PATHS:
            assert line == f"➖ {check}: not checked: no GPU on this node"
        else:
            assert line.startswith(f"✅ {check}: "), line
    assert "gloo" in line_of(output, "2 tasks") and "TIMEOUT" in line_of(output, "time limit")
    assert "node1, node2" in line_of(output, "2 nodes")
    summary = output.split("\n\n")[-1]
    assert "✅ Day 3 TP3.3 (compilation): will work" in summary
    assert "on CPU processes: no GPU checked" in summary and "❌" not in summary and "➖" not in summary


BROKEN = {  # name -> (profile settings, the check that fails, words of its message, words of its fix)
    "wrong account": ('account = "nosuch"', "accounts", "'nosuch' is not one of yours", "set account"),
    "missing module": ('setup = ["module load no-such-module"]', "setup lines",
                       "Unable to locate a modulefile for 'no-such-module'", "`module avail`"),
    "python without torch": ('python = "/usr/bin/python3"', "python on the nodes",
                             "/usr/bin/python3 cannot import submitit", "set python in the profile"),
}


@pytest.mark.slurm
@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_profile_gets_its_cause_and_fix(tmp_path, slurm_cluster, case):
    settings, check, message, fix = BROKEN[case]
    code, output = doctor(tmp_path, "broken", f'[broken]\nextends = "local-slurm"\n{settings}\n')
    assert code == 1
    line = output.split(f"❌ {check}: ")[1].split("\n     fix: ")
    assert message in line[0] and fix in line[1].splitlines()[0], output
    assert "after the ❌ above: fix it first" in line_of(output, "2 tasks")  # it stops there: the rest would fail alike


@pytest.mark.slurm
def test_a_log_folder_the_nodes_cannot_write_is_named(tmp_path, slurm_cluster_2n):
    """On the two-node cluster each node has its own mount namespace: a read-only filesystem mounted on the log
    folder in the nodes only stands for a folder the login node writes and the nodes cannot (a node-local path)."""
    folder = tmp_path / "logs"
    folder.mkdir()
    pids = [(slurm_cluster_2n / "run" / f"slurmd-node{n}.pid").read_text().strip() for n in (1, 2)]
    for pid in pids:
        subprocess.run(["nsenter", "--target", pid, "--mount", "--", "mount", "-t", "tmpfs", "-o", "ro,size=1m",
                        "tmpfs", str(folder)], check=True)
    try:
        code, output = doctor(tmp_path, "broken", f'[broken]\nextends = "local-slurm-2n"\nlog_dir = "{folder}"\n')
    finally:
        for pid in pids:
            subprocess.run(["nsenter", "--target", pid, "--mount", "--", "umount", str(folder)], check=True)
    assert code == 1
    assert "without writing its log in" in line_of(output, "log folder") and "set log_dir" in output


def test_the_multi_task_check_needs_two_tasks(tmp_path):
    code, output = doctor(tmp_path, "local", "", "--gpus", "1")
    assert code == 2


def test_a_machine_with_one_device_is_told_what_it_cannot_check(tmp_path):
    """A laptop with one GPU (here: a local profile of one device): no 2-task job is asked for, so no false ❌."""
    code, output = doctor(tmp_path, "one", '[one]\nextends = "local"\ngpus_per_node = 1\n')
    assert code == 0, output
    assert line_of(output, "2 tasks") == ("➖ 2 tasks: not checked: this machine offers 1 device(s) (GPUs, or CPU "
                                          "processes without one), the check 2: the multi-rank TPs need a second one")
    assert line_of(output, "time limit").startswith("✅")
