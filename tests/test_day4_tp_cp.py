"""Day 4, tensor and context parallelism on 2 gloo ranks: the solutions reproduce the single-process layer
(outputs and gradients) with the expected collectives, the untouched student copies (TP4.4, TP4.5) do
not. (`train_llm.py --mode cp` training with the ring attention against one process: test_day4_parallel.py.)
"""
import json
import os
import sys
from pathlib import Path

import preloaded
import pytest

from dlokit.material.build import student_copy
from ranks import run_ranks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tp_scripts" / "llm"


def clean_env(run_id, **extra):
    env = {**os.environ, "DLOKIT_RUN_ID": run_id, "OMP_NUM_THREADS": "1", **extra}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_ID"):
        env.pop(key, None)
    env.update(extra)
    return env


def ranks(script, run_id, runs_dir, *options, nproc=2):
    command = [sys.executable, str(script), *options, "--runs-dir", str(runs_dir)]
    result = run_ranks(command, nproc, clean_env(run_id), timeout=300)
    assert result.returncode == 0, f"{run_id} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


def summary(runs_dir, run_id, rank=0):
    return json.loads((runs_dir / run_id / f"rank{rank}" / "summary.json").read_text())


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The student's folder as handed out: generated from the solutions, TODOs untouched."""
    folder = tmp_path_factory.mktemp("student_llm")
    student_copy(LLM, folder, LLM / "solutions")
    return folder


# ---- tensor parallel (TP4.4) ----

def test_tp_from_scratch_matches_the_single_layer_with_one_all_reduce_each_way(tmp_path):
    ranks(LLM / "check_tp.py", "tp-solution", tmp_path, "--solution")
    for rank in (0, 1):
        s = summary(tmp_path, "tp-solution", rank)
        assert s["all_ok"] is True and s["module_file"] == "solutions/parallel_tp_scratch.py"
        checks = s["tp_checks"]
        for version in ("scratch", "dtensor"):
            assert checks[version]["forward_collectives"] == {"allreduce": 1}
            assert checks[version]["backward_collectives"] == {"allreduce": 1}
        assert checks["sequence_parallel"]["forward_collectives"] == {"allgather": 1, "reduce_scatter": 1}
        assert checks["sequence_parallel"]["backward_collectives"] == {"allgather": 1, "reduce_scatter": 1}
        assert max(checks["scratch"][key] for key in
                   ("max_abs_diff_output", "max_abs_diff_input_grad", "max_abs_diff_weight_grad")) < 1e-5


def test_untouched_student_tp_copy_misses_the_all_reduces(student, tmp_path):
    ranks(student / "check_tp.py", "tp-student", tmp_path)
    s = summary(tmp_path, "tp-student")
    assert s["module_file"] == "parallel_tp_scratch.py" and s["all_ok"] is False
    scratch = s["tp_checks"]["scratch"]
    assert scratch["matches"] is False and scratch["max_abs_diff_output"] > 1e-2
    assert scratch["forward_collectives"] == {} and scratch["backward_collectives"] == {}
    assert s["tp_checks"]["dtensor"]["ok"] is True  # PyTorch's version needs no TODO


# ---- context parallel (TP4.5) ----

def test_ring_attention_matches_full_causal_attention(tmp_path):
    ranks(LLM / "check_cp.py", "cp-solution", tmp_path, "--solution")
    for rank in (0, 1):
        s = summary(tmp_path, "cp-solution", rank)
        assert s["all_ok"] is True and s["module_file"] == "solutions/parallel_cp.py"
        ring = s["cp_checks"]["ring"]
        assert ring["max_abs_diff_output"] < 1e-5 and ring["max_abs_diff_grads"] < 1e-4
        assert ring["forward_collectives"] == {"send": 1, "recv": 1} == ring["backward_collectives"]


def test_untouched_student_ring_attention_does_not_match(student, tmp_path):
    ranks(student / "check_cp.py", "cp-student", tmp_path)
    s = summary(tmp_path, "cp-student")
    assert s["module_file"] == "parallel_cp.py"
    assert s["cp_checks"]["ring"]["matches"] is False and s["cp_checks"]["ring"]["max_abs_diff_output"] > 1e-2
    assert s["cp_checks"]["allgather"]["ok"] is True


# ---- bad input ----

@pytest.mark.parametrize("script, options, env, message", [
    ("check_tp.py", [], {}, "run it on several processes"),
    ("check_cp.py", ["--seq-len", "30"], {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, "--seq-len must divide"),
    ("check_tp.py", ["--ffn-dim", "175"], {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, "not divisible"),
])
def test_bad_options_are_refused_before_starting(tmp_path, script, options, env, message):
    result = preloaded.run([sys.executable, str(LLM / script), *options, "--runs-dir", str(tmp_path)],
                           env=clean_env("bad", **env), timeout=120)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("script", ["check_tp.py", "check_cp.py"])
def test_solution_flag_needs_a_solutions_folder(student, tmp_path, script):
    """A student folder has no solutions/: --solution must say so, not check the student's copy instead."""
    result = preloaded.run([sys.executable, str(student / script), "--solution", "--runs-dir", str(tmp_path)],
                           env=clean_env("bad", WORLD_SIZE="2", RANK="0", LOCAL_RANK="0"), timeout=120)
    assert result.returncode == 2 and "no solutions folder" in result.stderr, result.stderr[-2000:]
