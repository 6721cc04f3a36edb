"""Day 4, after TP4.8: Accelerate's config for each ZeRO stage run, and why it is not run here (issue 51 item 4)."""
import importlib.metadata
import json

import pytest

import dlokit
from dlokit import checks
from dlokit.in_job.runrecord import RunRecorder


def _installed() -> bool:
    try:
        return bool(importlib.metadata.version("accelerate"))
    except importlib.metadata.PackageNotFoundError:
        return False


def deepspeed_run(runs, run_id, stage, dtype="bf16", ranks=2, status="completed"):
    """A record as train_deepspeed.py writes one (its config's stage and dtype), on every rank."""
    config = {"zero_stage": stage, "dtype": dtype, "ds_config": {"zero_optimization": {"stage": stage}}}
    for rank in range(ranks):
        RunRecorder(config, rank=rank, world_size=ranks, run_id=run_id, runs_dir=runs).finish(status)
    return run_id


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(tmp_path))
    dlokit.use_profile("local")
    return tmp_path


def test_each_stage_gets_accelerates_config_and_a_cpu_says_why_it_would_not_shard(runs):
    ids = {stage: deepspeed_run(runs, f"zero{stage}", stage) for stage in (1, 3)}
    result = checks.accelerate_zero(ids)
    assert result.status == checks.NOT_APPLICABLE and result.message.startswith(checks.NOT_APPLICABLE_PREFIX)
    assert "runs plain DDP: its DeepSpeed and FSDP plugins shard only on GPUs" in result.message
    assert ("accelerate is not installed" in result.message) is not _installed()
    for stage in (1, 3):
        path = runs / f"zero{stage}" / "accelerate_config.json"
        config = json.loads(path.read_text())
        assert config["distributed_type"] == "DEEPSPEED" and config["deepspeed_config"]["zero_stage"] == stage
        assert config["num_processes"] == 2 and config["mixed_precision"] == "bf16" and not config["use_cpu"]
        assert config["deepspeed_config"]["zero3_init_flag"] is (stage == 3)
        assert any(f"accelerate launch --config_file {path}" in line for line in result.details)


def test_on_gpus_it_says_what_is_missing_and_never_writes_through_a_link(runs):
    run_id = deepspeed_run(runs, "gpu-zero2", 2, dtype="fp32")
    header = runs / run_id / "rank0" / "run.json"
    record = json.loads(header.read_text())
    record["hardware"] = {**(record.get("hardware") or {}), "gpu_count": 2}
    header.write_text(json.dumps(record))
    elsewhere = runs / "not-yours.txt"
    elsewhere.write_text("keep")
    (runs / run_id / "accelerate_config.json").symlink_to(elsewhere)
    result = checks.accelerate_zero([run_id])
    assert result.status == checks.NOT_APPLICABLE
    assert ("Accelerate would shard on these GPUs, but accelerate is not installed here" in result.message) is not _installed()
    written = runs / run_id / "accelerate_config.json"
    assert elsewhere.read_text() == "keep" and written.is_file() and not written.is_symlink()
    assert json.loads(written.read_text())["mixed_precision"] == "no"


def test_a_failed_deepspeed_run_is_named_not_configured(runs):
    deepspeed_run(runs, "broken", 2, status="failed")
    result = checks.accelerate_zero(["broken"])
    assert result.status == checks.FAILED and "broken" in result.message
    assert not (runs / "broken" / "accelerate_config.json").exists()
