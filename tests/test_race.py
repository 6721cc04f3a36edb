"""The Imagenet Race: the planner on real test records, the form, --begin, energy, and runs that survive a
signal (checkpoint, requeue or resume, per-epoch top-1 history intact) on the script, the local backend and
the local Slurm."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import preloaded
import pytest
from tiny_data import tiny_folder

import dlokit
from dlokit import race
from dlokit.in_job import energy
from dlokit.analysis import load_run
from dlokit.submission.jobspec import JobSpec, sbatch_preview
from dlokit.race.launch import race_profile

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tp_scripts" / "solutions" / "train_classifier.py"
INJECT = REPO / "tests" / "job_scripts" / "inject.py"  # runs SCRIPT with a fault in it
PYTHON = sys.executable
TINY = ["--model", "resnet18", "--image-size", "32", "--batch-size", "8"]



@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """4 classes x 12 images (6 steps per epoch at batch 8), 3 validation images per class."""
    return tiny_folder(tmp_path_factory.mktemp("race") / "tiny", val_per_class=3)


def script(runs: Path, run_id: str, *args, nproc: int = 1, env: dict | None = None, inject: tuple = ()) -> subprocess.Popen:
    """The reference script (inject: a fault, through tests/job_scripts/inject.py)."""
    launcher = [PYTHON] if nproc == 1 else [str(Path(PYTHON).with_name("torchrun")), "--nproc_per_node", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DLOKIT_RUN_ID": run_id, "PYTHONUNBUFFERED": "1", **(env or {})}
    command = [*launcher, *([str(INJECT), *inject] if inject else []), str(SCRIPT), "--runs-dir", str(runs), *TINY,
               "--print-every", "1000", *map(str, args)]
    if nproc == 1:  # forked from a server that has imported torch (tests/preloaded.py)
        return preloaded.popen(command, env=env, merge_stderr=True)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return process.returncode, out


def make_test_run(runs: Path, tiny: Path, run_id: str = "test", checkpoint: bool = True) -> str:
    """A --test job of 8 steps which saves a checkpoint at its last step, as race.submit_test's does."""
    code, out = finish(script(runs, run_id, "--data", tiny, "--test", "--test-nsteps", 8,
                              *(["--checkpoint-steps", 8] if checkpoint else [])))
    assert code == 0, out
    return run_id


