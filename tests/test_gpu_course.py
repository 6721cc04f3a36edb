"""bench/gpu_course.sh, the script for a lent GPU machine, proved on a CPU: its dry mode plans every command it would
submit (0 findings), its Day 4 driver (bench/gpu_day4.py) runs end to end here at the tiny sizes, and each path it
leaves to two GPUs names a test that exists."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("gpu_day4", REPO / "bench" / "gpu_day4.py")
gpu_day4 = sys.modules["gpu_day4"] = importlib.util.module_from_spec(SPEC)  # a dataclass looks its module up
SPEC.loader.exec_module(gpu_day4)

ONE_GPU = ["single", "single, compiled", "single, activation checkpointing", "single, fp32 with TF32",
           "DeepSpeed ZeRO-1", "DeepSpeed ZeRO-2", "DeepSpeed ZeRO-3", "DeepSpeed ZeRO-2, optimizer offloaded",
           "matmul peak (the planner's calibration)", "single under a --memory-limit it exceeds"]


@pytest.mark.parametrize("card_gib", ["141", "40"])
def test_the_dry_mode_plans_every_command_with_no_finding(card_gib):
    done = subprocess.run(["bash", "bench/gpu_course.sh", "--dry", card_gib], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "0 finding(s)" and re.search(r"Day 1 at its own parameters .*: \d+ jobs, 0 finding", done.stdout)
    for label in ONE_GPU:
        assert any(f"  ok  {label}  <- " in line for line in lines), (label, done.stdout)


def test_the_plan_refuses_deepspeed_on_one_process_as_the_script_does():
    """The dry mode passed ZeRO on one rank, and the script refused it at its start (2026-12-03, the driver's first run
    on a CPU): the plan applies the script's rule, and --one-process lifts both."""
    from dlokit import gpu_plan

    command = f"{gpu_plan.LLM / 'train_deepspeed.py'} --zero-stage 2 --config tiny --batch-size 8"
    refused = gpu_plan.check(gpu_plan.Job("TP4.8", command, 1), 80)
    assert refused["finding"].startswith("refused: ZeRO shards over several processes"), refused
    assert gpu_plan.check(gpu_plan.Job("TP4.8", command + " --one-process", 1), 80)["finding"] is None
    assert gpu_plan.check(gpu_plan.Job("TP4.8", command, 2), 80)["finding"] is None


def test_each_path_left_to_two_gpus_names_a_test_that_exists():
    for path, proof in gpu_day4.NEEDS_TWO:
        file, _, name = proof.split(" ")[0].partition("::")
        assert (REPO / file).is_file(), (path, proof)
        assert not name or f"def {name}(" in (REPO / file).read_text(), (path, proof)


@pytest.mark.slow
def test_the_day4_driver_runs_every_one_gpu_path_here(tmp_path):
    """At the tiny sizes on this CPU: every job ends as meant (the limited one out of memory), ZeRO 1-3 on one process
    follow the single process's losses."""
    env = {**os.environ, "DLOKIT_PROFILE": "local", "DLOKIT_LOG_DIR": str(tmp_path / "jobs"),
           "DLOKIT_RUNS_DIR": str(tmp_path / "runs"), "DLOKIT_LOCK_DIR": str(tmp_path / "locks")}
    done = subprocess.run([sys.executable, "bench/gpu_day4.py", "--config", "tiny", "--seq-len", "64", "--batch", "8",
                           "--steps", "6", "--compile-steps", "6", "--dtype", "fp32"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-3000:]
    for label in ONE_GPU:
        assert re.search(rf"^✅ {re.escape(label)}: (COMPLETED|OUT_OF_MEMORY) ", out, re.M), (label, out[-4000:])
    assert len(re.findall(r"^✅ loss match against the single process", out, re.M)) == 4
    assert "❌" not in out and len(re.findall(r"^➖ ", out, re.M)) == len(gpu_day4.NEEDS_TWO)
