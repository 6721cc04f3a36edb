"""The race form's memory levers (issue 51 item 5): gradient accumulation and activation checkpointing, offered by the
form where the training script has them, costed by the race planner, passed through to the run's command. (The
planner's cost against real runs of train_classifier.py with the levers: tests/test_classifier_levers.py.)"""
from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

import pytest

import dlokit
from dlokit import race
from dlokit.race.launch import run_command
from dlokit.race import planner

SCRIPT = Path(__file__).resolve().parents[1] / "tp_scripts" / "solutions" / "train_classifier.py"
# what a test job of 8 steps measured (batch 8 per GPU, 48 training images: 6 steps an epoch), as race.measure reads it
TEST = planner.TestRun(run_id="t", world_size=1, batch_size=8, step_s=0.2, t_data=0.01, t_forward=0.05, first_load_s=0.0,
               startup_s=5.0, steps=8, steps_per_epoch=6, train_images=48, val_images=12, persistent_workers=False,
               num_workers=0, drop_last=False, checkpoint_s=0.1, power_w=None, energy_source=None)


def parser_with_levers():
    """The solution script's own parser: it has --grad-accum and --activation-checkpointing (TP1.5's levers)."""
    return race.form.options_module(SCRIPT).build_parser()


def plan(options, test=TEST):
    return race.make_plan(test, profile=dlokit.get_profile("local"), budget_minutes=2, options=options)


def test_the_form_offers_the_levers_the_script_has_and_greys_those_it_has_not():
    module = race.form.options_module(SCRIPT)
    form = race.RaceForm(module.build_parser(), module.AUGMENTATIONS)
    form.options()
    assert "greyed" not in form.message.value and not form.greyed
    form.fields["activation_checkpointing"].value = True
    assert "--activation-checkpointing" in form.options()
    for name in race.form.LEVERS:  # the classifier's levers, enabled: its parser has them
        assert not form.fields[name].disabled and form.values()[name] is not None
    older = argparse.ArgumentParser()  # a script without the levers (its other options left out of this form)
    for option in ("--image-size", "--batch-size", "--lr", "--weight-decay", "--augment", "--data"):
        older.add_argument(option)
    form = race.RaceForm(older)
    options = form.options()
    for name in race.form.LEVERS:
        option = race.form.option_of(name)
        assert form.fields[name].disabled and form.values()[name] is None and option not in options
        assert option in form.message.value.split("greyed:")[-1]  # the greyed ones named


def test_a_form_with_accumulation_k_plans_k_micro_batches_a_step_and_passes_it_to_the_run(tmp_path):
    form = race.RaceForm(parser_with_levers(), image_size=32, batch_size=8)
    form.fields["grad_accum"].value = 4
    options = form.options()
    assert options[options.index("--grad-accum") + 1] == "4" and "in 4 micro-batches of 2" in form.message.value
    # the test job runs the form's options (race.submit_test): its steps are 4 micro-batches of 2 images, 0.05 s each
    ran = replace(TEST, step_s=0.2, grad_accum=4)
    accumulated = plan(options, ran)
    assert accumulated.step_s == pytest.approx(4 * ran.micro_s) and ran.micro_s == pytest.approx(0.05)
    assert accumulated.steps_per_epoch == 6 and accumulated.epoch_s == pytest.approx(plan(None, ran).epoch_s)
    assert "race step = 4 × 0.0500 s (micro-batches of 2 images) = 0.2000 s, measured" in accumulated.formula()

    day = dlokit.Day("alice", dlokit.get_profile("local"), SCRIPT, str(tmp_path))
    argv = run_command(day, accumulated, options)
    assert argv[argv.index("--grad-accum") + 1] == "4"
    form.fields["grad_accum"].value = 3
    with pytest.raises(ValueError, match="does not split|must split"):
        form.options()


def test_a_test_without_the_levers_costs_them_and_says_what_is_stated():
    four = plan(["--grad-accum", "4"])  # micro-batches of 2 images, from a test of whole batches of 8
    assert four.step_s == pytest.approx(4 * TEST.step_s / 4) and four.steps_per_epoch == TEST.steps_per_epoch
    assert "race step = 4 × 0.0500 s (micro-batches of 2 images: the test's 0.2000 s for 8 images × 1/4" in four.formula()
    assert "a lower bound" in four.formula() and "--grad-accum 4 measures it" in four.formula()
    with pytest.raises(race.RacePlanError, match="does not split into 3"):
        plan(["--grad-accum", "3"])
    with pytest.raises(race.RacePlanError, match="at least one micro-batch"):
        plan(["--grad-accum", "0"])


