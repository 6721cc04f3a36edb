"""Day 4, TP4.8: DeepSpeed's ZeRO on the Day 4 model (tp_scripts/llm/solutions/train_deepspeed.py), 2 gloo ranks on
the CPU, against train_llm.py's single process: the same loss step by step, and each rank holding what its stage
shards, measured from its tensors; optimizer offload runs; the check passes the solution and fails the untouched
student file; without a C++ compiler (DeepSpeed compiles its CPU communication op) the run says why it skipped.

Each launch starts its ranks as srun does (tests/ranks.py), without the deepspeed launcher. Measured 2026-11-28:
every stage's loss equal to the single process's to 1e-6 over 4 steps (once DeepSpeed's default clipping at 1.0 is
turned off); per rank, ZeRO-1 0.50 of one process's optimizer states (AdamW's m and v with DeepSpeed's fp32 master
copy), ZeRO-2 0.61 of its gradients at their peak, ZeRO-3 0.50 of its weights.
"""
import json
import os
import sys
from pathlib import Path

import pytest

import preloaded
from ranks import run_ranks  # noqa: E402

pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tp_scripts" / "llm"
SINGLE = LLM / "solutions" / "train_llm.py"
SOLUTION = LLM / "solutions" / "train_deepspeed.py"
STUDENT = LLM / "train_deepspeed.py"
COMMON = ["--config", "tiny", "--data", "text", "--lr", "3e-3", "--steps", "4", "--batch-size", "8", "--seq-len", "64"]
RUNS = {  # name -> (script, options); all on 2 ranks but the single process
    "single": (SINGLE, []),
    "zero1": (SOLUTION, ["--zero-stage", "1"]),
    "zero2": (SOLUTION, ["--zero-stage", "2"]),
    "zero3": (SOLUTION, ["--zero-stage", "3"]),
    "zero2-offload": (SOLUTION, ["--zero-stage", "2", "--offload-optimizer"]),
    "student-zero2": (STUDENT, ["--zero-stage", "2"]),
}
STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}


