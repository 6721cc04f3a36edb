"""Day 4's cells one hop: the command lists its cells used to build with lambdas (the batch scan and its levers, the
pipeline's schedules, DeepSpeed's stages) come from the day, the same command lines as before, in the same order."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

import dlokit
from dlokit import layout_planner
from dlokit.analysis import layout_scan

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def day(workspace):
    return dlokit.setup_llm_day("ann", "local", str(REPO / "tp_scripts" / "solutions"), config="tiny", seq_len=32,
                                batch_size=4, steps=3, verbose=False, ranks=2)


def test_the_batch_scan_runs_ddp_then_fsdp2_at_each_batch_and_a_lever_at_each_batch_fsdp2_does_not_fit(day):
    scan = day.memory_scan([32, 64], seq_len=16, limit_mb=300, config="scan-demo")
    assert [shlex.split(c)[1:4] for c in scan] == [["--mode", "ddp", "--config"], ["--mode", "ddp", "--config"],
                                                   ["--mode", "fsdp", "--config"], ["--mode", "fsdp", "--config"]]
    assert shlex.split(scan[2]) == [str(day.script), "--mode", "fsdp", "--config", "scan-demo", "--steps", "2",
                                    "--meta-init", "--batch-size", "32", "--seq-len", "16", "--memory-limit", "300"]
    plan = {"fits": {"ddp": [32], "fsdp": [32, 64]}}
    assert layout_scan.lever_batches([32, 64, 128, 256], plan) == [128, 256]
    assert layout_scan.lever_batches([32, 64], plan) == [64]  # FSDP2 fits them all: the largest
    levers = day.memory_scan([128, 256], seq_len=16, limit_mb=300, config="scan-demo",
                             levers=[["--activation-checkpointing"], ["--grad-accum", "4"]])
    argvs = [shlex.split(c) for c in levers]
    assert [(a[a.index("--meta-init") + 1:a.index("--batch-size")], a[a.index("--batch-size") + 1]) for a in argvs] == [
        (["--activation-checkpointing"], "128"), (["--activation-checkpointing"], "256"),
        (["--grad-accum", "4"], "128"), (["--grad-accum", "4"], "256")]
    assert {a[a.index("--mode") + 1] for a in argvs} == {"fsdp"} and {a[a.index("--memory-limit") + 1] for a in argvs} == {"300"}


def test_the_pipeline_runs_gpipe_at_each_count_then_1f1b_at_the_most(day):
    runs = [shlex.split(c) for c in day.pipeline_runs([1, 2, 4], seq_len=128, steps=10)]
    assert [(a[a.index("--pp-schedule") + 1], a[a.index("--microbatches") + 1]) for a in runs] == [
        ("gpipe", "1"), ("gpipe", "2"), ("gpipe", "4"), ("1f1b", "4")]
    assert {a[a.index("--batch-size") + 1] for a in runs} == {"8"}  # two sequences per micro-batch at least
    assert {a[a.index("--steps") + 1] for a in runs} == {"10"} and {a[a.index("--seq-len") + 1] for a in runs} == {"128"}


def test_deepspeed_runs_each_stage_at_the_days_sizes_then_the_offloaded_one(day):
    runs = [shlex.split(c) for c in day.deepspeed_runs([1, 2, 3], offload_stage=2)]
    script = str(REPO / "tp_scripts" / "llm" / "solutions" / "train_deepspeed.py")
    sizes = ["--data", "text", "--config", "tiny", "--seq-len", "32", "--batch-size", "4", "--steps", "3"]
    assert runs == [[script, "--zero-stage", "1", *sizes], [script, "--zero-stage", "2", *sizes],
                    [script, "--zero-stage", "3", *sizes], [script, "--zero-stage", "2", "--offload-optimizer", *sizes]]


def test_the_day_holds_its_ranks_and_its_model_configurations(day, capsys):
    from dlokit.analysis.llm_memory import model_config

    assert day.ranks == 2 and day.model_config("scan-demo") == model_config(day.script.parent, "scan-demo")
    assert day.model_config("tiny") != day.model_config("scan-demo")
    dlokit.setup_llm_day("ann", "local", str(REPO / "tp_scripts" / "solutions"), ranks=2)
    assert "2 ranks per parallel job" in capsys.readouterr().out
    with pytest.raises(ValueError, match="RANKS"):
        dlokit.setup_llm_day("ann", "local", str(REPO / "tp_scripts" / "solutions"), ranks=0, verbose=False)


def test_plans_on_paper_at_each_gpu_count_shown_under_one_index(day):
    plans = layout_planner.paper_plans(day.model_config("1b"), "H100-80GB", [8, 16], batch_size=64, seq_len=2048)
    assert list(plans) == [8, 16] and plans[16].attrs["gpus"] == 16
    shown = layout_planner.shown_by_gpus(plans, top=3)
    assert shown.index.names == ["GPUs", "row"] and sorted(set(shown.index.get_level_values(0))) == [8, 16]
    assert len(shown.loc[8]) == 3


def test_each_mode_and_each_planned_layout_at_the_days_sizes(day):
    runs = [shlex.split(c) for c in day.mode_runs(["ddp", "fsdp-keep"], "--data", "text", "--grad-norm")]
    assert runs == [shlex.split(day.command("ddp", "--data", "text", "--grad-norm")),
                    shlex.split(day.command("fsdp-keep", "--data", "text", "--grad-norm"))]
    assert runs[1][1:4] == ["--mode", "fsdp", "--no-reshard-after-forward"]
    planned = day.layout_runs([["--mode", "tp"], ["--mode", "pp", "--microbatches", "2"]], steps=8)
    assert [shlex.split(c)[1:] for c in planned] == [
        ["--config", "tiny", "--seq-len", "32", "--batch-size", "4", "--steps", "8", "--mode", "tp"],
        ["--config", "tiny", "--seq-len", "32", "--batch-size", "4", "--steps", "8", "--mode", "pp", "--microbatches", "2"]]
    assert day.layout_runs([["--mode", "tp"], ["--mode", "pp"]], steps=8, repeats=2)[2:] == planned[:1] + [
        day.command(None, "--mode", "pp", steps=8)]  # rounds, alternated: job i runs layout i % 2


def test_rounds_go_on_while_the_comparison_does_not_decide_and_stop_at_the_cap(day, capsys):
    """day.submit_until_decided (TP2.2's weak scaling): a round more while `decided` says no, never past max_rounds."""
    asked = []

    def decided_at_three(ids):
        asked.append(len(ids))
        return len(ids) >= 3

    command = day.command("single", steps=1)
    ids = day.submit_until_decided([command], decided_at_three, rounds=2, max_rounds=4)
    assert len(ids) == 3 and asked == [2, 3] and "round 3 of at most 4" in capsys.readouterr().out
    assert [dlokit.job_outcome(i).state for i in ids] == ["COMPLETED"] * 3
    never = day.submit_until_decided([command], lambda ids: False, rounds=1, max_rounds=2)
    assert len(never) == 2  # the cap: one round more, then the comparison is shown as it stands
