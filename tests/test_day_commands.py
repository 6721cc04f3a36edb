"""The command lines a day's cells submit: one hop from a notebook cell to a script of tp_scripts."""
import shlex
from pathlib import Path

import dlokit

REPO = Path(__file__).resolve().parents[1]


def test_day4_commands_name_the_script_its_sizes_and_the_mode(workspace):
    day = dlokit.setup_llm_day("ann", "local", str(REPO / "tp_scripts" / "solutions"), config="tiny", seq_len=32,
                               batch_size=4, steps=3, verbose=False)
    assert day.script == REPO / "tp_scripts" / "llm" / "solutions" / "train_llm.py"
    argv = shlex.split(day.command("fsdp-keep", "--grad-norm", steps=1))
    assert argv == [str(day.script), "--mode", "fsdp", "--no-reshard-after-forward", "--config", "tiny",
                    "--seq-len", "32", "--batch-size", "4", "--steps", "1", "--grad-norm"]
    # a TP's own sizes replace the day's, once each on the line
    argv = shlex.split(day.command("ddp", "--batch-size", 64, "--seq-len", 16, config="scan-demo", steps=2))
    assert argv == [str(day.script), "--mode", "ddp", "--config", "scan-demo", "--steps", "2", "--batch-size", "64",
                    "--seq-len", "16"]
    checker = shlex.split(day.command(None, script="check_tp.py"))  # beside the student's copies, asked for the reference
    assert checker == [str(REPO / "tp_scripts" / "llm" / "check_tp.py"), "--solution"]
    student = dlokit.setup_llm_day("ann", "local", str(REPO / "tp_scripts"), verbose=False)
    assert student.script == REPO / "tp_scripts" / "llm" / "train_llm.py"
    assert shlex.split(student.command(None, script="check_cp.py")) == [str(REPO / "tp_scripts" / "llm" / "check_cp.py")]


def test_a_classifier_days_own_options_replace_its_sizes_once_each_on_the_line(workspace):
    """The race's test job named --image-size and --batch-size twice (the day's, then the form's) before 2026-11-29:
    the script took the last, the student read both."""
    day = dlokit.setup_day("ann", "local", str(REPO / "tp_scripts" / "solutions"), data="synthetic", image_size=32,
                           batch_size=8, verbose=False)
    argv = shlex.split(day.command("--image-size", 64, "--lr", "0.1", steps=2))
    assert argv == [str(day.script), "--data", "synthetic", "--model", day.model, "--batch-size", "8", "--test",
                    "--test-nsteps", "2", "--print-every", "1", "--image-size", "64", "--lr", "0.1"]


def test_a_script_a_tp_runs_is_found_beside_the_students_scripts_or_one_folder_up(workspace):
    for scripts in (REPO / "tp_scripts" / "solutions", REPO / "tp_scripts"):
        day = dlokit.setup_day("ann", "local", str(scripts), data="synthetic", verbose=False)
        argv = shlex.split(day.command("--data", "/d", "--workers", "0,1", script="read_bench.py"))
        assert argv == [str(REPO / "tp_scripts" / "read_bench.py"), "--data", "/d", "--workers", "0,1"]


def test_day4_on_a_node_of_one_device_says_what_to_do_before_any_job(workspace, monkeypatch):
    """A laptop with one GPU: every Day 4 layout needs 2 ranks, and a world of 1 would fail every job."""
    import pytest

    (workspace / "profiles.toml").write_text('[one-gpu]\nextends = "local"\ngpus_per_node = 1\n\n'
                                             '[two-gpus]\nextends = "local"\ngpus_per_node = 2\n')
    monkeypatch.setenv("DLOKIT_PROFILES", str(workspace / "profiles.toml"))
    two = dlokit.setup_llm_day("ann", "two-gpus", str(REPO / "tp_scripts" / "solutions"), verbose=False)
    assert two.parallel_ranks(2) == 2 and two.parallel_ranks(8) == 2
    one = dlokit.setup_llm_day("ann", "one-gpu", str(REPO / "tp_scripts" / "solutions"), verbose=False)
    with pytest.raises(RuntimeError, match=r"need 2 devices per job.*offers 1.*CUDA_VISIBLE_DEVICES= \(empty\)"):
        one.parallel_ranks(2)
