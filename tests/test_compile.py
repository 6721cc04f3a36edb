"""TP3.3: tp_scripts/solutions/compile_bench.py (eager vs TorchScript vs torch.compile), its student copy,
train_classifier.py --compile-mode, and the per-user inductor cache of submitted jobs.

Real subprocesses, one thread each, tiny sizes. Compiling on the CPU builds C++ kernels (seconds for the
function, a minute or more for a ResNet's training step on a loaded 2-core machine): only the function is
compiled in the fast tests; the model, its inference and its optimizer step in slow ones. The student copy
compiles nothing, so its runs are cheap.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from ranks import run_warm

from dlokit import analysis
from dlokit.in_job import jobenv
from dlokit.in_job.runrecord import read_rank
from tp_imports import common, load_script  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "tp_scripts" / "solutions" / "compile_bench.py"
STUDENT = REPO / "tp_scripts" / "compile_bench.py"
TRAIN = REPO / "tp_scripts" / "solutions" / "train_classifier.py"
PYTHON = sys.executable
SMALL_FUNCTION = ["--parts", "function", "--function-rows", "64", "--function-cols", "256", "--warmup-steps", "2",
                  "--steps", "3"]
SMALL_MODEL = ["--parts", "model", "--model", "resnet18", "--image-size", "32", "--batch-size", "4",
               "--warmup-steps", "2", "--steps", "2"]
TIMES = ("t_build", "t_first", "t_warmup", "t_compile", "t_step")


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory) -> dict:
    """One Inductor cache for the tests that compile a ResNet-18 (conftest runs this module on one worker): the
    first builds its C++ kernels (about a minute of one core), the others reuse the kernels they share."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path_factory.mktemp("inductor"))}


