"""CPU tests of tp_scripts/solutions/train_classifier.py on a tiny generated JPEG data set.

Every run is a real subprocess (python or torchrun), with one thread per process: the CI machines
have two cores, and oversubscribed OpenMP threads make CPU training tens of times slower.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlokit.runrecord import read_rank

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "tp_scripts" / "solutions"
SCRIPT = SOLUTIONS / "train_classifier.py"
PYTHON = sys.executable
TORCHRUN = str(Path(PYTHON).with_name("torchrun"))
REQUIRED_TPS = {"TP1.1", "TP1.2", "TP1.3", "TP1.4", "TP2.1", "TP2.2"}
SMALL = ["--model", "resnet18", "--image-size", "32", "--print-every", "1000"]

sys.path.insert(0, str(REPO / "data"))
sys.path.insert(0, str(SOLUTIONS))
import make_synthetic_imagenet  # noqa: E402


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


def train(runs: Path, run_id: str, *args, launcher=(PYTHON,), timeout=240, script=SCRIPT, check=True):
    cmd = [*launcher, str(script), "--runs-dir", str(runs), *SMALL, *map(str, args)]
    # A session of its own, so that a timeout also ends the workers torchrun started.
    with subprocess.Popen(cmd, cwd=REPO, env=env_for(run_id), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    done = subprocess.CompletedProcess(cmd, process.returncode, stdout, stderr)
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
    steps = step_lines(rec)
    assert len(steps) == 60 and all(s["t_step"] > 0 and "loss" in s for s in steps)
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

def refused(capsys, argv, world_size=1) -> str:
    from train_options import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args([*SMALL, *map(str, argv)], world_size=world_size, cuda_available=False)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


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


def test_bad_input_exits_2_without_traceback(tmp_path):
    env = {k: v for k, v in env_for("bad").items() if k != "DLOKIT_DATA"}
    done = subprocess.run([PYTHON, str(SCRIPT), "--model", "resnet18"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "no data set: pass --data" in done.stderr and "make_synthetic_imagenet.py" in done.stderr


# ---- student version: the same file with every SOLUTION block replaced by its STUDENT lines ----

def student_version(text: str) -> str:
    out, mode = [], None
    for line in text.splitlines():
        marker = line.strip()
        if marker.startswith("# >>> SOLUTION"):
            mode = "solution"
            out.append(line.replace(">>> SOLUTION", "TODO", 1))
        elif marker == "# --- STUDENT" and mode:
            mode = "student"
        elif marker == "# <<< SOLUTION" and mode:
            mode = None
        elif mode == "student":
            assert marker.startswith("# "), f"student line not commented with '# ': {line!r}"
            out.append(line.replace("# ", "", 1))
        elif mode != "solution":
            out.append(line)
    assert mode is None, "unclosed SOLUTION block"
    return "\n".join(out) + "\n"


def test_solution_markers_and_student_version_runs(tmp_path, tiny):
    text = SCRIPT.read_text()
    assert REQUIRED_TPS <= set(re.findall(r"# >>> SOLUTION (TP\d\.\d):", text))
    folder = tmp_path / "student"
    folder.mkdir()
    for sibling in SOLUTIONS.glob("*.py"):
        shutil.copy(sibling, folder / sibling.name)
    student = folder / "train_classifier.py"
    student.write_text(student_version(text))
    compile(student.read_text(), str(student), "exec")
    assert "# >>> SOLUTION" not in student.read_text() and "# --- STUDENT" not in student.read_text()

    # Every switch is still accepted; the records show that none of the optimisations ran.
    train(tmp_path, "student", "--data", tiny, "--batch-size", 8, "--test", "--test-nsteps", 3, "--amp", "bf16",
          "--channels-last", "--profile", "--num-workers", 1, "--pin-memory", script=student)
    observed = rank_record(tmp_path, "student")["run"]["observed"]
    assert observed["amp_dtype"] == "float32" and not observed["channels_last_input"]
    assert not observed["channels_last_weights"] and not observed["profiler"]
    assert not observed["record_function_labels"] and observed["loader_num_workers"] == 0
    assert observed["sampler"] == "RandomSampler"
    assert not (tmp_path / "student" / "profile").exists()