def launch(runs_dir, run_id, name=None, env=None):
    script, options = RUNS[name or run_id]
    environment = {**os.environ, "DLOKIT_RUN_ID": run_id, "OMP_NUM_THREADS": "1", **(env or {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        environment.pop(key, None)
    command = [sys.executable, str(script), *COMMON, *options, "--runs-dir", str(runs_dir)]
    result = (preloaded.run(command, env=environment, timeout=240) if run_id == "single" else
              run_ranks(command, 2, environment, timeout=240))
    assert result.returncode == 0, f"{run_id} failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepspeed")
    for name in RUNS:
        launch(folder, name)
    return folder


def summary(runs_dir, run_id, rank=0):
    return json.loads((Path(runs_dir) / run_id / f"rank{rank}" / "summary.json").read_text())


def losses(runs_dir, run_id):
    lines = (Path(runs_dir) / run_id / "rank0" / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "step"]


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3", "zero2-offload"])
def test_each_stage_follows_the_single_process_step_by_step(runs_dir, name):
    """Same seed, batch and text: ZeRO changes where the states live, not the maths (fp32: 1e-6 apart)."""
    expected, got = losses(runs_dir, "single"), losses(runs_dir, name)
    assert len(got) == len(expected) == 4
    assert got == pytest.approx(expected, abs=1e-5), (expected, got)
    assert got[-1] < got[0] - 0.3  # it trained


def test_each_stage_shards_what_it_says_on_every_rank(runs_dir):
    """Measured from each rank's tensors against the single process's: from stage 1 the optimizer states (m and v,
    and DeepSpeed's fp32 master copy of the weights: 12 bytes a weight, 4 more than one process's AdamW keeps) are
    halved on 2 ranks; from stage 2 the gradients' peak in backward is this rank's half plus a reduce bucket and the
    gradients on their way into it (ZeRO-1 holds them all, then reduces); at stage 3 the weights are halved."""
    whole = summary(runs_dir, "single")["memory_bytes"]
    for name, stage in STAGES.items():
        held = [summary(runs_dir, name, rank)["memory_bytes"] for rank in (0, 1)]
        for mine in held:
            assert mine["optimizer"] == pytest.approx(1.5 * whole["optimizer"] / 2, rel=0.01), (name, mine)
            if stage >= 2:
                assert 0.5 * whole["grads"] < mine["grads"] < 0.7 * whole["grads"], (name, mine)
            else:
                assert mine["grads"] >= whole["grads"], (name, mine)
            expected_params = whole["params"] / 2 if stage == 3 else whole["params"]
            assert mine["params"] == pytest.approx(expected_params, rel=0.01), (name, mine)
        assert held[0] == held[1]  # the tiny model's partitions split evenly


def test_the_memory_model_predicts_each_stage(runs_dir):
    from dlokit.analysis.llm_memory import memory_comparison

    table = memory_comparison(list(STAGES), runs_dir)
    measured = table[table["source"] == "measured"].set_index("run_id")
    assert measured["states_ratio"].between(0.98, 1.08).all(), measured
    assert list(measured["mode"]) == ["DeepSpeed ZeRO-1 ×2", "DeepSpeed ZeRO-2 ×2", "DeepSpeed ZeRO-3 ×2"]


def test_optimizer_offload_runs_on_the_cpu_and_moves_nothing_there(runs_dir):
    """`offload_optimizer: cpu` with torch's AdamW (DeepSpeedCPUAdam is a compiled op): on a CPU-only machine the
    states are on the host already; the run records none of them apart from the device, and holds what ZeRO-2 holds."""
    config = json.loads((Path(runs_dir) / "zero2-offload" / "rank0" / "run.json").read_text())["config"]
    assert config["ds_config"]["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    offloaded, plain = (summary(runs_dir, name)["memory_bytes"] for name in ("zero2-offload", "zero2"))
    assert offloaded["optimizer_offloaded"] == 0 and offloaded["optimizer"] == plain["optimizer"]


def test_the_check_passes_the_solution_and_fails_the_untouched_student(runs_dir, monkeypatch):
    """The generated train_deepspeed.py gives DeepSpeed stage 0 and never calls the engine's backward and step: no
    rank holds an optimizer state, the loss does not follow the single process's; the check names the TODO."""
    import dlokit
    from dlokit import checks

    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(runs_dir))
    dlokit.use_profile("local")
    result = checks.deepspeed_zero({1: "zero1", 2: "zero2", 3: "zero3"}, "single")
    assert result.status == "passed", result
    student = checks.deepspeed_zero(["student-zero2"], "single")
    assert student.status == "failed" and "TODO TP4.8" in student.message, student
    assert summary(runs_dir, "student-zero2")["memory_bytes"]["optimizer"] == 0
    assert "TODO TP4.8" in STUDENT.read_text() and "engine.step()" not in STUDENT.read_text()


def test_tf32_is_applied_and_recorded_as_train_llm_applies_it(tmp_path):
    """--tf32 (kept from Day 1, a GPU-only choice) reaches DeepSpeed's ranks: their fp32 matmuls may use TF32 before
    the model is built, as in train_llm.py's reference run. The run skips before DeepSpeed starts (no compiler)."""
    env = {**os.environ, "DLOKIT_RUN_ID": "tf32", "OMP_NUM_THREADS": "1", "CXX": "/no/such/c++"}
    command = [sys.executable, str(SOLUTION), *COMMON, "--zero-stage", "2", "--tf32", "--runs-dir", str(tmp_path)]
    done = run_ranks(command, 2, env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        config = json.loads((tmp_path / "tf32" / f"rank{rank}" / "run.json").read_text())["config"]
        assert config["tf32"] is True and config["tf32_applied"] is True, config


def test_without_a_compiler_the_run_says_why_it_skipped(runs_dir, monkeypatch):
    """On a CPU DeepSpeed compiles its shared-memory all-reduce when it starts: without a C++ compiler the run is
    recorded as skipped, with the reason, and the check is not applicable (not failed)."""
    import dlokit
    from dlokit import checks

    launch(runs_dir, "zero2-no-compiler", "zero2", env={"CXX": "/no/such/c++"})
    recorded = summary(runs_dir, "zero2-no-compiler")
    assert recorded["status"] == "skipped" and "/no/such/c++" in recorded["reason"], recorded
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(runs_dir))
    dlokit.use_profile("local")
    result = checks.deepspeed_zero(["zero2-no-compiler"], "single")
    assert result.status == "not applicable" and "C++ compiler" in result.message, result