def bench(runs: Path, run_id: str, *args, script=SOLUTION, env=None, ranks=1, check=True, timeout=400):
    cmd = [PYTHON, str(script), "--runs-dir", str(runs), "--device", "cpu", *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DLOKIT_RUN_ID": run_id, **(env or {})}
    done = run_warm(cmd, env, timeout, ranks=ranks, cwd=REPO)  # started warm, as a local job's script is
    if check:
        assert done.returncode == 0, f"{cmd}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    return done


def results(runs: Path, run_id: str, rank: int = 0) -> dict:
    """{(part, variant): compile_result line}, after checking the summary holds the same table."""
    rec = read_rank(runs / run_id / f"rank{rank}")
    assert rec["state"] == "completed" and not rec["problems"], rec["problems"]
    lines = [m for m in rec["metrics"] if m["kind"] == "compile_result"]
    assert rec["summary"]["results"] == [{k: v for k, v in m.items() if k not in ("kind", "time")} for m in lines]
    return {(m["part"], m["variant"]): m for m in lines}




def needs_compiler():
    missing_compiler = common("compile_support").missing_compiler

    problem = missing_compiler("cpu")
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def function_runs(tmp_path_factory) -> Path:
    """One run of the small function, eager and compiled (skipped with its reason where no C++ compiler is), read by
    the two tests below: every run also records the control-flow example (trace and script)."""
    runs = tmp_path_factory.mktemp("function")
    bench(runs, "fn", *SMALL_FUNCTION, "--variants", "eager,compile-default")
    return runs


def test_compiled_function_agrees_with_eager_and_its_compile_time_is_recorded_apart(function_runs):
    needs_compiler()
    found = results(function_runs, "fn")
    eager, compiled = found["function", "eager"], found["function", "compile-default"]
    for line in (eager, compiled):
        assert line["status"] == "ok" and all(line[k] >= 0 for k in TIMES)
        assert line["warmup_steps"] == 2 and line["timed_steps"] == 3 and len(line["step_times"]) == 5
        assert line["t_first"] == pytest.approx(line["step_times"][0], abs=1e-6)
        assert line["t_warmup"] == pytest.approx(sum(line["step_times"][:2]), abs=1e-5)
    assert eager["compiled"] is False and eager["graphs"] == 0 and eager["max_abs_diff"] == 0
    assert compiled["compiled"] is True and compiled["graphs"] >= 1 and compiled["graph_breaks"] == 0
    assert compiled["agrees"] is True and compiled["max_abs_diff"] < 1e-5 and compiled["reference"] == "eager"
    # the first call generated and built the kernels (or loaded them from the cache): slower than a steady call
    assert compiled["t_first"] > compiled["t_step"]


def test_a_trace_replays_the_branch_of_its_example_and_a_script_keeps_the_if(function_runs):
    table = analysis.control_flow_table("fn", function_runs).set_index("variant")
    assert table.loc["trace", "same_as_eager_on_example"] and not table.loc["trace", "same_as_eager_on_other_branch"]
    assert table.loc["script", "same_as_eager_on_example"] and table.loc["script", "same_as_eager_on_other_branch"]
    summary = read_rank(function_runs / "fn" / "rank0")["summary"]
    assert [line["variant"] for line in summary["control_flow"]] == ["trace", "script"]


@pytest.mark.slow
def test_compiled_training_inference_and_optimizer_steps_agree_with_eager_and_fused_adam_beats_foreach(
        tmp_path, kernel_cache):
    """One process for the three parts of the model (one compiler start-up): training steps, inference, Adam steps."""
    needs_compiler()
    bench(tmp_path, "model", *SMALL_MODEL[2:], "--parts", "model,inference,optimizer",
          "--variants", "eager,trace,script,compile-default,compile-frozen,fused", env=kernel_cache)
    found = results(tmp_path, "model")
    assert sorted(found) == sorted([("model", v) for v in ("eager", "trace", "script", "compile-default")] +
                                   [("inference", v) for v in ("eager", "trace", "script", "compile-default",
                                                               "compile-frozen")] +
                                   [("optimizer", v) for v in ("eager", "compile-default", "fused")])
    assert all(line["status"] == "ok" for line in found.values()), found
    for variant in ("trace", "script", "compile-default"):
        line = found["model", variant]
        assert line["agrees"] is True and line["max_abs_diff"] < 1e-3 and line["compared_calls"] == 2, line
        assert line["max_abs_diff_all_calls"] >= line["max_abs_diff"]  # later steps drift: recorded, not judged
        assert line["items"] == "images" and line["items_per_s"] > 0 and line["ddp"] is False
    assert found["model", "compile-default"]["compiled"] is True and found["model", "compile-default"]["graphs"] >= 1
    assert found["model", "script"]["compiled"] is False
    for key in (("inference", "compile-default"), ("inference", "compile-frozen"), ("optimizer", "compile-default")):
        line = found[key]
        assert line["compiled"] is True and line["graphs"] >= 1, line
        assert line["agrees"] is True and line["reference"] == "eager", line
    assert found["inference", "eager"]["items"] == "images"
    step, fused = found["optimizer", "eager"], found["optimizer", "fused"]
    assert fused["compiled"] is False and fused["agrees"] is True
    assert step["items"] == "parameters" and step["tensors"] == 62 and step["optimizer"] == "Adam"  # ResNet-18's
    assert step["items_per_s"] == pytest.approx(11_181_642 / step["t_step"])
    # one kernel for the whole step against a few per operation over 62 tensors: several times fewer memory trips
    assert fused["t_step_min"] < step["t_step_min"]


@pytest.mark.slow
def test_compile_of_a_ddp_model_on_two_ranks(tmp_path, kernel_cache):
    needs_compiler()
    bench(tmp_path, "ddp", *SMALL_MODEL, "--variants", "eager,compile-default",
          ranks=2, timeout=900, env=kernel_cache)
    for rank in (0, 1):
        found = results(tmp_path, "ddp", rank)
        line = found["model", "compile-default"]
        assert line["ddp"] is True and line["compiled"] is True and line["agrees"] is True, line
    rec = read_rank(tmp_path / "ddp" / "rank1")
    assert rec["run"]["world_size"] == 2 and rec["summary"]["ddp"] is True


def test_student_copy_compiles_nothing_and_says_so(tmp_path):
    """Untouched TP3.3: the compile variants run eagerly (the function, the inference, the optimizer step), which
    the record shows (no graph, not an OptimizedModule or compiled function); every variant agrees with eager;
    each part ran the variants that apply to it."""
    variants = "eager,trace,script,compile-default,compile-frozen,fused,numpy,numpy-compile"
    bench(tmp_path, "student", *SMALL_FUNCTION[2:], "--parts", "inference,optimizer,function", "--model", "resnet18",
          "--image-size", "16", "--batch-size", "2", "--variants", variants, "--fresh-cache", script=STUDENT)
    found = results(tmp_path, "student")
    # nothing compiles: the compiler's one-off start-up is not paid, and the notebook's line says why
    assert analysis.load_run("student", tmp_path).summary["compiler_startup_s"] is None
    assert "TODO TP3.3" in analysis.compile_storage.startup_text("student", tmp_path)
    assert {part: [v for p, v in found if p == part] for part in ("inference", "optimizer", "function")} == {
        "inference": ["eager", "trace", "script", "compile-default", "compile-frozen"],
        "optimizer": ["eager", "compile-default", "fused"],
        "function": ["eager", "trace", "script", "compile-default", "numpy", "numpy-compile"]}
    for line in found.values():
        assert line["status"] == "ok" and line["agrees"] is True, line
        assert line["compiled"] is False and line["graphs"] == 0
    assert found["function", "numpy"]["max_abs_diff"] > 0  # NumPy's own float32 kernels: close, not identical
    # the plot: a panel per part; a compile time beside what was traced, scripted or compiled, none beside the rest
    figure = analysis.compile_plot("student", tmp_path)
    assert [ax.get_title().split(":")[0] for ax in figure.axes] == ["inference", "optimizer", "function"]
    written = [[t.get_text().split()[0] for t in ax.texts] for ax in figure.axes]
    assert written == [["compile"] * 4, ["compile"], ["compile"] * 4]


def test_without_a_cpu_compiler_the_compile_variants_are_skipped_with_the_reason(tmp_path):
    missing = str(tmp_path / "no-such-g++")
    bench(tmp_path, "nocxx", *SMALL_FUNCTION, "--variants", "eager,compile-default,compile-reduce-overhead,numpy-compile",
          env={"CXX": missing})
    found = results(tmp_path, "nocxx")
    assert found["function", "eager"]["status"] == "ok"
    for variant in ("compile-default", "compile-reduce-overhead", "numpy-compile"):
        line = found["function", variant]
        assert line["status"] == "skipped" and missing in line["reason"] and "C++ compiler" in line["reason"]
    summary = read_rank(tmp_path / "nocxx" / "rank0")["summary"]
    assert missing in summary["compile_unavailable"]
    # train_classifier.py --compile refuses up front, the same sentence, exit code 2
    done = subprocess.run([PYTHON, str(TRAIN), "--data", "synthetic", "--device", "cpu", "--model", "resnet18",
                           "--compile"], cwd=REPO, env={**os.environ, "CXX": missing}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "C++ compiler" in done.stderr and "Traceback" not in done.stderr


def test_reduce_overhead_is_skipped_on_the_cpu(tmp_path):
    bench(tmp_path, "ro", *SMALL_FUNCTION, "--variants", "eager,compile-reduce-overhead", script=STUDENT)
    line = results(tmp_path, "ro")["function", "compile-reduce-overhead"]
    assert line["status"] == "skipped" and "CUDA graphs" in line["reason"]


def load_solution():
    return load_script(SOLUTION, "compile_bench_solution")


@pytest.mark.parametrize("args, message", [
    (["--variants", "eager,compile-turbo"], "unknown torch.compile mode"),
    (["--variants", "jit"], "unknown variant 'jit'"),
    (["--variants", "compile-frozn"], "unknown torch.compile mode in 'compile-frozn'"),
    (["--parts", "everything"], "--parts"),
    (["--model", "resnet9000"], "unknown model"),
    (["--steps", "0"], "--steps must be at least 1"),
])
def test_bad_bench_options_stop_with_exit_code_2(args, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        load_solution().parse_args(args)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--compile-mode", "turbo"], "--compile-mode turbo"),
    (["--device", "cpu", "--compile-mode", "reduce-overhead"], "GPU only"),
])
def test_bad_compile_mode_stops_train_classifier_with_exit_code_2(args, message, capsys):
    parse_args = common("train_options").parse_args

    with pytest.raises(SystemExit) as stopped:
        parse_args(["--data", "synthetic", "--model", "resnet18", *args])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_bad_options_end_without_a_traceback_before_any_record(tmp_path):
    for script, args in ((SOLUTION, ["--variants", "jit"]), (TRAIN, ["--data", "synthetic", "--compile-mode", "turbo"])):
        done = subprocess.run([PYTHON, str(script), "--runs-dir", str(tmp_path), *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and "error:" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_compile_mode_reaches_torch_compile(tmp_path, kernel_cache):
    """--compile-mode implies --compile: the config holds the mode and the model the loop called was compiled."""
    needs_compiler()
    runs = tmp_path / "runs"
    # the shapes of SMALL_MODEL (and compile_bench's 10 classes): its forward kernels are in the cache
    cmd = [PYTHON, str(TRAIN), "--runs-dir", str(runs), "--data", "synthetic", "--num-classes", "10", "--device", "cpu",
           "--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--test", "--test-nsteps", "1",
           "--compile-mode", "default"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "DLOKIT_RUN_ID": "mode", **kernel_cache})
    assert done.returncode == 0, done.stderr[-3000:]
    run = read_rank(runs / "mode" / "rank0")["run"]
    assert run["config"]["compile"] is True and run["config"]["compile_mode"] == "default"
    assert run["observed"]["compiled"] is True


# ---- the per-user inductor cache of jobs -------------------------------------------------------------------

def test_compile_caches_default_per_user_and_keep_a_chosen_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    caches = jobenv.compile_caches({})
    assert caches == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / ".cache" / "dlokit" / "inductor"),
                      "TRITON_CACHE_DIR": str(tmp_path / ".cache" / "dlokit" / "triton")}
    assert jobenv.compile_caches({"TORCHINDUCTOR_CACHE_DIR": "/scratch/me/inductor"})["TORCHINDUCTOR_CACHE_DIR"] == \
        "/scratch/me/inductor"
    # importing torch._inductor writes torch's shared /tmp default into the environment: not a choice
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    env = jobenv.task_environment(runs_dir=tmp_path, job_name="x", cpus_per_task=1)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == caches["TORCHINDUCTOR_CACHE_DIR"]


@pytest.mark.parametrize("backend", ["local", pytest.param("local-slurm", marks=pytest.mark.slurm)], indirect=True)
def test_submitted_job_compiles_into_the_users_cache(backend, workspace, monkeypatch):
    """The job sees TORCHINDUCTOR_CACHE_DIR under the user's home (not /tmp/torchinductor_<user>): the record
    holds the folder torch itself resolved inside the job."""
    import dlokit

    home = workspace / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    command = [str(STUDENT), *SMALL_FUNCTION, "--variants", "eager", "--device", "cpu"]
    [job_id] = dlokit.gpu_jobs_submitter(shlex.join(command), n_gpu=1, name="cache", time_max="00:05:00")
    [outcome] = dlokit.wait(job_id, timeout_s=300)
    assert outcome.state == "COMPLETED", str(outcome)
    run = read_rank(dlokit.submission.jobs.find_card(job_id).run_dir / "rank0")["run"]
    assert run["config"]["inductor_cache_dir"] == str(home / ".cache" / "dlokit" / "inductor")
