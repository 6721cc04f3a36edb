"""The week's thread: what Day 1 and Day 2 chose reaches the later days' commands and the race, a TP's own options
win over it, and a day whose earlier choice is missing says so and uses the script's defaults."""
import importlib.util
import json
import shlex
from pathlib import Path

import pytest

import dlokit
from dlokit import race
from dlokit.analysis import large_batch
from dlokit.in_job.runrecord import RunRecorder

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


def trained(runs_dir, run_id, optimizer, correct, lr, **config):
    """The record of a large-batch training (TP3.1 or TP3.2's) that reached `correct` of 100 validation images."""
    config = {"optimizer": optimizer, "lr": lr, "base_batch_size": 16, "lr_scaling": "sqrt", "warmup_epochs": 1.0,
              "lr_schedule": "cosine", "batch_size": 150, "global_batch_size": 150, "val_images": 100, **config}
    with RunRecorder(config, run_id=run_id, runs_dir=runs_dir) as recorder:
        recorder.log("val", epoch=1, step=2, val_loss=1.0, val_acc=correct / 100)
    return run_id


def test_day3_keeps_an_optimiser_only_when_it_trained_above_sgd_beyond_noise(tmp_path):
    sgd = trained(tmp_path, "sgd", "sgd", 20, 0.05, lr_scaling="linear")
    lamb, adamw = trained(tmp_path, "lamb", "lamb", 60, 0.005), trained(tmp_path, "adamw", "adamw", 70, 0.002)
    kept, why = large_batch.kept_optimizer([sgd, lamb], runs_dir=tmp_path)
    assert kept == {"optimizer": "lamb", "lr": 0.005, "base_batch_size": 16, "lr_scaling": "sqrt",
                    "warmup_epochs": 1.0, "lr_schedule": "cosine"}  # what that run trained with
    assert why.startswith("lamb: top-1 0.600 [") and "above SGD's top-1 0.200" in why
    assert large_batch.kept_optimizer([sgd, lamb, adamw], runs_dir=tmp_path)[0]["optimizer"] == "adamw"  # the best

    close = trained(tmp_path, "close", "lion", 27, 0.0003)  # 27 vs 20 of 100: the intervals overlap
    kept, why = large_batch.kept_optimizer([sgd, close], runs_dir=tmp_path)
    assert kept["optimizer"] == "sgd" and kept["lr"] == 0.05 and kept["lr_scaling"] == "linear"
    assert "no other optimiser or lr trained above" in why
    found = trained(tmp_path, "found", "sgd", 55, 0.3, base_batch_size=150, lr_scaling="none")
    kept, why = large_batch.kept_optimizer([sgd, close], [found], runs_dir=tmp_path)
    assert (kept["optimizer"], kept["lr"], kept["base_batch_size"]) == ("sgd", 0.3, 150)
    assert why.startswith("SGD at the range test's lr")
    # every optimiser of TP3.2 trains at its range test's lr: the best above TP3.1's SGD is kept, whichever it is
    found_lamb = trained(tmp_path, "found-lamb", "lamb", 75, 0.002, base_batch_size=150, lr_scaling="none")
    kept, why = large_batch.kept_optimizer([sgd, lamb], [found, found_lamb], runs_dir=tmp_path)
    assert (kept["optimizer"], kept["lr"]) == ("lamb", 0.002) and why.startswith("lamb at the range test's lr: top-1 0.750")

    unfinished = trained(tmp_path, "failed", "sgd", 0, 0.05)
    (tmp_path / unfinished / "rank0" / "metrics.jsonl").write_text("")  # no validation line
    assert large_batch.kept_optimizer([unfinished, lamb], runs_dir=tmp_path)[0] == {}


def test_the_race_starts_from_day3s_optimiser_and_scales_its_lr_to_the_race_batch(week_so_far):
    day().remember(optimizer={"optimizer": "lamb", "lr": 0.005, "base_batch_size": 16, "lr_scaling": "sqrt",
                              "warmup_epochs": 1.0, "lr_schedule": "cosine"})
    racer = day(carry_from=[1, 2, 3])
    assert ("from Day 3: lamb, lr 0.005 at batch 16 (sqrt scaling to another batch), 1 warm-up epoch(s), cosine "
            "schedule") in racer.describe()
    form = race.race_form(racer)
    assert (form.fields["optimizer"].value, form.fields["lr"].value, form.fields["base_batch_size"].value,
            form.fields["lr_scaling"].value, form.fields["warmup_epochs"].value) == ("lamb", 0.005, 16, "sqrt", 1.0)

    class Plan:
        epochs = 3

    argv = race.launch.run_command(racer, Plan, form.options())
    args = parse(shlex.join(argv))
    assert (args.optimizer, args.lr, args.base_batch_size, args.lr_scaling, args.warmup_epochs, args.lr_schedule,
            args.amp, args.num_workers) == ("lamb", 0.005, 16, "sqrt", 1.0, "cosine", "bf16", 2)
    assert argv.count("--optimizer") == 1 and argv.count("--lr") == 1
    # the script scales the lr to the race's batch from the batch it was set for: 0.005 x sqrt(64 / 16)
    spec = importlib.util.spec_from_file_location("optim_setup", SOLUTIONS / "optim_setup.py")
    optim_setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(optim_setup)
    assert optim_setup.peak_lr(args.lr, args.batch_size, args.base_batch_size, args.lr_scaling) == pytest.approx(0.01)
    # the racer changes the optimiser: obeyed, and compile is offered too
    form.fields["optimizer"].value, form.fields["compile"].value = "sgd", True
    args = parse(shlex.join(race.launch.run_command(racer, Plan, form.options())))
    assert (args.optimizer, args.compile) == ("sgd", True)


