"""A full disk while writing a run record or a checkpoint: the job fails naming the file, and what was
written before (run.json, the previous checkpoint) is still whole. ENOSPC is injected in-process, and, for a
training run, made by a real disk that fills up: a small tmpfs in a mount namespace of the run's own."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dlokit
from dlokit.in_job import runrecord
from dlokit.in_job.runrecord import RecordWriteError, RunRecorder, read_rank

REPO = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).parent / "job_scripts"


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_summary_on_a_full_disk_names_the_file_and_keeps_the_record(tmp_path, monkeypatch):
    record = RunRecorder({"lr": 0.1}, run_id="full", runs_dir=tmp_path)
    record.log("step", step=0, loss=1.0)
    monkeypatch.setattr(Path, "write_text", no_space)
    with pytest.raises(RecordWriteError, match=r"the disk is full while writing the run record .*full/rank0/"
                                               r"summary.json \(No space left on device\)") as raised:
        record.finish()
    assert raised.value.errno == errno.ENOSPC
    monkeypatch.undo()
    rank = read_rank(tmp_path / "full" / "rank0")
    assert rank["run"]["config"] == {"lr": 0.1} and rank["metrics"][0]["loss"] == 1.0
    assert rank["state"] == "running or killed"  # no summary: not reported as finished
    assert not list((tmp_path / "full" / "rank0").glob("*.tmp")), "no half-written temporary file is left"


def test_run_json_rewrite_on_a_full_disk_keeps_the_previous_version(tmp_path, monkeypatch):
    record = RunRecorder({"lr": 0.1}, run_id="amend", runs_dir=tmp_path)
    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(RecordWriteError, match=r"amend/rank0/run.json"):
        record.amend(observed={"batch": 32})
    monkeypatch.undo()
    assert json.loads((tmp_path / "amend" / "rank0" / "run.json").read_text())["config"] == {"lr": 0.1}
    record.finish()


def test_a_metrics_line_on_a_full_disk_names_the_file(tmp_path):
    record = RunRecorder({}, run_id="metrics", runs_dir=tmp_path)

    class FullFile:
        closed = False

        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        flush = close = lambda self: None

    real, record._metrics = record._metrics, FullFile()
    with pytest.raises(RecordWriteError, match=r"metrics/rank0/metrics.jsonl"):
        record.log("step", step=1)
    record._metrics = real
    record.finish()


def test_a_job_whose_disk_fills_up_fails_naming_the_record_file(workspace):
    dlokit.use_profile("local")
    [job_id] = dlokit.gpu_jobs_submitter(str(JOBS / "disk_full.py"), n_gpu=1, name="full", time_max="00:02:00")
    [outcome] = dlokit.wait(job_id, timeout_s=120)
    assert outcome.state == "FAILED", str(outcome)
    assert outcome.cause.startswith("the disk is full (No space left on device): ")
    assert f"runs/{job_id}/rank0/summary.json" in outcome.cause, outcome.cause


# ---- checkpoints (tp_scripts/common/checkpointing.py: temporary file, then rename) -------------------------

@pytest.fixture
def checkpointing():
    from tp_imports import common

    return common("checkpointing")


def _training_state():
    import torch

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return model, optimizer, scheduler, scaler


def _save(checkpointing, path, model, optimizer, scheduler, scaler, step):
    import torch

    checkpointing.save_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                  epoch=0, batch_in_epoch=step, step=step, world_size=1, batch_size=8,
                                  rng_states=checkpointing.gather_rng_states(torch.device("cpu")))


def _half_written_then_full(obj, file, *args, **kwargs):
    file.write(b"PK\x03\x04 half a checkpoint")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_checkpoint_on_a_full_disk_fails_and_the_previous_one_still_loads(tmp_path, monkeypatch, checkpointing):
    import torch

    path = tmp_path / "run" / "checkpoint.pt"
    model, optimizer, scheduler, scaler = _training_state()
    _save(checkpointing, path, model, optimizer, scheduler, scaler, step=1)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    monkeypatch.setattr(torch, "save", _half_written_then_full)
    with pytest.raises(OSError, match="No space left on device"):
        _save(checkpointing, path, model, optimizer, scheduler, scaler, step=2)
    monkeypatch.undo()
    fresh = _training_state()
    where = checkpointing.load_checkpoint(path, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2],
                                          scaler=fresh[3], device=torch.device("cpu"), rank=0, world_size=1,
                                          batch_size=8)
    assert where["step"] == 1
    assert all(torch.equal(fresh[0].state_dict()[k], v) for k, v in saved.items())


def test_a_checkpoint_on_a_full_disk_names_the_file_and_leaves_no_partial_file(tmp_path, monkeypatch, checkpointing):
    import torch

    path = tmp_path / "run" / "checkpoint.pt"
    model, optimizer, scheduler, scaler = _training_state()
    monkeypatch.setattr(torch, "save", _half_written_then_full)
    with pytest.raises(OSError) as raised:
        _save(checkpointing, path, model, optimizer, scheduler, scaler, step=1)
    assert str(raised.value) == (f"the checkpoint did not fit on the disk at {path}: No space left on device (no "
                                 "earlier checkpoint); free some space there, or give --checkpoint-path on a larger "
                                 "disk")
    assert raised.value.errno == errno.ENOSPC and not path.with_name("checkpoint.pt.tmp").exists()


# ---- a training run whose disk fills up at its second checkpoint ------------------------------------------------

DISK_MB = 19  # a checkpoint of mobilenet_v3_small (weights, SGD momentum: 12.4 MB) and the run record; not two


def run_on_a_small_disk(tmp_path: Path, data: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """train_classifier.py with its runs folder on a DISK_MB tmpfs, mounted in a user and mount namespace of its
    own (no root needed where user namespaces are allowed); what the run left there is copied out at the end."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    small, kept = tmp_path / "small-disk", tmp_path / "kept"
    small.mkdir()
    train = [sys.executable, str(REPO / "tp_scripts" / "solutions" / "train_classifier.py"), "--data", str(data),
             "--runs-dir", str(small), "--model", "mobilenet_v3_small", "--image-size", "32", "--batch-size", "4",
             "--test", "--test-nsteps", "3", "--checkpoint-steps", "1", "--print-every", "1000"]
    script = (f'mount -t tmpfs -o size={DISK_MB}m tmpfs "$1" || exit 97; small=$1 kept=$2; shift 2; "$@"; '
              'code=$?; cp -a "$small"/. "$kept"/; exit $code')
    kept.mkdir()
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(small),
                           str(kept), *train], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "DLOKIT_RUN_ID": "full"})
    if done.returncode == 97 or "unshare failed" in done.stderr:
        pytest.skip(f"no tmpfs can be mounted here: {done.stderr.strip()}")
    return done, kept / "full"


