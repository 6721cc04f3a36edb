"""Bad input gets a clear error before anything is written or submitted."""
from __future__ import annotations

from pathlib import Path

import pytest

import dlokit
from dlokit import JobSpecError, ProfileError
from dlokit.submission.submit import submit

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


def test_gpu_count_must_fill_whole_nodes(slurm4, workspace, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(workspace / "no-cluster.conf"))  # no cluster to ask: both offers
    with pytest.raises(JobSpecError, match=r"6 GPUs do not fill whole nodes of 4 GPUs.*ask for 4 or 8"):
        dlokit.gpu_jobs_submitter(HELLO, n_gpu=6, name="bad")
    assert nothing_written(workspace)


def test_a_layout_suggestion_is_one_the_cluster_can_run(workspace, slurm_cluster):
    """The local Slurm has one node of 4 GPUs: 5 GPUs are refused with 4 offered, never 8 (which it refuses)."""
    dlokit.use_profile("local-slurm")
    with pytest.raises(JobSpecError, match=r"5 GPUs do not fill whole nodes of 4 GPUs .*ask for 4 \(at most\)$"):
        dlokit.gpu_jobs_submitter(HELLO, n_gpu=5, name="bad")


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
    assert dlokit.submission.jobspec.parse_time(time_max) == seconds


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


def test_missing_relative_script_is_refused_on_slurm_too(slurm4, workspace):
    with pytest.raises(JobSpecError, match=r"script 'no_such_script.py' not found \(looked for .*no_such_script.py\)"):
        dlokit.gpu_jobs_submitter("no_such_script.py --test", name="bad")
    assert nothing_written(workspace)


def test_memory_settings_are_checked(workspace):
    with pytest.raises(ProfileError, match=r"mem 'lots' is not an amount of memory: write e.g. '16G'"):
        dlokit.use_profile("local-slurm", mem="lots")
    with pytest.raises(ProfileError, match="mem or mem_per_cpu, not both"):
        dlokit.use_profile("local-slurm", mem="4G", mem_per_cpu="1G")
    with pytest.raises(ProfileError, match="'auto' sizes local jobs"):
        dlokit.use_profile("local-slurm", mem="auto")
    assert dlokit.use_profile("local").mem == "auto"


@pytest.mark.parametrize("setting,line", [({"mem": "8G"}, "#SBATCH --mem=8G"),
                                          ({"mem_per_cpu": "2000"}, "#SBATCH --mem-per-cpu=2000")])
def test_memory_of_the_profile_reaches_the_batch_script(workspace, setting, line):
    script = dlokit.sbatch_preview(dlokit.JobSpec(script=HELLO, name="ok"), dlokit.use_profile("local-slurm", **setting))
    assert line in script and "#SBATCH --overcommit" in script


def test_local_memory_limit_is_the_jobs_share(workspace):
    from dlokit.submission.submit import _local_memory

    layout = dlokit.plan(dlokit.JobSpec(script=HELLO, n_gpu=1), dlokit.use_profile("local"))
    assert _local_memory(dlokit.use_profile("local"), layout) == "auto"
    assert _local_memory(dlokit.use_profile("local", mem="2G"), layout) == "2048"
    assert _local_memory(dlokit.use_profile("local", mem="0"), layout) == "0"


def test_options_the_local_backend_ignores_are_named_once_in_one_line(workspace, capsys):
    dlokit.use_profile("local")
    spec = dlokit.JobSpec(script=HELLO, name="ignored", account="abc@a100", qos="qos_gpu-t3", partition="gpu_p2")
    [card] = submit(spec, ignored=["n_cpu"])
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == ["note: ignored on profile 'local': account (Slurm only), partition (Slurm only), "
                     "qos (Slurm only), n_cpu (unknown)"]
    dlokit.wait(card.job_id, timeout_s=120)


def test_unknown_and_ignored_options_of_a_cell_share_one_line(workspace, capsys):
    dlokit.use_profile("local")
    [job_id] = dlokit.gpu_jobs_submitter(HELLO, name="ignored", account="abc@a100", n_cpu=4)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    dlokit.wait(job_id, timeout_s=120)
    assert notes == ["note: ignored on profile 'local': account (Slurm only), n_cpu (unknown)"]


def _partitions(max_time_s=86400, nodes=1, gpus=4, cpus=2, mem_mb=16000):
    from dlokit.submission.jobspec import Node, Partition

    members = tuple(Node(f"n{k}", cpus, gpus, mem_mb, f"gpu:{gpus}") for k in range(nodes))
    return {"gpu": Partition("gpu", True, max_time_s, None, None, members)}


@pytest.mark.parametrize("options,profile_options,node,limit", [
    (dict(n_gpu=8), {}, {}, r"n_gpu=8 needs 2 nodes of 4 GPUs but partition 'gpu' has 1 node: ask for at most 4 GPUs"),
    (dict(time_max="2-00:00:00"), {}, {}, r"'2-00:00:00' \(2-00:00:00\) is longer than partition 'gpu' allows \(MaxTime"),
    (dict(n_gpu=4), {}, dict(gpus=2), r"4 GPUs per node asked but the nodes of partition 'gpu' have at most 2 "
                                      r"\(Gres gpu:2\)"),
    (dict(n_gpu=2, cpus_per_task=2), {"overcommit": False}, {},
     r"2 task\(s\) x 2 CPUs = 4 CPUs per node .* at most 2: give cpus_per_task=1 or fewer"),
    (dict(n_gpu=4), {}, {}, None),  # 4 tasks on 2 cores: the local Slurm's --overcommit lets them share
    (dict(n_gpu=1), {"mem": "20G"}, {}, r"memory 20480 MB per node .* at most 16000 MB"),
])
def test_layouts_are_checked_against_what_the_cluster_offers(workspace, options, profile_options, node, limit):
    from dlokit.submission.jobspec import check_fits

    profile = dlokit.use_profile("local-slurm", **profile_options)
    spec = dlokit.JobSpec(script=HELLO, name="fits", **options)
    layout = dlokit.plan(spec, profile)
    if limit is None:
        check_fits(spec, profile, layout, _partitions(**node))
    else:
        with pytest.raises(JobSpecError, match=limit):
            check_fits(spec, profile, layout, _partitions(**node))


@pytest.mark.parametrize("text,seconds", [("1-00:00:00", 86400), ("2:00:00", 7200), ("30:00", 1800), ("60", 3600),
                                          ("2-12", 216000), ("UNLIMITED", None), ("INFINITE", None)])
def test_slurm_time_limits_are_read(text, seconds):
    assert dlokit.submission.jobspec.slurm_seconds(text) == seconds


def test_the_local_profile_refuses_more_cores_than_the_machine_has(workspace):
    profile = dlokit.use_profile("local", cpus_per_task=999)
    with pytest.raises(JobSpecError, match=r"1 task\(s\) x cpus_per_task=999 = 999 cores asked but this machine has \d+"):
        dlokit.plan(dlokit.JobSpec(script=HELLO, name="cores"), profile)


def test_the_local_profile_calls_cpu_processes_so(workspace):
    import torch

    if torch.cuda.device_count():
        pytest.skip("this machine has GPUs")
    profile = dlokit.use_profile("local")
    with pytest.raises(JobSpecError, match=r"this machine offers no GPU, and \d+ CPU process\(es\) standing for GPUs"):
        dlokit.plan(dlokit.JobSpec(script=HELLO, name="many", n_gpu=64), profile)