def test_checkpointing_costs_one_forward_more_measured_or_stated():
    on = plan(["--activation-checkpointing"])
    assert on.step_s == pytest.approx(TEST.step_s + TEST.t_forward) and on.epoch_s > plan(None).epoch_s
    assert "+ the batch's forward 0.0500 s (measured by the test) for activation checkpointing on" in on.formula()
    stated = plan(["--activation-checkpointing"], replace(TEST, t_forward=None))
    assert stated.step_s == pytest.approx(TEST.step_s * planner.STATED_RECOMPUTE) and "(stated:" in stated.formula()
    off = plan([], replace(TEST, activation_checkpointing=True))
    assert off.step_s == pytest.approx(TEST.step_s - TEST.t_forward) and "checkpointing off" in off.formula()
    measured = plan(["--activation-checkpointing"], replace(TEST, activation_checkpointing=True))
    assert measured.step_s == TEST.step_s and "measured: the test ran these levers" in measured.formula()


def race_run(runs: Path, levers: dict, steps: list[dict]):
    """A race run's record as train_classifier.py writes it (its config's levers, its step lines: forward passes and
    block forwards on the metric steps only), read back as the race check reads it."""
    from dlokit.in_job.runrecord import RunRecorder

    record = RunRecorder({"model": "resnet18", "batch_size": 8, **levers}, run_id="race1", runs_dir=runs,
                         script="train_classifier.py")
    for index, fields in enumerate(steps):
        record.step(step=index, loss=2.0, t_step=0.1, **fields)
    record.finish(steps=len(steps))
    return race.history("race1", runs)


BLOCKS = 8  # a ResNet-18's residual blocks


def test_the_race_check_shows_what_the_levers_did_and_names_the_todo_when_one_did_not_run(tmp_path):
    from dlokit.checks.race import levers_part

    assert levers_part(race_run(tmp_path / "none", {}, [{}, {}])) is None  # no lever asked: no part
    # the untouched TP1.5: --grad-accum 4 ran the whole batch in one pass, the blocks once
    untouched = race_run(tmp_path / "untouched", {"grad_accum": 4, "activation_checkpointing": True},
                         [{"forward_images": [8], "block_forwards": BLOCKS, "blocks": BLOCKS}, {}])
    shown = levers_part(untouched)
    assert shown.status == "failed" and shown.message.count("TODO TP1.5") == 2
    assert "accumulation ran the whole batch in one pass" in shown.message and "accumulate_step" in shown.message
    assert "Checkpointed.forward" in shown.message
    # solved: 4 micro-batches of 2, every block forward twice a pass (once more in backward)
    solved = race_run(tmp_path / "solved", {"grad_accum": 4, "activation_checkpointing": True},
                      [{"forward_images": [2, 2, 2, 2], "block_forwards": 2 * BLOCKS * 4, "blocks": BLOCKS}, {},
                       {"forward_images": [2, 2, 2, 2], "block_forwards": 2 * BLOCKS * 4, "blocks": BLOCKS}])
    shown = levers_part(solved)
    assert shown.status == "passed" and "TODO" not in shown.message
    assert "--grad-accum 4: 4 forward passes a step (2+2+2+2 images on rank 0)" in shown.message
    assert "ran forward again in backward" in shown.message and "over 2 recorded steps" in shown.message
    # accumulation solved, checkpointing not: only the checkpointing named
    half = race_run(tmp_path / "half", {"grad_accum": 4, "activation_checkpointing": True},
                    [{"forward_images": [2, 2, 2, 2], "block_forwards": BLOCKS * 4, "blocks": BLOCKS}])
    shown = levers_part(half)
    assert shown.status == "failed" and "Checkpointed.forward" in shown.message
    assert "accumulate_step" not in shown.message
    # a record without the step fields: not known, said, not judged
    older = levers_part(race_run(tmp_path / "older", {"grad_accum": 2}, [{}, {}]))
    assert older.status == "info" and "not known" in older.message
