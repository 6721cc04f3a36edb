"""CPU tests of tp_scripts/solutions/train_classifier.py on a tiny generated JPEG data set.

Most runs are real subprocesses (python or torchrun), with one thread per process: the CI machines
have two cores, and oversubscribed OpenMP threads make CPU training tens of times slower. The timing
tests run the script in this process, with a fake GPU clock that counts synchronisations; no test
asserts anything about wall-clock durations.
"""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ranks import run_warm

from dlokit.checks.day2 import UNUSED_ERROR
from dlokit.in_job.measure import StepClock
from dlokit.in_job.runrecord import read_rank

REPO = Path(__file__).resolve().parents[1]
TP_SCRIPTS = REPO / "tp_scripts"
SOLUTIONS = TP_SCRIPTS / "solutions"
SCRIPT = SOLUTIONS / "train_classifier.py"
INJECT = REPO / "tests" / "job_scripts" / "inject.py"  # runs SCRIPT with a fault in it
STUDENT = TP_SCRIPTS / "train_classifier.py"
PYTHON = sys.executable
TORCHRUN = str(Path(PYTHON).with_name("torchrun"))
REQUIRED_TPS = {"TP1.1", "TP1.2", "TP1.3", "TP1.4", "TP2.1", "TP2.2", "TP2.4"}
SMALL = ["--model", "resnet18", "--image-size", "32", "--print-every", "1000"]
SPLITS = ("t_data", "t_h2d", "t_augment", "t_forward", "t_backward", "t_optimizer")

sys.path.insert(0, str(REPO / "data"))
import make_synthetic_imagenet  # noqa: E402
from tp_imports import common, load_script  # noqa: E402


def make_dataset(root: Path, classes: int, train: int, val: int, size: int = 40) -> Path:
    make_synthetic_imagenet.main(["--out", str(root), "--classes", str(classes), "--train-per-class", str(train),
                                  "--val-per-class", str(val), "--size", str(size), "--quiet"])
    return root