def test_a_race_without_day3_says_so_and_trains_with_the_scripts_optimiser(week_so_far):
    racer = day(carry_from=[1, 2, 3])
    assert "from Day 3: nothing saved yet (run Day 3's notebook to choose): the script's defaults (SGD" in \
        racer.describe()
    args = parse(shlex.join(race.launch.run_command(racer, type("Plan", (), {"epochs": 1}))))
    assert (args.optimizer, args.lr_scaling, args.amp) == ("sgd", "none", "bf16")


def test_the_repeatability_bench_tabulates_what_each_day_chose(week_so_far):
    """bench/course_repeatability.py reads the course notes of each run: a choice that moves with the noise (Day 1's
    batch did: 64, 64, 16, 64, 32 in five course runs) shows as a row that differs between runs."""
    spec = importlib.util.spec_from_file_location("course_repeatability", REPO / "bench" / "course_repeatability.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    found = bench.choices(day().runs)
    assert found["week | choice: batch_size"] == "64" and found["week | choice: amp"] == "bf16"
    assert found["week | choice: channels_last"] == "true" and found["week | choice: loader"] == json.dumps(TUNED)
    assert "week | choice: optimizer" not in found  # Day 3 has not run: nothing to show


def llm_args(command: str):
    """train_llm.py's own parser reads Day 4's command line."""
    from tp_imports import common

    return common("llm_options", llm=True).parse_args(shlex.split(command)[1:])


def llm_day(nickname="ann"):
    return dlokit.setup_llm_day(nickname, "local", str(SOLUTIONS), carry_from=[1], verbose=False)


def test_day4_computes_in_the_precision_day1_kept(week_so_far):
    fourth = llm_day()
    assert (llm_args(fourth.command("fsdp")).dtype, llm_args(fourth.command("fsdp")).tf32) == ("bf16", False)
    assert "from Day 1: bf16" in fourth.describe() and "on train_llm.py: --dtype bf16" in fourth.describe()
    argv = shlex.split(fourth.command("ddp", "--dtype", "fp32"))  # a TP's own precision wins
    assert argv.count("--dtype") == 1 and llm_args(shlex.join(argv)).dtype == "fp32"
    assert "--dtype" not in fourth.command(None, script="check_tp.py")  # the checkers take no training options
    assert fourth.dtype == "bf16"  # what TP4.2's memory model plans its limits with
    from dlokit.analysis.layout_scan import scan_limit
    from dlokit.analysis.llm_memory import model_config

    shape = model_config(fourth.script.parent, "scan-demo")
    plans = {dtype: scan_limit(shape, ranks=2, batches=[32, 64, 128, 256], seq_len=16, dtype=dtype)
             for dtype in ("fp32", "bf16")}
    assert all(b < f for b, f in zip(plans["bf16"]["needs"]["fsdp"], plans["fp32"]["needs"]["fsdp"]))

    fourth.remember(amp="fp16", tf32=True)  # train_llm.py has no fp16: fp32, with Day 1's TF32
    args = llm_args(fourth.command("fsdp"))
    assert (args.dtype, args.tf32) == ("fp32", True)
    assert "on train_llm.py: fp32, its default, --tf32 (it has no fp16)" in fourth.describe()


def test_day4_without_day1_says_so_and_computes_in_fp32(workspace):
    fourth = llm_day("bob")
    assert "from Day 1: nothing saved yet" in fourth.describe() and "on train_llm.py" not in fourth.describe()
    assert llm_args(fourth.command("fsdp")).dtype == "fp32"


def test_a_machine_without_a_gpu_names_its_devices_cpu_processes(workspace, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    first = day()
    assert first.device == "CPU process" and "GPU(s)" not in first.describe()
    assert "CPU process" in first.describe() and "(no GPU here: each stands for one)" in first.describe()
