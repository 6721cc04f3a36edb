"""A cell's `module` on profiles with and without environment modules (cells from the original course run unchanged)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import dlokit
from dlokit.submission.jobspec import JobSpec, sbatch_preview, setup_lines

SCRIPT = str(Path(__file__).parent / "job_scripts" / "allreduce.py")


def test_cell_module_replaces_the_profiles_pytorch_module(workspace):
    profile = dlokit.get_profile("jean-zay", account="abc@a100")
    spec = JobSpec.from_command(SCRIPT, name="alice", module="pytorch-gpu/py3/2.7.0")
    lines, notice = setup_lines(spec, profile)
    assert lines == ["module purge", "module load arch/a100", "module load pytorch-gpu/py3/2.7.0"] and not notice
    script = sbatch_preview(spec, profile)
    assert "pytorch-gpu/py3/2.6.0" not in script and script.count("module load pytorch-gpu") == 1


def test_cell_module_is_left_out_with_a_notice_where_there_are_no_modules(workspace):
    profile = dlokit.get_profile("local-slurm")
    lines, notice = setup_lines(JobSpec.from_command(SCRIPT, module="pytorch-gpu/py3/2.6.0"), profile)
    assert lines == [] and "left out" in notice and "local-slurm" in notice


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs sbatch on PATH (scripts/setup.sh --with-slurm)")
def test_a_profile_that_loads_modules_is_refused_at_submission_where_none_exist(workspace, monkeypatch):
    for key in ("MODULESHOME", "LMOD_CMD", "MODULEPATH"):
        monkeypatch.delenv(key, raising=False)
    dlokit.use_profile("jean-zay", account="abc@a100")
    with pytest.raises(dlokit.JobSpecError, match="module: command not found"):
        dlokit.gpu_jobs_submitter(SCRIPT, n_gpu=1, name="alice")
    assert not (Path(dlokit.current_profile().logs) / "alice").exists(), "nothing is written for a refused job"