@pytest.fixture(scope="module")
def learnable(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "eight", classes=8, train=24, val=8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """4 classes x 12 images: 6 steps per epoch at batch 8."""
    return make_dataset(tmp_path_factory.mktemp("data") / "tiny", classes=4, train=12, val=2, size=36)


def env_for(run_id: str) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "DLOKIT_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}


def train(runs: Path, run_id: str, *args, launcher=(PYTHON,), timeout=240, script=SCRIPT, check=True, ranks=1):
    """One process (started warm), or what `launcher` starts, or `ranks` processes as srun starts them (each warm)."""
    cmd = [*launcher, str(script), "--runs-dir", str(runs), *SMALL, *map(str, args)]
    # in a session of its own: a timeout also ends the workers torchrun started
    done = run_warm(cmd, env_for(run_id), timeout, ranks=ranks, cwd=REPO)
    if check:
        assert done.returncode == 0, f"{cmd}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    return done


def rank_record(runs: Path, run_id: str, rank: int = 0) -> dict:
    return read_rank(runs / run_id / f"rank{rank}")


def step_lines(record: dict) -> list[dict]:
    return [m for m in record["metrics"] if m["kind"] == "step"]


def test_smoke_learns_above_chance(tmp_path, learnable):
    done = train(tmp_path, "smoke", "--data", learnable, "--batch-size", 16, "--epochs", 5, "--lr", 0.002)
    rec = rank_record(tmp_path, "smoke")
    summary, run = rec["summary"], rec["run"]
    assert rec["state"] == "completed" and not rec["truncated"]
    assert summary["val_acc"] >= 0.25, f"8 classes: chance is 0.125, got {summary['val_acc']}\n{done.stdout}"
    assert summary["steps"] == 5 * 12 and summary["epochs"] == 5
    for key in ("t_data", "t_h2d", "t_forward", "t_backward", "t_optimizer", "t_step", "throughput_train",
                "throughput_compute", "first_step_load_s", "host_rss_peak_mb"):
        assert summary[key] is not None and summary[key] >= 0, key
    assert summary["throughput_compute"] >= summary["throughput_train"]
    assert summary["gpu_mem_peak_mb"] is None and summary["energy_j"] is None  # CPU: null, no crash
    assert summary["energy_wh"] is None and summary["gpu_uuid"] is None and summary["gpu_hours"] is None
    steps = step_lines(rec)
    assert len(steps) == 60 and all(s["t_step"] > 0 and "loss" in s for s in steps)
    # the CPU path: every step split into its phases, t_step their sum, throughput from data + step
    assert summary["timing"] == "host_clock" and summary["timed_steps"] == summary["breakdown_steps"] == 58
    for s in steps:
        assert s["breakdown"] is True and "t_period" not in s and all(k in s for k in (*SPLITS, "t_metrics"))
        assert s["t_step"] == pytest.approx(sum(s[k] for k in (*SPLITS[1:], "t_metrics")), abs=1e-5)
        assert s["throughput_train"] == pytest.approx(s["batch_size"] / (s["t_data"] + s["t_step"]), rel=1e-3)
    assert [m["kind"] for m in rec["metrics"]].count("val") == 5
    observed = run["observed"]
    assert observed["amp_dtype"] == "float32" and observed["channels_last_input"] is False
    assert observed["ddp_wrapped"] is False and observed["ddp_world_size"] == 1
    assert run["config"]["num_classes"] == 8 and run["config"]["global_batch_size"] == 16
    assert done.stdout.count("epoch ") >= 5 and "Traceback" not in done.stderr


@pytest.mark.parametrize("option, expected", [
    (["--amp", "bf16", "--data", "synthetic", "--num-classes", "10"], {"amp_dtype": "bfloat16", "grad_scaler": False}),
    (["--channels-last"], {"channels_last_input": True, "channels_last_weights": True, "amp_dtype": "float32"}),
])
def test_amp_bf16_and_channels_last(tmp_path, tiny, option, expected):
    args = ["--data", tiny, *option] if "--data" not in option else option
    train(tmp_path, "opt", *args, "--batch-size", 8, "--test", "--test-nsteps", 3, "--synthetic-steps", 3)
    rec = rank_record(tmp_path, "opt")
    assert {k: rec["run"]["observed"][k] for k in expected} == expected
    assert rec["summary"]["steps"] == 3 and rec["summary"]["observed"] == rec["run"]["observed"]


def test_ddp_two_processes_torchrun(tmp_path, tiny):
    done = train(tmp_path, "ddp", "--data", tiny, "--batch-size", 4, "--epochs", 1, "--metric-step", 2,
                 "--bucket-cap-mb", 1, "--static-graph", "--gradient-as-bucket-view",
                 launcher=(TORCHRUN, "--standalone", "--nproc_per_node=2"), timeout=120)
    recs = [rank_record(tmp_path, "ddp", r) for r in (0, 1)]
    for rec in recs:
        summary = rec["summary"]
        assert summary["status"] == "completed" and summary["params_identical_across_ranks"] is True
        observed = summary["observed"]
        assert observed["ddp_wrapped"] and observed["ddp_world_size"] == 2
        assert observed["sampler"] == "DistributedSampler" and observed["samples_per_rank_per_epoch"] == 24
        assert rec["run"]["world_size"] == 2 and rec["run"]["config"]["global_batch_size"] == 8
        assert all(s["batch_size"] == 8 for s in step_lines(rec))
        assert [("loss" in s) for s in step_lines(rec)] == [False, True] * 3  # --metric-step 2
        assert (observed["ddp_bucket_cap_mb"], observed["ddp_static_graph"], observed["ddp_gradient_as_bucket_view"],
                observed["ddp_find_unused_parameters"]) == (1.0, True, True, False)
    assert recs[0]["summary"]["param_checksum"] == recs[1]["summary"]["param_checksum"]
    assert done.stdout.count("records in") == 1  # rank 0 alone prints


def test_kill_then_resume_continues_the_same_trajectory(tmp_path, tiny):
    common = ["--data", tiny, "--batch-size", 8, "--epochs", 2, "--lr", 0.01, "--checkpoint-steps", 4]
    train(tmp_path, "full", *common)  # 12 steps, uninterrupted
    reference = {s["step"]: s["loss"] for s in step_lines(rank_record(tmp_path, "full"))}

    cmd = [PYTHON, str(SCRIPT), "--runs-dir", str(tmp_path), *SMALL, *map(str, common)]
    victim = subprocess.Popen(cmd, cwd=REPO, env=env_for("killed"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    metrics = tmp_path / "killed" / "rank0" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and victim.poll() is None:
        if metrics.exists() and '"checkpoint_saved"' in metrics.read_text():
            victim.send_signal(signal.SIGKILL)  # no clean-up, no summary: like a node failure or a time limit
            break
        time.sleep(0.02)
    assert victim.wait(timeout=30) == -signal.SIGKILL, "the run ended before it could be killed"

    killed = rank_record(tmp_path, "killed")
    assert killed["state"] == "running or killed" and killed["summary"] is None
    assert killed["run"]["run_id"] == "killed" and step_lines(killed)  # every complete line parses
    checkpoint = tmp_path / "killed" / "checkpoint.pt"
    assert checkpoint.is_file() and not checkpoint.with_name("checkpoint.pt.tmp").exists()

    train(tmp_path, "resumed", *common, "--resume", tmp_path / "killed")
    resumed = rank_record(tmp_path, "resumed")
    event = next(m for m in resumed["metrics"] if m.get("event") == "resumed")
    steps = step_lines(resumed)
    assert event["step"] in (4, 8) and steps[0]["step"] == event["step"] + 1 and steps[-1]["step"] == 12
    for line in steps:  # same batches, same augmentations, same weights: same losses
        assert line["loss"] == pytest.approx(reference[line["step"]], rel=1e-4, abs=1e-5), line["step"]
    assert resumed["summary"]["resumed_from_step"] == event["step"]
    # the epoch lines cover the whole epoch, its batches before the checkpoint too (the checkpoint keeps their sums)
    epochs = {m["epoch"]: m for m in rank_record(tmp_path, "full")["metrics"] if m.get("kind") == "epoch"}
    for line in (m for m in resumed["metrics"] if m.get("kind") == "epoch"):
        for key in ("train_loss", "train_acc"):
            assert line[key] == pytest.approx(epochs[line["epoch"]][key], rel=1e-4, abs=1e-5), (line["epoch"], key)


def test_profiler_writes_one_trace_per_rank(tmp_path, tiny):
    train(tmp_path, "prof", "--data", tiny, "--batch-size", 8, "--test", "--test-nsteps", 5, "--profile",
          "--profile-wait", 1, "--profile-warmup", 1, "--profile-active", 2)
    traces = list((tmp_path / "prof" / "profile").glob("rank0.*.json"))
    assert len(traces) == 1
    names = {e.get("name") for e in json.loads(traces[0].read_text())["traceEvents"]}
    assert {"data", "forward", "backward", "optimizer"} <= names
    rec = rank_record(tmp_path, "prof")
    assert next(m for m in rec["metrics"] if m.get("event") == "profiler_trace")["files"] == [str(traces[0])]
    assert rec["run"]["observed"]["profiler"] and rec["run"]["observed"]["record_function_labels"]


# ---- bad input: a short message and exit code 2, checked in-process (one torch import for all) ----

def test_blocks_skipped_for_a_batch_stop_ddp_unless_it_finds_the_unused_parameters(tmp_path, tiny):
    """--layer-drop: PyTorch's own reducer error on 2 ranks without the flag, a completed training with it."""
    common = ["--data", tiny, "--batch-size", 4, "--test", "--test-nsteps", 4, "--layer-drop", 0.5]
    done = train(tmp_path, "nounused", *common, ranks=2, timeout=120, check=False)
    assert done.returncode != 0
    summary = rank_record(tmp_path, "nounused")["summary"]
    assert summary["status"] == "failed" and UNUSED_ERROR in summary["error"]
    train(tmp_path, "unused", *common, "--find-unused-parameters", ranks=2, timeout=120)
    for rank in (0, 1):
        summary = rank_record(tmp_path, "unused", rank)["summary"]
        assert summary["status"] == "completed" and summary["observed"]["ddp_find_unused_parameters"] is True
        assert summary["layer_drop_skipped"] > 0 and summary["layer_drop_blocks"] == 5  # resnet18's shape-keeping
        assert summary["params_identical_across_ranks"] is True


def refused(capsys, argv, world_size=1) -> str:
    parse_args = common("train_options").parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args([*SMALL, *map(str, argv)], world_size=world_size, cuda_available=False)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_augment_randaugment_in_workers_and_mixup_on_the_device(tmp_path, tiny):
    train(tmp_path, "aug", "--data", tiny, "--batch-size", 8, "--test", "--test-nsteps", 3,
          "--augment", "mixup,randaugment", "--num-workers", 1)
    rec = rank_record(tmp_path, "aug")
    observed = rec["run"]["observed"]
    assert rec["run"]["config"]["augment"] == "randaugment,mixup"  # canonical order
    assert observed["augment"] == ["randaugment", "mixup"]
    assert observed["augment_on_device"] is True and observed["randaugment_in_workers"] is True
    assert all(s["t_augment"] >= 0 and s["t_data"] >= 0 for s in step_lines(rec))
    assert rec["summary"]["t_augment"] is not None


def test_bad_inputs_are_refused_clearly(capsys, tmp_path, tiny):
    assert "did you mean: resnet50" in refused(capsys, ["--data", tiny, "--model", "resnet05"])
    assert "not divisible by the 3 processes" in refused(capsys, ["--data", tiny, "--global-batch-size", 16], 3)
    assert "too small" in refused(capsys, ["--data", tiny, "--image-size", 16])
    assert "cannot take 40 px" in refused(capsys, ["--data", tiny, "--model", "inception_v3", "--image-size", 40])
    assert "use --amp bf16" in refused(capsys, ["--data", tiny, "--amp", "fp16"])
    assert f"{tmp_path / 'nowhere'} does not exist" in refused(capsys, ["--data", tmp_path / "nowhere"])
    (tmp_path / "flat").mkdir()
    assert "has no train/ folder" in refused(capsys, ["--data", tmp_path / "flat"])
    (tmp_path / "empty" / "train" / "cats").mkdir(parents=True)
    assert "no images found" in refused(capsys, ["--data", tmp_path / "empty"])
    assert "--sync-bn needs GPUs" in refused(capsys, ["--data", tiny, "--sync-bn"])
    assert "at least 2" in refused(capsys, ["--data", tiny, "--batch-size", 1])
    assert "unknown blur" in refused(capsys, ["--data", tiny, "--augment", "mixup,blur"])
    assert "cannot be combined" in refused(capsys, ["--data", tiny, "--augment", "none,mixup"])
    assert "needs image files" in refused(capsys, ["--data", "synthetic", "--augment", "randaugment"])
    assert "--bucket-cap-mb must be positive" in refused(capsys, ["--data", tiny, "--bucket-cap-mb", 0])
    assert "a probability, at least 0 and below 1" in refused(capsys, ["--data", tiny, "--layer-drop", 1])
    assert "vgg11 is not a ResNet" in refused(capsys, ["--data", tiny, "--model", "vgg11", "--layer-drop", 0.5])


NO_DATA = ("no data set: pass --data PATH (an ImageNet-layout folder), --data synthetic, or make one with: "
           "python data/make_synthetic_imagenet.py --out data/generated/tiny")


def test_bad_input_exits_2_without_traceback(tmp_path):
    env = {k: v for k, v in env_for("bad").items() if k != "DLOKIT_DATA"}
    done = subprocess.run([PYTHON, str(SCRIPT), "--model", "resnet18", "--test"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    # one line that says how to make a data set, not buried under the usage text
    assert done.stderr.strip().splitlines() == [f"train_classifier.py: error: {NO_DATA}"]


def test_a_folder_without_train_says_how_to_make_one(capsys, tmp_path):
    (tmp_path / "flat").mkdir()
    for folder in (tmp_path / "flat", tmp_path / "nowhere"):
        err = refused(capsys, ["--data", folder, "--test"])
        assert len(err.strip().splitlines()) == 1 and "usage:" not in err, err
        assert f"make one with: python data/make_synthetic_imagenet.py --out {folder}" in err
        assert "--data synthetic" in err


# ---- ending early: an OOM on one rank ends every rank; a cancelled job says so ---------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_oom_on_one_rank_ends_every_rank_and_is_recorded(tmp_path):
    """Two gloo ranks started like srun tasks (no torchrun to kill the survivor): rank 1 runs out of memory
    at step 3 (tests/job_scripts/inject.py); rank 0, waiting in its next all-reduce, must end by itself, promptly."""
    port, processes = free_port(), []
    for rank in (0, 1):
        env = {**env_for("oom"), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        cmd = [PYTHON, str(INJECT), "oom", "1:3", str(SCRIPT), "--runs-dir", str(tmp_path), *SMALL, "--data", "synthetic", "--num-classes", 4,
               "--batch-size", 4, "--test", "--test-nsteps", 8, "--synthetic-steps", 8]
        processes.append(subprocess.Popen([*map(str, cmd)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=120))  # NCCL's timeout would be minutes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    codes = [p.returncode for p in processes]
    assert codes == [4, 3], (codes, outputs)  # rank 0 stopped because of rank 1 (jobenv.EXIT_PEER_FAILED); rank 1: out of memory
    oom, stopped = rank_record(tmp_path, "oom", 1), rank_record(tmp_path, "oom", 0)
    summary = oom["summary"]
    assert summary["status"] == "failed" and summary["oom"] is True and summary["batch_size"] == 4
    assert "OutOfMemoryError: out of memory at step 3" in summary["error"]
    assert "gpu_mem_peak_mb" in summary and summary["host_rss_peak_mb"] > 0 and summary["steps"] == 2
    assert any(m.get("event") == "oom" and m["batch_size"] == 4 for m in oom["metrics"])
    assert stopped["summary"]["status"] == "failed" and stopped["summary"]["stopped_by_rank"] == 1
    assert "rank 1 ran out of memory at step 3" in stopped["summary"]["error"]
    assert "rank 1: OutOfMemoryError" in outputs[1][1] and "Traceback" not in outputs[0][1] + outputs[1][1]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cancelled_run_is_recorded_as_cancelled(tmp_path, signum):
    cmd = [PYTHON, str(SCRIPT), "--runs-dir", str(tmp_path), *SMALL, "--data", "synthetic", "--num-classes", 4,
           "--batch-size", 4, "--test", "--test-nsteps", 100000, "--synthetic-steps", 100000]
    process = subprocess.Popen([*map(str, cmd)], cwd=REPO, env=env_for("cancel"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "cancel" / "rank0" / "metrics.jsonl"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and process.poll() is None:
            if metrics.exists() and metrics.read_text().count('"kind": "step"') >= 2:
                process.send_signal(signum)  # scancel / torchrun (SIGTERM), Ctrl-C (SIGINT)
                break
            time.sleep(0.05)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signum, stderr[-2000:]
    record = rank_record(tmp_path, "cancel")
    summary = record["summary"]
    assert record["state"] == summary["status"] == "cancelled" and summary["signal"] == signum.name
    assert summary["steps"] >= 2 and "Traceback" not in stderr
    assert record["metrics"][-1]["event"] == "cancelled"


SIGNALLED_TWICE = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from common import instrument

class Run:  # what the handler calls; a second SIGTERM comes while the first cancel is being recorded
    device = "cpu"

    def cancel(self, signum):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        open("recorded", "w").write(signal.Signals(signum).name)

instrument.install_cancel_handlers(Run())
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(10)
"""


def test_a_second_sigterm_does_not_cut_the_record_of_the_first(tmp_path):
    """Under Slurm a cancelled script gets SIGTERM from slurmstepd and again from the kit's task, which forwards
    it: the second must not end the process while the first is writing the summary (CI: 'cancelled' event
    logged, no summary.json)."""
    result = subprocess.run([PYTHON, "-c", SIGNALLED_TWICE, str(REPO / "tp_scripts")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]
    assert (tmp_path / "recorded").read_text() == "SIGTERM"


# ---- timing: the CPU/GPU overlap is kept (a fake GPU clock counts the synchronisations) ----------

class FakeEvent:
    """A CUDA event as StepClock uses it, on the host clock; the fake GPU has always finished."""

    def record(self):
        self.at = time.perf_counter()

    def query(self):
        return True

    def elapsed_time(self, end):
        return (end.at - self.at) * 1000


def in_process(monkeypatch, tmp_path, run_id, argv, fake_gpu: bool):
    """Run main() of the solution in this process; returns (rank-0 record, host waits per step).

    Waits are the clock's synchronisations, plus (fake_gpu) every .tolist()/.item() read of a tensor
    after the batch arrived: on a GPU each would make the host wait for the device.
    """
    import torch

    instrument = common("instrument")

    waits = collections.Counter()
    clocks = []

    class CountingClock(StepClock):
        def __init__(self, device, **options):
            extra = dict(overlap=True, event=FakeEvent) if fake_gpu else {}
            super().__init__(device, sync=self.count, **options, **extra)
            clocks.append(self)

        def count(self):
            waits[self.current.step if self.current else None] += 1

    def host_read(method):
        def read(tensor, *args):
            current = clocks[0].current if clocks else None
            if fake_gpu and current is not None and "data" in current.splits:  # not the loader's own reads
                waits[current.step] += 1
            return method(tensor, *args)
        return read

    monkeypatch.setattr(instrument, "StepClock", CountingClock)
    monkeypatch.setattr(torch.Tensor, "tolist", host_read(torch.Tensor.tolist))
    monkeypatch.setattr(torch.Tensor, "item", host_read(torch.Tensor.item))
    monkeypatch.setenv("DLOKIT_RUN_ID", run_id)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    torch.set_num_threads(1)
    module = load_script(SCRIPT, f"train_classifier_{run_id}")
    assert module.main(["--runs-dir", str(tmp_path), *SMALL, "--device", "cpu", *map(str, argv)]) == 0
    return rank_record(tmp_path, run_id), waits


def test_gpu_steps_outside_breakdowns_wait_at_most_once(monkeypatch, tmp_path, tiny):
    record, waits = in_process(monkeypatch, tmp_path, "fakegpu", ["--data", tiny, "--batch-size", 4, "--test",
                                                                   "--test-nsteps", 9, "--breakdown-every", 4,
                                                                   "--augment", "cutmix"], fake_gpu=True)
    steps = step_lines(record)
    assert [s["step"] for s in steps] == list(range(1, 10))
    breakdowns = [s["step"] for s in steps if s["breakdown"]]
    assert breakdowns == [3, 4, 8]  # the first timed step (after 2 warm-up steps), then every 4th
    for s in steps:
        if s["breakdown"]:  # a wait before the step and one at each phase boundary: a true split
            assert waits[s["step"]] >= 6 and all(k in s for k in (*SPLITS, "t_metrics")), s
        else:  # whole-step timing: the only wait is the metrics read (--metric-step 1)
            assert waits[s["step"]] <= 1, (s["step"], waits)
            assert "t_h2d" not in s and "t_forward" not in s and s["t_data"] >= 0 and s["t_step"] >= 0
            assert s["throughput_train"] > 0 and s["throughput_compute"] >= s["throughput_train"] * (1 - 1e-6)
    assert all("t_period" in s for s in steps[1:])  # the pace: end of a step to the end of the next
    summary = record["summary"]
    assert summary["timing"] == "cuda_events" and summary["breakdown_every"] == 4
    # timed: steps 3-9; split means from the breakdown steps 3, 4, 8; whole-step means from 6, 7
    # (5 and 9 follow a breakdown step, which ended synchronised: their pace lost the overlap)
    assert summary["breakdown_steps"] == 3 and summary["timed_steps"] == 2
    assert all(summary[k] is not None for k in ("t_h2d", "t_augment", "t_forward", "t_step", "t_period",
                                                "throughput_train", "throughput_compute"))


def test_gpu_steps_with_sparse_metrics_do_not_wait(monkeypatch, tmp_path, tiny):
    record, waits = in_process(monkeypatch, tmp_path, "sparse", ["--data", tiny, "--batch-size", 4, "--test",
                                                                  "--test-nsteps", 8, "--breakdown-every", 100,
                                                                  "--metric-step", 4], fake_gpu=True)
    steps = {s["step"]: s for s in step_lines(record)}
    assert [n for n, s in steps.items() if s["breakdown"]] == [3]
    assert {n: waits[n] for n in steps if n != 3} == {1: 0, 2: 0, 4: 1, 5: 0, 6: 0, 7: 0, 8: 1}
    assert "loss" in steps[4] and "loss" in steps[8] and "loss" not in steps[5]


def test_cpu_steps_are_all_split_and_never_synchronise(monkeypatch, tmp_path, tiny):
    record, waits = in_process(monkeypatch, tmp_path, "cpuclock", ["--data", tiny, "--batch-size", 4, "--test",
                                                                    "--test-nsteps", 5], fake_gpu=False)
    assert sum(waits.values()) == 0
    steps = step_lines(record)
    assert len(steps) == 5 and all(s["breakdown"] and all(k in s for k in SPLITS) for s in steps)
    assert record["summary"]["timing"] == "host_clock" and record["summary"]["timed_steps"] == 3


def test_step_clock_reads_events_late_and_waits_once_to_drain():
    """The GPU is behind: lines come out when their end event has passed, drain() waits once for all."""
    finished = {"upto": 0}
    syncs = []

    class SlowEvent(FakeEvent):
        count = 0

        def record(self):
            super().record()
            SlowEvent.count += 1
            self.index = SlowEvent.count

        def query(self):
            return self.index <= finished["upto"]

    def sync():
        syncs.append(1)
        finished["upto"] = SlowEvent.count

    clock = StepClock("cuda", breakdown_every=1000, overlap=True, sync=sync, event=SlowEvent)
    for step in (1, 2, 3):
        clock.start(step)
        clock.split("data")
        clock.split("forward")  # not a breakdown step: ignored, no wait
        clock.stop({"n": step})
    assert list(clock.ready()) == [] and syncs == []
    finished["upto"] = 2  # the GPU passed step 1's end event (events 1, 2)
    assert [t.step for t in clock.ready()] == [1]
    done = list(clock.drain())
    assert [t.step for t in done] == [2, 3] and syncs == [1]
    assert all(t.splits.keys() == {"data"} and t.t_step >= 0 for t in done)
    assert done[0].t_period is not None and done[1].t_period is not None



def test_a_clock_that_splits_every_step_synchronises_at_each_phase_and_hands_the_step_back():
    """train_llm.py's clock (breakdown_every=1): on a GPU every step waits for the device before it starts and at
    each phase boundary (not for the batch), and finished() gives the step just stopped, its time the sum of its
    phases."""
    syncs = []
    clock = StepClock("cuda", breakdown_every=1, overlap=True, sync=lambda: syncs.append(1), event=FakeEvent)
    for step in (0, 1):
        clock.start(step)
        clock.split("data")
        clock.split("forward")
        clock.split("backward")
        clock.stop()
        timing = clock.finished()
        assert timing.step == step and timing.breakdown and set(timing.splits) == {"data", "forward", "backward"}
        assert timing.t_step == timing.splits["forward"] + timing.splits["backward"]
    assert len(syncs) == 2 * 3  # start, forward, backward: each step


def test_on_the_cpu_the_every_step_clock_is_the_host_clock():
    clock = StepClock("cpu", breakdown_every=1)
    clock.start(0)
    clock.split("data")
    time.sleep(0.01)
    clock.split("optimizer")
    clock.stop()
    timing = clock.finished()
    assert not clock.overlap and timing.t_period is None
    assert timing.t_step == timing.splits["optimizer"] >= 0.01

# ---- student version: the generated file, with every SOLUTION block replaced by its STUDENT lines ----

def test_solution_markers_and_student_version_runs(tmp_path, tiny):
    text = SCRIPT.read_text()
    assert REQUIRED_TPS <= set(re.findall(r"# >>> SOLUTION (TP\d\.\d):", text))
    student = STUDENT.read_text()
    assert "# >>> SOLUTION" not in student and "# --- STUDENT" not in student
    assert REQUIRED_TPS <= set(re.findall(r"# TODO (TP\d\.\d):", student))
    head = student[:student.index('"""')]
    assert "YOUR COPY" in head and "file you edit" in head and "tp_scripts/solutions/train_classifier.py" in head
    assert "notebooks/day1_single_gpu.ipynb" in head and "notebooks/day2_data_and_ddp.ipynb" in head

    # Every switch is still accepted; the records show that none of the optimisations ran.
    train(tmp_path, "student", "--data", tiny, "--batch-size", 8, "--test", "--test-nsteps", 3, "--amp", "bf16",
          "--channels-last", "--profile", "--num-workers", 1, "--pin-memory", "--augment", "mixup",
          script=STUDENT)
    observed = rank_record(tmp_path, "student")["run"]["observed"]
    assert observed["amp_dtype"] == "float32" and not observed["channels_last_input"]
    assert not observed["channels_last_weights"] and not observed["profiler"]
    assert not observed["record_function_labels"] and observed["loader_num_workers"] == 0
    assert observed["sampler"] == "RandomSampler"
    assert observed["augment_on_device"] is False and observed["augment"] == []
    assert not (tmp_path / "student" / "profile").exists()
