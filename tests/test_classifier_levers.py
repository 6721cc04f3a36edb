"""train_classifier.py's memory levers, run for real (CPU, gloo): --grad-accum K runs the student's TP1.5
accumulate_step (fit_levers.py) inside the step, --activation-checkpointing its Checkpointed blocks. What each step
ran is in its record (forward passes' images, block forwards), and the race's planner reads it back: a lever asked for
that did not run (the untouched TODO TP1.5) is named, never costed as if it had."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from tiny_data import tiny_folder
from ranks import run_warm

import dlokit
from dlokit import race
from dlokit.analysis.profiler import collectives_in_trace, profiler_steps, read_trace, trace_files
from dlokit.in_job.runrecord import read_rank

REPO = Path(__file__).resolve().parents[1]
SOLUTION, STUDENT = REPO / "tp_scripts" / "solutions" / "train_classifier.py", REPO / "tp_scripts" / "train_classifier.py"
SMALL = ["--image-size", "32", "--batch-size", "8", "--test", "--test-nsteps", "4", "--print-every", "1000"]
RESNET18_BLOCKS = 8



@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """4 classes x 12 images (48: 6 steps of 8 an epoch), validation 2 per class."""
    return tiny_folder(tmp_path_factory.mktemp("data") / "tiny", val_per_class=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


def train(runs: Path, run_id: str, data: Path, *options, script=SOLUTION, ranks: int = 1) -> list[dict]:
    """Run the script (each rank started warm, as the kit's local tasks are); every rank's record."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DLOKIT_RUN_ID": run_id}
    cmd = [sys.executable, str(script), "--runs-dir", str(runs), "--data", str(data), *SMALL, *map(str, options)]
    done = run_warm(cmd, env, 300, ranks=ranks, cwd=REPO)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return [read_rank(runs / run_id / f"rank{r}") for r in range(ranks)]


def steps(record: dict) -> list[dict]:
    return [m for m in record["metrics"] if m["kind"] == "step"]


def test_accumulation_runs_k_micro_batches_and_one_optimizer_step_the_large_batch_without_batchnorm(runs, tiny):
    """squeezenet1_1 has no normalisation that depends on the batch (and its dropout draws the same numbers for two
    halves as for the whole, on the CPU): the accumulated run is the plain run, step by step."""
    plain, = train(runs, "squeeze-plain", tiny, "--model", "squeezenet1_1")
    accumulated, = train(runs, "squeeze-k2", tiny, "--model", "squeezenet1_1", "--grad-accum", 2)
    assert accumulated["run"]["config"]["grad_accum"] == 2 and plain["run"]["config"]["grad_accum"] == 1
    assert all(s["forward_images"] == [4, 4] and s["batch_size"] == 8 for s in steps(accumulated))
    assert all("forward_images" not in s for s in steps(plain))  # no watch without a lever
    for a, p in zip(steps(accumulated), steps(plain), strict=True):
        assert a["loss"] == pytest.approx(p["loss"], rel=1e-5) and a["acc"] == p["acc"]
        assert a["lr"] == pytest.approx(p["lr"], rel=1e-9)  # the schedule stepped once a step
    # one optimizer step per step: two would have moved the weights twice as far
    assert accumulated["summary"]["param_checksum"] == pytest.approx(plain["summary"]["param_checksum"], rel=1e-5)


def test_with_batchnorm_the_micro_batches_are_normalised_apart_so_the_loss_differs(runs, tiny):
    """The ResNet's BatchNorm normalises each micro-batch of 4 with its own statistics: not the batch of 8's maths
    (TP1.5's norm lesson measures it; GroupNorm or BatchNorm in eval mode would not differ)."""
    plain, = train(runs, "resnet-plain", tiny, "--model", "resnet18")
    accumulated, = train(runs, "resnet-k2", tiny, "--model", "resnet18", "--grad-accum", 2)
    first_plain, first_accumulated = steps(plain)[0]["loss"], steps(accumulated)[0]["loss"]
    assert abs(first_accumulated - first_plain) / first_plain > 1e-4  # far above fp32 rounding (~1e-7)
    assert steps(accumulated)[0]["forward_images"] == [4, 4]


def test_checkpointing_runs_every_block_twice_with_the_plain_runs_losses_and_weights(runs, tiny):
    plain, = train(runs, "resnet-plain-ck", tiny, "--model", "resnet18")
    checkpointed, = train(runs, "resnet-ck", tiny, "--model", "resnet18", "--activation-checkpointing")
    for c, p in zip(steps(checkpointed), steps(plain), strict=True):
        assert c["forward_images"] == [8] and c["blocks"] == RESNET18_BLOCKS
        assert c["block_forwards"] == 2 * RESNET18_BLOCKS  # forward, then again in backward
        assert c["loss"] == pytest.approx(p["loss"], rel=1e-5)
    assert checkpointed["summary"]["param_checksum"] == pytest.approx(plain["summary"]["param_checksum"], rel=1e-5)
    # less held for backward: each block keeps its input only
    assert checkpointed["summary"]["tensor_saved_mib"] < plain["summary"]["tensor_saved_mib"]


