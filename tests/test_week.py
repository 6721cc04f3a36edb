"""The week's thread: what Day 1 and Day 2 chose reaches the later days' commands and the race, a TP's own options
win over it, and a day whose earlier choice is missing says so and uses the script's defaults."""
import shlex
from pathlib import Path

import pytest

import dlokit
from dlokit import race

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "tp_scripts" / "solutions"
TUNED = ["--num-workers", "2", "--pin-memory", "--non-blocking", "--prefetch-factor", "4", "--persistent-workers"]


def parse(command: str):
    """The training script's own parser reads the command line (what a job would run)."""
    argv = shlex.split(command)
    return race.form.options_module(argv[0]).build_parser().parse_args(argv[1:])


def day(carry_from=(), nickname="ann", batch_size=None):
    return dlokit.setup_day(nickname, "local", str(SOLUTIONS), data="synthetic", batch_size=batch_size,
                            carry_from=carry_from, verbose=False)


@pytest.fixture
def week_so_far(workspace):
    """What Day 1 and Day 2 of the course notebooks save (day.remember) on a GPU machine."""
    first = day()
    first.remember(batch_size=64, amp="bf16", tf32=False)
    first.remember(channels_last=True)
    first.remember(loader=TUNED)


def test_a_later_day_starts_from_what_the_earlier_days_chose(week_so_far):
    second = day(carry_from=[1])
    assert second.batch_size == 64  # Day 1's batch, as BATCH_SIZE = None asks
    args = parse(second.command("--num-workers", "0"))
    assert (args.amp, args.channels_last, args.batch_size, args.num_workers, args.pin_memory) == ("bf16", True, 64, 0,
                                                                                                   False)
    assert "from Day 1: bf16, batch 64, channels_last" in second.describe()

    third = day(carry_from=[1, 2], batch_size=16)
    args = parse(third.command())
    assert (args.amp, args.channels_last, args.batch_size) == ("bf16", True, 16)  # a TP's own batch stays its own
    assert (args.num_workers, args.pin_memory, args.prefetch_factor, args.persistent_workers) == (2, True, 4, True)
    assert ("from Day 2: 2 DataLoader workers, pinned memory, non-blocking copies, persistent workers, prefetch 4"
            in third.describe())


def test_a_tps_own_options_win_over_the_carried_ones(week_so_far):
    second = day(carry_from=[1])
    argv = shlex.split(second.command("--amp", "none", "--no-channels-last"))
    assert argv.count("--amp") == 1 and "--channels-last" not in argv  # replaced, not repeated
    args = parse(second.command("--amp", "none", "--no-channels-last"))
    assert (args.amp, args.channels_last) == ("none", False)
    # a script a TP runs beside the training script takes only the TP's options
    assert shlex.split(second.command("--workers", "0", script="read_bench.py"))[1:] == ["--workers", "0"]


def test_a_day_whose_earlier_choice_is_missing_says_so_and_uses_the_scripts_defaults(workspace):
    second = day(carry_from=[1, 2], nickname="newcomer")
    assert second.batch_size == 16 and second.carried == []
    args = parse(second.command())
    assert (args.amp, args.channels_last, args.num_workers) == ("none", False, 0)
    text = second.describe()
    assert "from Day 1: nothing saved yet (run Day 1's notebook to choose): the script's defaults (fp32, NCHW" in text
    assert "from Day 2: nothing saved yet" in text


def test_day1_without_a_gain_saves_fp32_and_the_later_days_say_so(workspace):
    day().remember(batch_size=32, amp="none", tf32=False, channels_last=False)
    day().remember(loader=[])  # Day 2's tuned loader showed no gain here
    later = day(carry_from=[1, 2])
    text = later.describe()
    assert "from Day 1: fp32, batch 32, NCHW" in text and "from Day 2: no DataLoader workers" in text
    args = parse(later.command())
    assert (args.amp, args.channels_last, args.num_workers) == ("none", False, 0)


def test_the_race_carries_the_weeks_precision_and_loader_options(week_so_far):
    racer = day(carry_from=[1, 2])
    form = race.race_form(racer)
    assert form.fields["amp"].value == "bf16" and form.fields["channels_last"].value is True
    assert form.fields["num_workers"].value == 2 and form.fields["pin_memory"].value is True
    assert form.fields["batch_size"].value == 64 and form.fields["prefetch_factor"].value == 4

    class Plan:
        epochs = 3

    # the form's options as they are: the run does what the week chose
    args = parse(shlex.join(race.launch.run_command(racer, Plan, form.options())))
    assert (args.amp, args.channels_last, args.num_workers, args.pin_memory, args.persistent_workers, args.epochs) == \
        ("bf16", True, 2, True, True, 3)
    # a racer who changes them is obeyed; each option once on the command line
    form.fields["amp"].value, form.fields["channels_last"].value, form.fields["num_workers"].value = "fp16", False, 1
    argv = race.launch.run_command(racer, Plan, form.options())
    args = parse(shlex.join(argv))
    assert (args.amp, args.channels_last, args.num_workers) == ("fp16", False, 1)
    assert argv.count("--amp") == 1 and argv.count("--num-workers") == 1 and "--channels-last" not in argv
    # without the form (a headless race of defaults), the week's options alone
    args = parse(shlex.join(race.launch.run_command(racer, Plan)))
    assert (args.amp, args.channels_last, args.num_workers) == ("bf16", True, 2)