def test_a_checkpoint_that_does_not_fit_ends_the_run_naming_itself(tmp_path):
    sys.path.insert(0, str(REPO / "data"))
    import make_synthetic_imagenet

    data = tmp_path / "data"
    make_synthetic_imagenet.main(["--out", str(data), "--classes", "2", "--train-per-class", "6",
                                  "--val-per-class", "2", "--size", "36", "--quiet"])
    done, run = run_on_a_small_disk(tmp_path, data)
    path = run.parent.parent / "small-disk" / "full" / "checkpoint.pt"  # where the run saw it
    cause = (f"the checkpoint did not fit on the disk at {path}: No space left on device (the previous checkpoint "
             "is kept); free some space there, or give --checkpoint-path on a larger disk")
    assert done.returncode == 1 and done.stderr == f"train_classifier.py: rank 0: error: {cause}\n", done.stderr
    record = read_rank(run / "rank0")
    assert record["state"] == "failed" and record["summary"]["error"] == cause
    assert record["summary"]["failed_step"] == 2 and record["summary"]["steps"] == 2
    assert [m["step"] for m in record["metrics"] if m.get("event") == "checkpoint_saved"] == [1]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "rank0"], "no checkpoint.pt.tmp is left"
    import torch

    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 1  # the previous checkpoint, whole