def wait_for_validation(metrics: Path, process=None, timeout: float = 240) -> None:
    """Until the record has a validation line and a step after it: the run is mid-epoch 2."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any('"kind": "val"' in line for line in lines) and '"kind": "step"' in lines[-1]:
            return
        assert process is None or process.poll() is None, "the run ended before it could be signalled"
        time.sleep(0.05)
    raise AssertionError(f"no validation line in {metrics} after {timeout} s")


# ---- the planner ---------------------------------------------------------------------------------------

def test_plan_follows_from_a_real_test_run(tmp_path, tiny):
    profile = dlokit.get_profile("local")
    run = load_run(make_test_run(tmp_path, tiny), tmp_path)
    summary, config = run.summary, run.config
    # the formula, worked out here from the record itself
    step = summary["t_data"] + summary["t_step"]  # CPU: the measured pace per step
    [save] = [e["seconds"] for e in run.rank0["metrics"] if e.get("event") == "checkpoint_saved"]  # at step 8
    startup = summary["ended_unix"] - summary["process_started_unix"] - summary["steps"] * step - save
    val_batches = math.ceil(12 / 8)  # 4 classes x 3 validation images, batch 8
    epoch = config["steps_per_epoch"] * step + val_batches * (summary["t_data"] + summary["t_forward"]) + save
    budget_s = 120.0
    expected = math.floor((budget_s - startup) / epoch)

    plan = race.make_plan("test", profile=profile, runs_dir=tmp_path, budget_minutes=2)
    assert config["steps_per_epoch"] == 6 and plan.val_batches == val_batches
    assert plan.test.startup_s == pytest.approx(startup) and plan.epoch_s == pytest.approx(epoch)
    assert plan.epochs == expected and expected >= 1
    assert save > 0 and plan.checkpoint_s == pytest.approx(save) and f"checkpoint: {save:.2f} s per epoch" in plan.formula()
    text = plan.formula()
    assert f"= {expected}\n" in text and f"{plan.test.step_s:.4f} s" in text and f"{startup:.1f} s" in text
    assert plan.gpu_hours == pytest.approx((startup + expected * epoch) / 3600)
    assert plan.energy_text == ("n/a" if summary.get("host_energy_j") is None else plan.energy_text)
    assert plan.gpu_hours <= plan.budget_gpu_hours and dlokit.submission.jobspec.parse_time(plan.time_limit) > plan.planned_s

    # the profile's budget; more budget, more epochs; two GPUs, half the steps per epoch
    assert race.make_plan("test", profile=profile, runs_dir=tmp_path).budget_s == profile.race_budget_minutes * 60
    assert race.make_plan("test", profile=profile, runs_dir=tmp_path, budget_minutes=20).epochs > plan.epochs
    two = race.make_plan("test", profile=profile, runs_dir=tmp_path, gpus=2, budget_gpu_hours=plan.budget_gpu_hours)
    assert two.steps_per_epoch == 3 and two.budget_s == pytest.approx(budget_s / 2) and two.notes
    assert two.gpu_hours == pytest.approx(two.planned_s * 2 / 3600)

    # a budget shorter than the startup fits nothing, and the run is refused
    none = race.make_plan("test", profile=profile, runs_dir=tmp_path, budget_minutes=startup / 120)
    assert none.epochs == 0 and not none.fits and "does not fit one epoch" in none.formula()
    day = dlokit.Day("alice", profile, SCRIPT, str(tiny))
    with pytest.raises(race.RacePlanError, match="fits no epoch"):
        race.submit_run(day, none)
    with pytest.raises(race.RacePlanError, match="measured --batch-size 8"):
        race.submit_run(day, plan, ["--batch-size", "16"])
    with pytest.raises(race.RacePlanError, match="not completed|missing"):
        race.make_plan("nothing-here", profile=profile, runs_dir=tmp_path)


def test_a_plan_from_a_test_without_a_checkpoint_says_it_leaves_the_saves_out(tmp_path, tiny):
    plan = race.make_plan(make_test_run(tmp_path, tiny, "bare", checkpoint=False), profile=dlokit.get_profile("local"),
                          runs_dir=tmp_path, budget_minutes=2)
    assert plan.test.checkpoint_s is None and plan.checkpoint_s == 0
    assert "saved no checkpoint" in plan.formula() and "(the test saved none)" in plan.formula()


def test_form_gives_the_scripts_own_options():
    module = race.form.options_module(SCRIPT)
    parser = module.build_parser()
    options = race.race_options(parser, image_size=64, batch_size=32, lr=0.4, weight_decay=1e-4, optimizer="lamb",
                                lr_schedule="cosine", augment=["randaugment", "mixup"])
    assert options == ["--image-size", "64", "--batch-size", "32", "--lr", "0.4", "--weight-decay", "0.0001",
                       "--augment", "randaugment,mixup", "--optimizer", "lamb", "--lr-schedule", "cosine"]
    with pytest.raises(ValueError, match="invalid choice: 'adam'"):
        race.race_options(parser, image_size=64, batch_size=32, lr=0.1, weight_decay=0, optimizer="adam")
    with pytest.raises(ValueError, match="batch size"):
        race.race_options(parser, image_size=64, batch_size=1, lr=0.1, weight_decay=0)

    form = race.RaceForm(parser, module.AUGMENTATIONS, image_size=48, batch_size=16)
    form.fields["optimizer"].value = "adamw"
    form.fields["augment"].value = ("cutmix",)
    assert form.options()[:4] == ["--image-size", "48", "--batch-size", "16"]
    assert "adamw" in form.options() and "cutmix" in form.options() and "adamw" in form.message.value
    assert set(form.fields["lr_schedule"].options) == set(module.LR_SCHEDULES)


def test_begin_is_one_of_slurms_forms_and_reaches_the_batch_script():
    for good in ("now+1hour", "now+30minutes", "22:00", "tomorrow", "2026-03-14T22:00", "10:30:00PM"):
        assert race.check_begin(good) == good
    for bad in ("now; rm -rf ~", "22:00\n#SBATCH --qos=high", "$(reboot)", "`id`", "tomorrow 22:00", ""):
        with pytest.raises(race.RacePlanError, match="not a start time"):
            race.check_begin(bad)
    spec = JobSpec.from_command([str(SCRIPT), "--epochs", "3"], name="alice", n_gpu=4, time_max="01:00:00")
    batch = sbatch_preview(spec, race_profile(dlokit.get_profile("slurm"), begin="22:00"))
    for line in ("--begin=22:00", "--requeue", "--signal=USR2@120", "--open-mode=append"):
        assert f"#SBATCH {line}" in batch.splitlines()
    assert race_profile(dlokit.get_profile("local")) == dlokit.get_profile("local")
    with pytest.raises(race.RacePlanError, match="starts now"):
        race_profile(dlokit.get_profile("local"), begin="22:00")


# ---- energy: RAPL where the host lets us read it, else n/a ----------------------------------------------

def test_host_energy_is_rapl_where_readable_else_na(tmp_path):
    here = energy.HostEnergyMeter()
    readable = bool(here.zones)
    assert (here.energy_j() is not None) == readable and (here.unavailable is None) == readable
    if not readable:
        assert here.summary() == {"host_energy_j": None, "host_energy_counter": None,
                                  "host_energy_unavailable": here.unavailable}
        assert energy.Usage(10.0, 10.0, None, None).energy_text == "n/a"

    # a powercap tree as the kernel lays it out: two packages (one wraps around), a sub-zone and psys left out
    for zone, name, start in (("intel-rapl:0", "package-0", 1_000_000), ("intel-rapl:1", "package-1", 262_000_000),
                              ("intel-rapl:0:0", "core", 5), ("intel-rapl:2", "psys", 7)):
        folder = tmp_path / zone
        folder.mkdir()
        (folder / "name").write_text(name + "\n")
        (folder / "energy_uj").write_text(f"{start}\n")
        (folder / "max_energy_range_uj").write_text("262143328850\n")
    meter = energy.HostEnergyMeter(tmp_path)
    assert [z.name for z in meter.zones] == ["intel-rapl:0", "intel-rapl:1"]
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("3500000\n")   # +2.5 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("143328850\n")  # wrapped: +262143328850 - 118671150 µJ
    assert meter.energy_j() == pytest.approx(2.5 + (262_143_328_850 - 262_000_000 + 143_328_850) / 1e6)
    (tmp_path / "intel-rapl:0" / "energy_uj").chmod(0)
    if not os.access(tmp_path / "intel-rapl:0" / "energy_uj", os.R_OK):  # root reads anyway
        assert energy.HostEnergyMeter(tmp_path).unavailable.startswith("RAPL counters not readable")


# ---- runs that survive a signal ---------------------------------------------------------------------------

def test_signal_checkpoints_and_resume_keeps_the_top1_history(tmp_path, tiny):
    common = ["--data", tiny, "--epochs", 3, "--checkpoint-on-signal", "--checkpoint-epochs", "--lr", 0.05]
    first = script(tmp_path, "job", *common)
    wait_for_validation(tmp_path / "job" / "rank0" / "metrics.jsonl", first)
    first.send_signal(signal.SIGUSR1)  # what Slurm's --signal (or the kit's task) sends before the time limit
    code, out = finish(first)
    assert code == 75 and "checkpointed on SIGUSR1" in out, out
    stopped = load_run("job", tmp_path)
    saved = [m for m in stopped.rank0["metrics"] if m.get("event") == "checkpoint_saved"][-1]
    assert stopped.summary["status"] == "checkpointed" and stopped.summary["signal"] == "SIGUSR1"
    assert saved["step"] == stopped.summary["steps"] and 6 < saved["step"] < 18 and saved["batch_in_epoch"] > 0

    code, out = finish(script(tmp_path, "job.r1", *common, "--resume", tmp_path / "job"))  # the next segment
    assert code == 0, out
    found = race.history("job", tmp_path)
    assert [run.run_id for run in found.segments] == ["job", "job.r1"] and found.state == "completed"
    assert list(found.val["epoch"]) == [0, 1, 2] and list(found.val["step"]) == [6, 12, 18]
    assert found.best_top1 == max(found.val["val_acc"]) and found.final_top1 == found.val["val_acc"].iloc[-1]
    events = found.events()
    assert f"checkpointed on SIGUSR1 at step {saved['step']}" in events[0] and "requeued" in events[0]
    assert f"resumed from step {saved['step']}" in events[1] and "completed at step 18" in events[1]
    assert found.usage.gpu_hours > 0 and found.usage.gpu_seconds == pytest.approx(
        sum(energy.run_usage(run).gpu_seconds for run in found.segments))


@pytest.mark.slow
def test_two_ranks_stop_at_the_same_step_when_one_is_signalled(tmp_path, tiny):
    """Rank 0 (which writes the checkpoint) is made 3 s slower to finish: rank 1 must wait for it, since torchrun
    stops every rank as soon as one exits with 75 (seen under load: rank 0 killed, its checkpoint lost)."""
    process = script(tmp_path, "pair", "--data", tiny, "--epochs", 3, "--checkpoint-on-signal", nproc=2,
                     inject=("slow-checkpoint", "3"))
    wait_for_validation(tmp_path / "pair" / "rank1" / "metrics.jsonl", process)
    workers = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    rank1 = next(int(pid) for pid in workers if "RANK=1\0" in Path(f"/proc/{pid}/environ").read_text())
    os.kill(rank1, signal.SIGUSR2)  # only rank 1 hears it: the ranks agree through the store
    code, out = finish(process)
    assert code != 0 and "checkpointed on SIGUSR2" in out, out[-6000:]
    run = load_run("pair", tmp_path)
    steps = {rank: r["summary"]["steps"] for rank, r in run.ranks.items()}
    assert [r["summary"]["status"] for r in run.ranks.values()] == ["checkpointed"] * 2 and steps[0] == steps[1]
    saved = next(m for m in run.rank0["metrics"] if m.get("event") == "checkpoint_saved")
    assert saved["step"] == steps[0] and (tmp_path / "pair" / "checkpoint.pt").is_file()


@pytest.mark.slow
def test_a_warning_to_every_process_of_the_step_checkpoints_ranks_with_data_workers(tmp_path, tiny):
    """Slurm's --signal reaches every process of the step: the ranks, their DataLoader workers, and the forkserver
    the workers of a multi-rank job start from (image_data.worker_start). Only the ranks act on it: a worker
    killed by the warning would fail the epoch instead of the checkpoint."""
    import psutil

    process = script(tmp_path, "pair", "--data", tiny, "--epochs", 3, "--checkpoint-on-signal", "--num-workers", 1,
                     "--persistent-workers", nproc=2)
    wait_for_validation(tmp_path / "pair" / "rank1" / "metrics.jsonl", process)
    ranks = [psutil.Process(int(pid)) for pid in
             subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()]
    step = [p for rank in ranks for p in [rank, *rank.children(recursive=True)]]
    assert any("multiprocessing.forkserver" in " ".join(p.cmdline()) for p in step), [p.cmdline() for p in step]
    for member in step:
        member.send_signal(signal.SIGUSR2)
    code, out = finish(process)
    assert code != 0 and "checkpointed on SIGUSR2" in out, out[-6000:]
    run = load_run("pair", tmp_path)
    assert [r["summary"]["status"] for r in run.ranks.values()] == ["checkpointed"] * 2
    assert (tmp_path / "pair" / "checkpoint.pt").is_file()


def race_day(nickname: str, profile: str, tiny: Path) -> dlokit.Day:
    return dlokit.setup_day(nickname, profile, str(SCRIPT.parent), data=str(tiny), image_size=32, batch_size=8,
                            refresh_s=1, verbose=False)


def four_epoch_plan(day: dlokit.Day, tiny: Path) -> race.RacePlan:
    make_test_run(day.runs, tiny)
    plan = race.make_plan("test", profile=day.profile, budget_minutes=60, gpus=1)
    plan.epochs = 4  # long enough to be signalled mid-run
    return plan


def check_requeued_history(job_id: str, runs: Path) -> None:
    """Segment 0 checkpointed on the signal, the next one resumed from there, ... the last one completed; every
    epoch validated once. (On a loaded machine Slurm's own --signal before the time limit may requeue it again.)"""
    found = race.history(job_id, runs)
    base = dlokit.submission.jobs.find_card(job_id).run_dir.name  # a Slurm job's run id names its cluster: 1@dlokit
    names = [run.run_id for run in found.segments]
    assert names[:2] == [base, f"{base}.r1"] and names[2:] == [f"{base}.r{k}" for k in range(2, len(names))]
    assert found.state == "completed"
    assert list(found.val["epoch"]) == [0, 1, 2, 3] and list(found.val["step"]) == [6, 12, 18, 24]
    outcome = dlokit.job_outcome(job_id)
    assert outcome.state == "COMPLETED"
    for stopped, next_one in zip(found.segments, found.segments[1:]):
        summary = stopped.summary
        assert summary["status"] == "checkpointed" and summary["signal"].startswith("SIGUSR")
        resumed = next(m for m in next_one.rank0["metrics"] if m.get("event") == "resumed")
        assert resumed["step"] == summary["steps"]
        step = summary["steps"]
        assert f"at step {step}" in outcome.cause and f"resumed from step {step}" in outcome.cause


@pytest.mark.slow
def test_local_race_job_requeues_itself_and_resumes(workspace, tiny):
    day = race_day("alice", "local", tiny)
    job_id = race.submit_run(day, four_epoch_plan(day, tiny), ["--lr", "0.05"])
    card = dlokit.submission.jobs.find_card(job_id)
    wait_for_validation(day.runs / job_id / "rank0" / "metrics.jsonl")
    # the local controller sends SIGUSR2 to its tasks before the time limit: do it now
    tasks = subprocess.run(["pgrep", "-f", f"submitit.core._submit {card.folder}"], capture_output=True,
                           text=True).stdout.split()
    assert tasks
    for pid in tasks:
        os.kill(int(pid), signal.SIGUSR2)
    assert dlokit.wait([job_id], timeout_s=300)[0].state == "COMPLETED"
    check_requeued_history(job_id, day.runs)


@pytest.mark.slow
def test_a_warmup_as_long_as_the_test_or_the_race_still_runs(workspace, tiny):
    """The week's warm-up (Day 3 keeps 1 epoch) may be as long as the test job's steps, or as the planned race: the
    test runs without one (it only times steps), the race with half its epochs (the script refuses a warm-up as long
    as the run). Found by the course on 2026-11-27: Day 1 chose batch 16, and the race's test job exited 2."""
    day = race_day("alice", "local", tiny)
    options = ["--warmup-epochs", "1", "--lr", "0.05"]
    test_id = race.submit_test(day, options, steps=6)  # 6 steps: one epoch of the tiny set at batch 8
    assert dlokit.job_outcome(test_id).state == "COMPLETED", dlokit.job_outcome(test_id)
    assert load_run(test_id, day.runs).config["warmup_steps"] == 0
    plan = race.make_plan(test_id, profile=day.profile, budget_minutes=60, gpus=1)
    plan.epochs = 1
    argv = race.launch.run_command(day, plan, options)
    assert race.launch.option_value(argv, "--warmup-epochs") == "0.5"
    named = [word for word in argv if word.startswith("--")]
    assert len(named) == len(set(named)), argv  # each option once: what the student reads is what the script does
    test_argv = load_run(test_id, day.runs).info.get("argv") or []
    assert test_argv.count("--warmup-epochs") <= 1 and test_argv.count("--image-size") <= 1, test_argv
    job_id = race.submit_run(day, plan, options)
    outcome = dlokit.wait([job_id], timeout_s=300)[0]
    assert outcome.state == "COMPLETED", outcome
    assert load_run(job_id, day.runs).config["warmup_steps"] == 3  # half of the epoch's 6 steps


@pytest.mark.slurm
def test_slurm_race_job_checkpoints_requeues_and_resumes(workspace, slurm_cluster, tiny):
    day = race_day("racer", "local-slurm", tiny)
    job_id = race.submit_run(day, four_epoch_plan(day, tiny), ["--lr", "0.05"])
    wait_for_validation(dlokit.submission.jobs.find_card(job_id).run_dir / "rank0" / "metrics.jsonl", timeout=300)
    # what Slurm's --signal=USR2@120 sends before the time limit (and submitit's own test hook sends)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    outcome = dlokit.wait([job_id], poll_s=2, timeout_s=560)[0]
    card = dlokit.submission.jobs.find_card(job_id)
    log = card.log_path().read_text()
    assert outcome.state == "COMPLETED", f"{outcome}\n{log[-3000:]}\n{card.log_path(err=True).read_text()[-3000:]}"
    check_requeued_history(job_id, day.runs)
    assert "checkpointed on SIGUSR" in log and "resumed from" in log  # one log, appended across the requeue


def test_leaderboard_shows_each_option_once_with_the_value_that_ran():
    from dlokit.race.leaderboard import effective_options

    argv = ["--data", "/d", "--image-size", "64", "--batch-size", "16", "--pin-memory", "--lr", "-0.5",
            "--image-size", "48", "--batch-size", "32", "--optimizer=lamb"]
    assert effective_options(argv) == ["--data", "/d", "--image-size", "48", "--batch-size", "32", "--pin-memory",
                                       "--lr", "-0.5", "--optimizer=lamb"]
