"""Bad input gets a clear error before anything is written or submitted."""
from __future__ import annotations

from pathlib import Path

import pytest

import dlokit
from dlokit import JobSpecError, ProfileError

HELLO = str(Path(__file__).parent / "job_scripts" / "allreduce.py")


@pytest.fixture
def slurm4(workspace):
    """A Slurm profile with 4 GPUs per node; nothing is submitted in these tests."""
    return dlokit.use_profile("local-slurm")


def nothing_written(workspace: Path) -> bool:
    return not (workspace / "jobs").exists()


@pytest.mark.parametrize("n_gpu", [0, -2, 1.5, "2", True])
def test_gpu_count_must_be_a_positive_integer(slurm4, workspace, n_gpu):
    with pytest.raises(JobSpecError, match="n_gpu"):
        dlokit.gpu_jobs_submitter(HELLO, n_gpu=n_gpu, name="bad")
    assert nothing_written(workspace)


def test_gpu_count_must_fill_whole_nodes(slurm4, workspace):
    with pytest.raises(JobSpecError, match=r"6 GPUs do not fill whole nodes of 4 GPUs.*ask for 4 or 8"):
        dlokit.gpu_jobs_submitter(HELLO, n_gpu=6, name="bad")
    assert nothing_written(workspace)


def test_one_bad_job_in_a_list_stops_them_all(slurm4, workspace):
    with pytest.raises(JobSpecError):
        dlokit.gpu_jobs_submitter(HELLO, n_gpu=[1, 2, 3, 5], name="bad")
    assert nothing_written(workspace)


def test_local_backend_refuses_more_than_the_machine(workspace):
    dlokit.use_profile("local")
    with pytest.raises(JobSpecError, match="use a Slurm profile"):
        dlokit.gpu_jobs_submitter(HELLO, n_gpu=999, name="bad")
    assert nothing_written(workspace)


@pytest.mark.parametrize("time_max", ["1h", "25:00", "00:61:00", "00:00:00", "-1", "10:00:00:00", "", -5, "1-2"])
def test_malformed_time_limits(slurm4, workspace, time_max):
    with pytest.raises(JobSpecError, match="time_max"):
        dlokit.gpu_jobs_submitter(HELLO, name="bad", time_max=time_max)
    assert nothing_written(workspace)


@pytest.mark.parametrize("time_max,seconds", [("00:30:00", 1800), ("1-00:00:00", 86400), (20, 1200), ("2:05:09", 7509)])
def test_good_time_limits(time_max, seconds):
    assert dlokit.jobspec.parse_time(time_max) == seconds


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ProfileError, match=r"unknown profile 'nope'.*jean-zay.*local"):
        dlokit.use_profile("nope")


def test_profile_that_needs_an_account_says_how_to_give_it():
    with pytest.raises(ProfileError, match=r"needs account.*use_profile\('jean-zay', account="):
        dlokit.use_profile("jean-zay")
    assert dlokit.use_profile("jean-zay", account="abc@a100").account == "abc@a100"


def test_unknown_profile_setting(workspace, monkeypatch):
    (workspace / "extra.toml").write_text('[mine]\nextends = "slurm"\ngpu_per_node = 8\n')
    monkeypatch.setenv("DLOKIT_PROFILES", str(workspace / "extra.toml"))
    with pytest.raises(ProfileError, match="unknown setting.*gpu_per_node"):
        dlokit.use_profile("mine")


@pytest.mark.parametrize("name", ["my job", "a;b", "$(id)", "`id`", "x\ny", "../escape", "..", "", "-x", "a/b",
                                  "it's", "n" * 65])
def test_job_names_that_are_not_safe_file_names(slurm4, workspace, name):
    with pytest.raises(JobSpecError, match="job name"):
        dlokit.gpu_jobs_submitter(HELLO, name=name)
    assert nothing_written(workspace)


def test_missing_script(workspace):
    dlokit.use_profile("local")
    with pytest.raises(JobSpecError, match=r"script 'no_such_script.py' not found"):
        dlokit.gpu_jobs_submitter("no_such_script.py --test", name="bad")
    assert nothing_written(workspace)


def test_command_must_be_a_python_script(workspace):
    dlokit.use_profile("local")
    with pytest.raises(JobSpecError, match="not a Python script"):
        dlokit.gpu_jobs_submitter("rm -rf /", name="bad")


def test_unbalanced_quotes(workspace):
    dlokit.use_profile("local")
    with pytest.raises(JobSpecError, match="cannot split"):
        dlokit.gpu_jobs_submitter(f"{HELLO} 'oops", name="bad")


def test_module_names_are_checked(slurm4, workspace):
    with pytest.raises(JobSpecError, match="module"):
        dlokit.gpu_jobs_submitter(HELLO, name="bad", module="pytorch; rm -rf ~")
    assert nothing_written(workspace)


def test_gpus_per_task_must_divide_the_node(slurm4, workspace):
    with pytest.raises(JobSpecError, match="n_gpu_per_task"):
        dlokit.gpu_jobs_submitter(HELLO, name="bad", n_gpu=3, n_gpu_per_task=2)


def test_profile_sbatch_options_reach_the_script_but_line_breaks_do_not(workspace, monkeypatch):
    (workspace / "course.toml").write_text('[course]\nextends = "local-slurm"\nsbatch = { reservation = "dlo" }\n'
                                           '[evil]\nextends = "local-slurm"\nsbatch = { reservation = "x\\nrm -rf ~" }\n')
    monkeypatch.setenv("DLOKIT_PROFILES", str(workspace / "course.toml"))
    spec = dlokit.JobSpec(script=HELLO, name="ok")
    assert "#SBATCH --reservation=dlo" in dlokit.sbatch_preview(spec, dlokit.use_profile("course"))
    with pytest.raises(JobSpecError, match="line break"):
        dlokit.sbatch_preview(spec, dlokit.use_profile("evil"))
