"""Submitting the race: the short test job the planner measures, then the full run.

    test_id = submit_test(day, options)                  # a --test job with the race options
    plan = make_plan(test_id, profile=day.profile)
    job_id = submit_run(day, plan, options, begin="22:00")   # Slurm: starts at 22:00; local: now

The full run validates every epoch on the held-out val/ split, checkpoints every epoch and when its time is
nearly up (Slurm `--signal=USR2@120`, `--requeue`; its log is opened in append mode, so a requeued job keeps
it), and requeues itself from its checkpoint (dlokit.race.requeue).
"""
from __future__ import annotations

import re

from ..in_job import jobenv
from ..submission.jobspec import JobSpec
from ..submission.profiles import with_overrides
from ..submission.submit import submit
from ..submission.week import without_overridden
from .planner import RacePlan, RacePlanError
from .requeue import RequeueingTask, option_value

RACE_TAG = "race"
SIGNAL_BEFORE_S = 120  # Slurm may send it up to a minute early: room for a step and a checkpoint
TEST_STEPS = 20
# The test job is a timing probe: the lr does not change the time of a step, and the race's warm-up, counted in epochs
# of the real run (Day 3 keeps 1), may be as long as the probe's few steps, which the script refuses
NO_WARMUP = ("--warmup-steps", "0", "--warmup-epochs", "0")
# Slurm's --begin forms: now[+count[units]], a named time, HH:MM[:SS][AM|PM], YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY]
BEGIN = re.compile(r"now(\+\d+(seconds|minutes|hours|days|weeks|second|minute|hour|day|week|[smhdw])?)?"
                   r"|midnight|noon|fika|teatime|today|tomorrow"
                   r"|\d{1,2}:\d{2}(:\d{2})?([AaPp][Mm])?"
                   r"|\d{4}-\d{2}-\d{2}(T\d{1,2}:\d{2}(:\d{2})?)?"
                   r"|\d{1,2}/\d{1,2}(/\d{2})?")


def check_begin(value) -> str:
    """A start time for sbatch --begin, one of Slurm's forms; anything else (a space, ';', '$(', a newline) is
    refused with examples."""
    text = str(value).strip()
    if not BEGIN.fullmatch(text):
        raise RacePlanError(f"begin {value!r} is not a start time Slurm reads: write e.g. 'now+1hour', '22:00', "
                            "'tomorrow' or '2026-03-14T22:00'")
    return text


def submit_test(day, options=(), steps: int = TEST_STEPS, wait: bool = True) -> str:
    """A short timed --test job with the race options, on the race's GPU count; returns its job id. It saves one
    checkpoint at its last step: the race run saves one every epoch, and the plan counts that time."""
    options = [*without_overridden(list(map(str, options)), NO_WARMUP), *NO_WARMUP]  # a test's steps: no warm-up
    return day.submit(day.command("--checkpoint-steps", str(steps), *options, steps=steps),
                      n_gpu=day.profile.race_gpus, wait=wait, tp=RACE_TAG)[0]


def run_command(day, plan: RacePlan, options=()) -> list[str]:
    """The day's sizes first (as in its test job), then what the week chose (precision, layout, DataLoader:
    `day.carried`), then the race options, which replace any of them they name; a warm-up as long as the plan's epochs
    becomes half of them (fitted_warmup)."""
    base = ["--data", day.data, "--model", day.model, "--image-size", str(day.image_size), "--batch-size",
            str(day.batch_size), "--epochs", str(plan.epochs), "--checkpoint-epochs", "--checkpoint-on-signal",
            "--print-every", "20", *day.carried]
    argv = [str(day.script), *without_overridden(base, options), *map(str, options)]
    fitted = fitted_warmup(argv, plan.epochs)
    return [argv[0], *without_overridden(argv[1:], fitted), *fitted]


def fitted_warmup(argv: list[str], epochs: int) -> list[str]:
    """The options that shorten a warm-up of --warmup-epochs W >= the run's epochs (the script refuses it: e.g. the
    week's 1 epoch in a 1-epoch race) to half of the run; none when it fits."""
    warmup = option_value(argv, "--warmup-epochs")
    return ["--warmup-epochs", f"{epochs / 2:g}"] if warmup is not None and float(warmup) >= epochs else []


def _check_same_as_test(plan: RacePlan, argv: list[str]) -> None:
    """The plan holds for the options the test measured: refuse a run whose sizes differ from them."""
    config = plan.test.config
    for option, key in (("--batch-size", "batch_size"), ("--image-size", "image_size"), ("--model", "model")):
        asked = option_value(argv, option)
        if asked is not None and config.get(key) is not None and str(asked) != str(config[key]):
            raise RacePlanError(f"{option} {asked}, but test run {plan.test.run_id} measured {option} {config[key]}: "
                                "run the test job again with the race's options, then plan")


def race_profile(profile, begin: str | None = None):
    """The profile a race run is submitted with: on Slurm, requeueable, warned SIGNAL_BEFORE_S seconds before its
    time limit, and maybe started later (`begin`); the local backend starts it now."""
    if profile.backend != "slurm":
        if begin is not None:
            raise RacePlanError(f"begin={begin!r} delays Slurm jobs; on profile {profile.name!r} (this machine) the "
                                "run starts now: leave begin out")
        return profile
    extra = {"requeue": True, "signal": f"USR2@{SIGNAL_BEFORE_S}"}  # submitit adds --open-mode=append
    if begin is not None:
        extra["begin"] = check_begin(begin)
    return with_overrides(profile, sbatch={**profile.sbatch, **extra})


def submit_run(day, plan: RacePlan, options=(), begin: str | None = None, wait: bool = False) -> str:
    """Submit the full race run the plan sized; returns its job id. `begin` (Slurm only): when it may start."""
    profile = day.profile
    if not plan.fits:
        raise RacePlanError("the plan fits no epoch in the budget:\n" + plan.formula())
    argv = run_command(day, plan, options)
    _check_same_as_test(plan, argv)
    asked = option_value([*day.carried, *map(str, options)], "--warmup-epochs")
    if option_value(argv, "--warmup-epochs") != asked:
        print(f"a warm-up of {asked} epoch(s) does not fit a {plan.epochs}-epoch race: "
              f"{option_value(argv, '--warmup-epochs')} epoch(s) instead")
    profile = race_profile(profile, begin)
    spec = JobSpec.from_command(argv, name=day.nickname, n_gpu=plan.gpus, time_max=plan.time_limit,
                                env={jobenv.TAG: RACE_TAG})
    card = submit([spec], profile, task_class=RequeueingTask)[0]
    card.extra.update(requeue=True, race=plan.as_dict(), begin=begin)
    card.save()
    day.submitted.append(card.job_id)
    if wait:
        from ..submission.queue import display_slurm_queue

        display_slurm_queue(day.nickname, timestep=day.refresh_s, job_ids=[card.job_id])
    return card.job_id