def test_two_ranks_all_reduce_the_gradients_once_per_accumulated_step(runs, tiny):
    """no_sync on every micro-batch but the last: the profiled steps' all-reduces carry each parameter once a step
    (and the step's loss and accuracy, two numbers), not K times."""
    records = train(runs, "ddp-k2", tiny, "--model", "squeezenet1_1", "--batch-size", 4, "--grad-accum", 2,
                    "--profile", "--profile-wait", 1, "--profile-warmup", 1, "--profile-active", 2, ranks=2)
    params = records[0]["run"]["config"]["param_count"]
    for rank, record in enumerate(records):
        assert record["run"]["observed"]["ddp_wrapped"] and record["summary"]["params_identical_across_ranks"]
        assert all(s["forward_images"] == [2, 2] for s in steps(record))
        trace, = trace_files(runs / "ddp-k2" / "profile", rank=rank)
        profiled = len(profiler_steps(read_trace(trace)))
        reduced = collectives_in_trace(trace).set_index("collective").loc["allreduce", "MiB"] * 2**20 / 4
        assert profiled == 2 and reduced / profiled == pytest.approx(params + 2, rel=1e-6)


def test_the_planner_reads_what_ran_measured_levers_from_the_solution(runs, tiny):
    train(runs, "race-k2", tiny, "--model", "resnet18", "--grad-accum", 2, "--activation-checkpointing")
    test = race.measure("race-k2", runs)
    assert (test.grad_accum, test.activation_checkpointing, test.levers_not_run) == (2, True, [])
    plan = race.make_plan(test, profile=dlokit.get_profile("local"), budget_minutes=2,
                          options=["--grad-accum", "2", "--activation-checkpointing"])
    assert plan.step_s == test.step_s and "measured: the test ran these levers" in plan.formula()
    assert "TODO TP1.5" not in plan.formula()


def test_the_untouched_student_levers_are_named_not_costed(runs, tiny):
    """The student's train_classifier.py runs the student's fit_levers.py: untouched, one pass of the whole batch and
    blocks that run once. The record shows it and the plan says so, naming the TODO."""
    assert "TODO TP1.5" in (STUDENT.parent / "fit_levers.py").read_text()
    record, = train(runs, "student-k2", tiny, "--model", "resnet18", "--grad-accum", 2, "--activation-checkpointing",
                    script=STUDENT)
    assert all(s["forward_images"] == [8] and s["block_forwards"] == RESNET18_BLOCKS for s in steps(record))
    test = race.measure("student-k2", runs)
    assert (test.grad_accum, test.activation_checkpointing) == (1, False)
    plan = race.make_plan(test, profile=dlokit.get_profile("local"), budget_minutes=2,
                          options=["--grad-accum", "2", "--activation-checkpointing"])
    text = plan.formula()
    assert "your accumulation ran the whole batch in one pass: TODO TP1.5" in text
    assert "your activation checkpointing recomputed nothing" in text and "measured: the test ran" not in text
    assert json.dumps(test.levers_not_run).count("TODO TP1.5") == 2


def test_the_options_refuse_what_the_levers_cannot_run(capsys):
    from tp_imports import common

    options = common("train_options")
    for argv, words in ((["--batch-size", "6", "--grad-accum", "4"], "must split into 4 equal micro-batches"),
                        (["--batch-size", "4", "--grad-accum", "4"], "of 2 images or more"),
                        (["--model", "vgg11", "--activation-checkpointing"], "is not a ResNet"),
                        (["--grad-accum", "2", "--lr-finder"], "--lr-finder trains its trials whole-batch")):
        with pytest.raises(SystemExit):
            options.parse_args(["--data", "synthetic", "--image-size", "32", *argv], cuda_available=False)
        assert words in capsys.readouterr().err
    keep = options.parse_args(["--data", "synthetic", "--batch-size", "8", "--grad-accum", "4"], cuda_available=False)
    assert keep.grad_accum == 4


@pytest.mark.parametrize("images, batch, k, dropped", [(13, 8, 1, False), (9, 8, 1, True), (12, 8, 2, False),
                                                       (13, 8, 2, True), (10, 8, 2, True), (16, 8, 4, False),
                                                       (20, 8, 2, False)])
def test_an_epochs_last_batch_is_kept_only_when_it_splits_into_the_micro_batches(images, batch, k, dropped):
    from tp_imports import common

    assert common("training_state").last_batch_dropped(images, batch, k) is dropped
    test = race.TestRun(run_id="t", world_size=1, batch_size=batch, step_s=0.1, t_data=0.0, t_forward=None,
                        first_load_s=0.0, startup_s=1.0, steps=4, steps_per_epoch=1, train_images=images, val_images=0,
                        persistent_workers=False, num_workers=0, drop_last=False, checkpoint_s=None, power_w=None,
                        energy_source=None)
    assert race.planner.epoch_steps(test, 1, k) == (images // batch if dropped else -(-images // batch))


def test_accumulation_composes_with_autocast_mixup_and_channels_last(runs, tiny):
    """The whole batch is mixed, converted to NHWC, then split: each micro-batch's forward under autocast (bf16 on the
    CPU: no loss scaler there), the soft targets split with it."""
    record, = train(runs, "k2-mixed", tiny, "--model", "resnet18", "--grad-accum", 2, "--amp", "bf16",
                    "--augment", "mixup", "--channels-last")
    observed = record["run"]["observed"]
    assert observed["amp_dtype"] == "bfloat16" and observed["channels_last_input"] and observed["augment_on_device"]
    assert all(s["forward_images"] == [4, 4] and s["loss"] > 0 for s in steps(record))
