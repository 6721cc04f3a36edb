"""Day 4: every parallelism of train_llm.py reproduces the single-process run (gloo, CPU).

Compared per step, for 4 AdamW steps: the loss and the global gradient norm (which sums every
parameter's gradient once, wherever its shards live). Few launches: torchrun start-up is ~3 s.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tp_scripts" / "llm" / "train_llm.py"
STEPS = 4
COMMON = ["--config", "tiny", "--steps", str(STEPS), "--batch-size", "8", "--seq-len", "64", "--grad-norm"]


def launch(tmp_path, run_id, args, nproc=1, check=True):
    env = {**os.environ, "DLOKIT_RUN_ID": run_id, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_ID"):
        env.pop(key, None)
    if nproc == 1:
        command = [sys.executable, str(SCRIPT)]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(SCRIPT)]
    result = subprocess.run(command + args + ["--runs-dir", str(tmp_path / "runs")], env=env, capture_output=True,
                            text=True, timeout=240)
    if check and result.returncode != 0:
        raise AssertionError(f"{run_id} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


def steps(tmp_path, run_id, rank=0):
    lines = (tmp_path / "runs" / run_id / f"rank{rank}" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "step"]


def summary(tmp_path, run_id, rank=0):
    return json.loads((tmp_path / "runs" / run_id / f"rank{rank}" / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("day4")
    launch(tmp, "single", COMMON)
    return tmp, steps(tmp, "single")


def assert_same_run(expected, got, rel=2e-4):
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for e, g in zip(expected, got):
        assert g["loss"] == pytest.approx(e["loss"], rel=rel), (e["step"], e["loss"], g["loss"])
        assert g["grad_norm"] == pytest.approx(e["grad_norm"], rel=rel), (e["step"], e["grad_norm"], g["grad_norm"])


@pytest.mark.parametrize("name, args, nproc", [
    ("ddp", ["--mode", "ddp"], 2),
    ("fsdp", ["--mode", "fsdp"], 2),
    ("tp-scratch", ["--mode", "tp-scratch"], 2),
    ("tp-dtensor", ["--mode", "tp"], 2),
    ("tp-sequence-parallel", ["--mode", "tp", "--sequence-parallel"], 2),
    ("pp-naive", ["--mode", "pp", "--pp-schedule", "naive"], 2),
    ("pp-gpipe", ["--mode", "pp", "--pp-schedule", "gpipe", "--microbatches", "4"], 2),
    ("pp-1f1b", ["--mode", "pp", "--pp-schedule", "1f1b", "--microbatches", "4"], 2),
    ("pp-interleaved", ["--mode", "pp", "--pp-schedule", "interleaved", "--microbatches", "4"], 2),
    ("fsdp-tp-2x2", ["--mode", "fsdp-tp", "--tp", "2"], 4),
])
def test_parallel_run_matches_single_process(reference, name, args, nproc):
    tmp, expected = reference
    launch(tmp, name, COMMON + args, nproc=nproc)
    for rank in range(nproc):
        assert_same_run(expected, steps(tmp, name, rank))
    if name == "fsdp":  # really sharded: each rank holds about half of the parameter bytes
        held = [summary(tmp, name, r)["params_bytes_this_rank"] for r in range(2)]
        full = summary(tmp, "single")["params_bytes_this_rank"]
        assert all(abs(h / full - 0.5) < 0.02 for h in held), (held, full)
    if name.startswith("pp-"):
        s = summary(tmp, name)
        p, m, v = 2, s["pp_microbatches"], s["pp_virtual_stages"]
        assert s["pp_bubble_theory"] == pytest.approx((p - 1) / (v * m))
        assert s["pp_bubble_measured"] is not None and s["pp_bubble_measured"] > -0.5


def test_fsdp_sharded_checkpoint_resumes_exactly(reference, tmp_path):
    tmp, expected = reference
    checkpoint = tmp_path / "checkpoint"
    launch(tmp, "ckpt-first-half", COMMON + ["--mode", "fsdp", "--steps", "2", "--checkpoint-dir", str(checkpoint)], nproc=2)
    assert (checkpoint / ".metadata").exists() and len(list(checkpoint.glob("*.distcp"))) == 2
    launch(tmp, "ckpt-resumed", COMMON + ["--mode", "fsdp", "--checkpoint-dir", str(checkpoint), "--resume"], nproc=2)
    assert_same_run(expected[2:], steps(tmp, "ckpt-resumed"))


def test_fsdp_bf16_with_checkpointing_and_offload_runs(reference):
    tmp, expected = reference
    launch(tmp, "fsdp-bf16", COMMON + ["--mode", "fsdp", "--dtype", "bf16", "--activation-checkpointing",
                                       "--no-reshard-after-forward", "--cpu-offload"], nproc=2)
    got = steps(tmp, "fsdp-bf16")
    # bf16 compute: close to, not equal to, the fp32 run
    assert got[-1]["loss"] == pytest.approx(expected[-1]["loss"], rel=2e-2)


def test_context_parallel_runs_or_skips_cleanly(reference):
    tmp, expected = reference
    result = launch(tmp, "cp", COMMON + ["--mode", "cp"], nproc=2)
    s = summary(tmp, "cp")
    if s["status"] == "skipped":
        assert "SKIPPED context parallelism" in result.stdout and s["reason"]
    else:
        assert_same_run(expected, steps(tmp, "cp"))


def test_text_corpus_loss_falls(tmp_path):
    launch(tmp_path, "text", ["--config", "tiny", "--data", "text", "--steps", "40", "--lr", "3e-3",
                              "--batch-size", "16", "--seq-len", "64"])
    s = summary(tmp_path, "text")
    assert s["status"] == "completed"
    assert s["last_loss"] < s["first_loss"] - 1.5, (s["first_loss"], s["last_loss"])


def test_bad_inputs_fail_before_starting(tmp_path):
    bad = launch(tmp_path, "bad-config", ["--config", "nope"], check=False)
    assert bad.returncode == 2 and "unknown model config 'nope'" in bad.stderr
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0"}
    result = subprocess.run([sys.executable, str(SCRIPT), "--mode", "tp", "--runs-dir", str(tmp_path)],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "n_heads = 4 is not divisible by the tensor-parallel degree 3" in result.stderr
