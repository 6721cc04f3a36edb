"""The three outcomes of a check (passed / failed / not applicable on this hardware), judged on
synthetic run records written with RunRecorder: a solution-like `observed` block passes (or is not
applicable) on a CPU, a student-like one fails, GPU-like records are judged on their measured effects,
and the machine-readable copy carries the status."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

import dlokit
from dlokit import checks
from dlokit.in_job.runrecord import RunRecorder

TRACES = Path(__file__).resolve().parent / "fixtures" / "traces"
IMAGES = 24
JITTER = (1.3, 1.0, 0.99, 1.01, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0)  # a slow first step, then ±2 %

SOLUTION = {
    "model_to_device": True, "batch_to_device": True, "amp_dtype": "bfloat16", "grad_scaler": False,
    "channels_last_input": True, "channels_last_weights": True, "ddp_wrapped": True, "sync_bn": False,
    "compiled": False, "sampler": "DistributedSampler", "loader_num_workers": 1, "loader_pin_memory": False,
    "loader_prefetch_factor": 3, "loader_persistent_workers": True, "batch_pinned": False, "non_blocking": True,
    "record_function_labels": True, "profiler": True, "tf32": False, "cudnn_benchmark": False,
    "augment": ["mixup"], "augment_on_device": True, "randaugment_in_workers": False,
}
STUDENT = {  # what the untouched student script observes: every TODO left as it is
    **SOLUTION, "model_to_device": False, "batch_to_device": False, "amp_dtype": "float32",
    "channels_last_input": False, "channels_last_weights": False, "ddp_wrapped": False, "sampler": "RandomSampler",
    "loader_num_workers": 0, "loader_prefetch_factor": None, "loader_persistent_workers": False,
    "non_blocking": False, "record_function_labels": False, "profiler": False, "augment": [],
    "augment_on_device": False,
}
OPTIONS = {"amp": "bf16", "channels_last": True, "num_workers": 1, "prefetch_factor": 3, "persistent_workers": True,
           "pin_memory": True, "non_blocking": True, "profile": True, "sync_bn": False, "augment": "mixup"}
BASE_OPTIONS = {"amp": "none", "channels_last": False, "num_workers": 0, "prefetch_factor": None,
                "persistent_workers": False, "pin_memory": False, "non_blocking": False, "profile": False,
                "augment": "none"}


def write(runs, run_id, *, observed, options=OPTIONS, world_size=1, gpu=False, compute=100.0, t_data=0.02,
          memory=500.0, trace=None, bn_means=None):
    """A finished run as train_classifier.py records it; gpu=True makes it a CUDA run; bn_means: each rank's running
    mean of its first BatchNorm layer at the end of its epoch (a 'bn_running' line)."""
    device = "cuda:0" if gpu else "cpu"
    config = {"model": "resnet18", "batch_size": 8, "device": "auto", "device_type": device.split(":")[0],
              "train_images": IMAGES, "world_size": world_size, **options}
    for rank in range(world_size):
        seen = {"device": device, "model_device": device, "ddp_world_size": world_size,
                "samples_per_rank_per_epoch": IMAGES // world_size if observed["sampler"] == "DistributedSampler"
                else IMAGES, **observed}
        if world_size == 1:
            seen.update(ddp_wrapped=False, sampler="DistributedSampler" if observed is not STUDENT else "RandomSampler")
        recorder = RunRecorder(config, rank=rank, world_size=world_size, run_id=run_id, runs_dir=runs,
                               script="train_classifier.py")
        hardware = {**recorder.header["hardware"], "gpu_count": 1 if gpu else 0,
                    "gpu_name": "NVIDIA H100 80GB HBM3" if gpu else None, "cpu_count": 2}
        recorder.amend(hardware=hardware, observed=seen)
        for step, wobble in enumerate(JITTER, 1):  # steps around the run's pace, as a real run's vary
            t_step = 8 / compute * wobble
            recorder.log("step", step=step, batch_size=8, t_data=t_data * wobble, t_step=t_step,
                         throughput_compute=8 / t_step, throughput_train=8 / (t_step + t_data * wobble))
        if bn_means is not None:
            recorder.log("bn_running", epoch=0, layer="bn1", running_mean=bn_means[rank], running_var=[1.0, 2.0])
        recorder.finish(steps=4, throughput_train=8 / (t_data + 8 / compute), throughput_compute=compute,
                        t_data=t_data, gpu_mem_peak_mb=memory if gpu else None,
                        host_rss_peak_mb=None if gpu else memory, params_identical_across_ranks=True,
                        observed=seen)
    if trace is not None:
        folder = Path(runs) / run_id / "profile"
        folder.mkdir()
        shutil.copy(trace, folder / "rank0.1700000000000.pt.trace.json")
    return run_id


@pytest.fixture
def runs(tmp_path, monkeypatch):
    folder = tmp_path / "runs"
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(folder))
    monkeypatch.setenv("DLOKIT_LOG_DIR", str(tmp_path / "jobs"))
    monkeypatch.chdir(tmp_path)
    dlokit.use_profile("local")
    checks.RESULTS.clear()
    return folder


def write_bn_statistics(runs, run_id, *, synced, own=0.55, world_size=2):
    """bn_statistics.py's record: rank 0's largest difference of the synchronised and the own statistics from the
    whole batch's (the other ranks record no comparison)."""
    for rank in range(world_size):
        recorder = RunRecorder({"channels": 4, "batch": 8}, rank=rank, world_size=world_size, run_id=run_id,
                               runs_dir=runs, script="bn_statistics.py")
        recorder.finish(**({"largest_difference": {"synced_vs_whole": synced, "local_vs_whole": own}}
                           if rank == 0 else {}))
    return run_id


def write_layer_drop(runs, run_id, *, observed, error=None, skipped=7):
    """A 2-rank --layer-drop training: failed with `error` (rank 0 first), or completed with `skipped` blocks skipped."""
    for rank in range(2):
        recorder = RunRecorder({"model": "resnet18", "layer_drop": 0.5, "world_size": 2}, rank=rank, world_size=2,
                               run_id=run_id, runs_dir=runs, script="train_classifier.py")
        recorder.amend(observed=observed)
        if error:
            recorder.finish(status="failed", error=error)
        else:
            recorder.finish(steps=3, layer_drop_skipped=skipped, layer_drop_blocks=5, observed=observed)
    return run_id


def write_fit_levers(runs, run_id, *, treated: bool):
    """fit_levers.py's record at batch 8, k = 4: each arm's counted and timed steps, and the norm lesson's lines.
    Untreated (the student's untouched TODOs): one forward pass of 8, every block once, the plain step's memory."""
    recorder = RunRecorder({"batch_size": 8, "micro_batches": 4, "levers": ["plain", "accumulate", "checkpoint"],
                            "norm_lesson": ["batch", "group"]}, run_id=run_id, runs_dir=runs, script="fit_levers.py")
    seen = {"plain": ([8], 8, 160.0), "accumulate": ([2, 2, 2, 2] if treated else [8], 8, 130.0 if treated else 160.0),
            "checkpoint": ([8], 16 if treated else 8, 140.0 if treated else 160.0)}
    for step, wobble in enumerate((1.0, *JITTER, 1.0)):
        counted = step in (0, len(JITTER) + 1)
        for lever, (passes, blocks, held) in seen.items():
            cost = {"plain": 1.0, "accumulate": 1.5, "checkpoint": 1.3}[lever] if treated else 1.0
            recorder.log("lever_step", lever=lever, step=step, timed=not counted, t_step=0.1 * cost * wobble,
                         forward_images=passes, block_forwards=blocks, blocks=8,
                         **({"held_mib": held, "saved_mib": held - 128.0} if counted else {}))
    for norm, apart in (("batch", 1e-2 if treated else 0.0), ("group", 1e-7 if treated else 0.0)):
        recorder.log("norm_step", norm=norm, step=0, loss_plain=2.0, loss_accumulate=2.0 * (1 + apart),
                     grad_norm_plain=10.0, grad_norm_accumulate=10.0 * (1 + apart))
    recorder.finish(steps=len(JITTER))
    return run_id


@pytest.fixture
def cpu_records(runs):
    write(runs, "base", observed={**SOLUTION, "amp_dtype": "float32", "channels_last_input": False,
                                  "channels_last_weights": False, "loader_num_workers": 0,
                                  "loader_prefetch_factor": None, "non_blocking": False},
          options=BASE_OPTIONS, compute=100.0, t_data=0.05, memory=500.0)
    write(runs, "sol", observed=SOLUTION, compute=81.0, t_data=0.01, memory=510.0, trace=TRACES / "cpu_2steps.pt.trace.json")
    write(runs, "sol-ddp", observed=SOLUTION, world_size=2)
    write(runs, "stu", observed=STUDENT, compute=101.0, t_data=0.05)
    write(runs, "stu-ddp", observed=STUDENT, world_size=2)
    write_bn_statistics(runs, "bn-sol", synced=1.2e-7)
    write_bn_statistics(runs, "bn-stu", synced=0.55)  # no all-reduce: each rank's own statistics
    reducer = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
               "This error indicates that your module has parameters that were not used in producing loss.")
    write_layer_drop(runs, "ld-sol-without", observed=SOLUTION, error=reducer)
    write_layer_drop(runs, "ld-sol-with", observed={**SOLUTION, "ddp_find_unused_parameters": True})
    write_layer_drop(runs, "ld-stu-without", observed=STUDENT)  # no DDP: nothing waits for a skipped block
    write_layer_drop(runs, "ld-stu-with", observed=STUDENT)
    write_fit_levers(runs, "fit-sol", treated=True)
    write_fit_levers(runs, "fit-stu", treated=False)
    return runs


def test_solution_like_records_on_a_cpu_pass_or_are_not_applicable(cpu_records):
    results = [checks.completed("sol"), checks.on_device(["base", "sol"]), checks.amp("base", ["sol"]),
               checks.tf32("base", ["sol"]), checks.channels_last(["sol"], baseline_id="base"),
               checks.profiler(["sol"]), checks.dataloader("base", "sol"), checks.ddp(["sol", "sol-ddp"], world_size=2),
               checks.sync_bn(["sol-ddp"]), checks.bn_statistics("bn-sol"),
               checks.unused_parameters("ld-sol-without", "ld-sol-with"),
               checks.augmentation(["sol"], baseline_id="base"), checks.fit_levers("fit-sol")]
    for result in results:
        assert result.status in (checks.PASSED, checks.NOT_APPLICABLE), result
        assert result.passed  # `passed` means "not failed": ✅ or ➖
        for part in result.parts:
            assert part.status != checks.FAILED, result
            if part.status == checks.NOT_APPLICABLE:
                assert part.message.startswith("not applicable on this hardware: ")
    by_name = {r.check: r for r in results}
    from dlokit.checks import day1, day2

    days_1_2 = {f.check_name for module in (day1, day2) for f in vars(module).values() if hasattr(f, "check_name")}
    assert set(by_name) == days_1_2  # every Day 1-2 check exercised (later days: their notebook tests)
    assert len(set(checks.CHECKS.values())) == len(checks.CHECKS)  # each name defined once

    amp = checks.amp("base", ["sol"])
    assert amp.status == checks.PASSED and amp.part("code").status == checks.PASSED
    speed = amp.part("speed")
    assert speed.status == checks.NOT_APPLICABLE and "×0.81 [" in speed.message and "compute throughput" in speed.message
    assert "what bf16 autocast does on a CPU is another effect" in speed.message  # no cause its number denies
    assert "➖ speed: not applicable on this hardware: the speed-up it teaches comes from tensor cores" in str(amp)
    layout = checks.channels_last(["sol"], baseline_id="base")
    assert layout.status == checks.PASSED and layout.part("speed").status == checks.NOT_APPLICABLE
    loader = checks.dataloader("base", "sol")
    assert loader.status == checks.PASSED
    assert loader.part("pinned memory").status == checks.NOT_APPLICABLE
    # waiting for the batch is measured on a CPU too: ×0.20, its interval below 1, as the lesson says
    assert loader.part("speed").status == checks.PASSED and "×0.20 [" in loader.part("speed").message
    for name, words in (("TF32 tensor cores", "tensor-core format"), ("TP2.3 SyncBatchNorm", "CPU tensors")):
        assert by_name[name].status == checks.NOT_APPLICABLE and words in by_name[name].message
        assert by_name[name].message.startswith("not applicable on this hardware: ")
    assert by_name["TP1.1 model and batches on the device"].status == checks.PASSED
    assert "2 profiled step(s)" in " ".join(by_name["TP1.4 profiler trace"].details)


def test_student_like_records_fail_every_tp_with_a_todo(cpu_records):
    expected = {
        "TP1.1 model and batches on the device": (checks.on_device(["stu"]), "TODO TP1.1"),
        "TP1.2 mixed precision": (checks.amp("base", ["stu"]), "TODO TP1.2"),
        "TP1.3 channels_last": (checks.channels_last(["stu"], baseline_id="base"), "TODO TP1.3"),
        "TP1.4 profiler trace": (checks.profiler(["stu"]), "TODO TP1.4"),
        "TP2.1 DataLoader tuned": (checks.dataloader("base", "stu"), "TODO TP2.1"),
        "TP2.2 data parallelism": (checks.ddp(["stu-ddp"], world_size=2), "TODO TP2.2"),
        "TP2.3 what SyncBatchNorm computes": (checks.bn_statistics("bn-stu"), "TODO TP2.3"),
        "TP2.3 unused parameters": (checks.unused_parameters("ld-stu-without", "ld-stu-with"), "TODO TP2.2"),
        "TP2.4 augmentation on the device": (checks.augmentation(["stu"]), "TODO TP2.4"),
        "TP1.5 when the batch does not fit": (checks.fit_levers("fit-stu"), "TODO TP1.5"),
    }
    for name, (result, words) in expected.items():
        assert result.check == name
        assert result.status == checks.FAILED and not result.passed, result
        assert words in result.message, result
        assert result.mark == "❌"
    # the code is judged even where the speed is not: a failed code part fails the check; the records show the
    # untouched arm computed what its baseline computed, so its speed is no effect to judge (nor "not applicable")
    for name in ("TP1.2 mixed precision", "TP1.3 channels_last", "TP2.1 DataLoader tuned"):
        speed = expected[name][0].part("speed")
        assert speed.status == checks.INFO and speed.message.startswith("same computation"), speed
        assert name.split()[0] in speed.message  # "... as its baseline does: TODO TP1.2"


def test_an_untouched_todo_never_passes_on_speed_whatever_the_two_runs_measured(cpu_records):
    """Day 2, 2026-11-28: every run used 0 workers, yet "✅ speed: ... ×0.70 [0.67–0.73] ... agrees": two runs of one
    loader, 30 % apart. The records say the tuned run loaded as the baseline did: no speed part can pass."""
    write(cpu_records, "stu-fast", observed=STUDENT, compute=101.0, t_data=0.035)
    loader = checks.dataloader("base", "stu-fast")
    assert loader.status == checks.FAILED and "TODO TP2.1" in loader.message
    speed = loader.part("speed")
    assert speed.status == checks.INFO and "0 DataLoader workers" in speed.message and "TODO TP2.1" in speed.message
    assert "agrees" not in speed.message and "×0.70" not in speed.message


def test_records_without_the_newer_observations(runs):
    old = {k: v for k, v in SOLUTION.items() if k not in ("model_to_device", "batch_to_device", "augment",
                                                          "augment_on_device")}
    write(runs, "old", observed=old)
    result = checks.on_device(["old"])
    assert result.status == checks.NOT_APPLICABLE and result.passed
    assert result.message.startswith("not applicable on this hardware: ") and ".to(device)" in result.message
    augmented = checks.augmentation(["old"])
    assert augmented.status == checks.FAILED and "older train_classifier.py" in augmented.message
    assert checks.ddp(["old"]).status == checks.NOT_APPLICABLE  # one process: nothing to parallelise
    assert checks.dataloader("old", "old").status == checks.PASSED


def test_augmentation_runs_are_judged_on_what_each_asked_for(runs):
    randaugment = {**SOLUTION, "augment": ["randaugment"], "augment_on_device": False, "randaugment_in_workers": True}
    write(runs, "ra", observed=randaugment, options={**OPTIONS, "augment": "randaugment"})
    write(runs, "mix", observed=SOLUTION)
    write(runs, "mix-stu", observed={**randaugment, "augment": []}, options=OPTIONS)
    write(runs, "ra-lost", observed={**randaugment, "augment": []}, options={**OPTIONS, "augment": "randaugment"})
    assert checks.augmentation(["ra", "mix"]).status == checks.PASSED  # as the Day 2 notebook calls it
    alone = checks.augmentation(["ra"])
    assert alone.status == checks.FAILED and "mixup or cutmix" in alone.message
    student = checks.augmentation(["ra", "mix-stu"])
    assert student.status == checks.FAILED and "TODO TP2.4" in student.message and "mix-stu" in student.message
    lost = checks.augmentation(["ra-lost", "mix"])
    assert lost.status == checks.FAILED and "not transformed by it" in lost.message


def test_gpu_records_are_judged_on_their_measured_effects(runs):
    write(runs, "g-base", observed={**SOLUTION, "amp_dtype": "float32"}, options=BASE_OPTIONS, gpu=True,
          compute=1000.0, t_data=0.05, memory=8000.0)
    write(runs, "g-amp", observed={**SOLUTION, "batch_pinned": True}, gpu=True, compute=1900.0, t_data=0.01,
          memory=4500.0)
    # slower beyond the spread between two runs of one command (stats.RUN_SPREAD), which one run each carries
    write(runs, "g-slow", observed={**SOLUTION, "batch_pinned": True}, gpu=True, compute=600.0, t_data=0.1,
          memory=8100.0)
    write(runs, "g-stu", observed={**STUDENT, "device": "cpu", "model_device": "cpu"}, gpu=True)
    write(runs, "g-ddp-cpu-bn", observed={**SOLUTION, "sync_bn": False}, options={**OPTIONS, "sync_bn": True},
          gpu=True, world_size=2)

    amp = checks.amp("g-base", ["g-amp"])
    assert amp.status == checks.PASSED and amp.part("speed").status == checks.PASSED
    assert "×1.90 [" in amp.part("speed").message and "agrees" in amp.part("speed").message
    slow = checks.amp("g-base", ["g-slow"])
    assert slow.status == checks.FAILED and "tensor cores busy" in slow.message
    assert slow.part("code").status == checks.PASSED
    layout = checks.channels_last(["g-slow"], baseline_id="g-base")
    assert layout.status == checks.PASSED and layout.part("speed").status == checks.INFO
    assert checks.tf32("g-base", ["g-amp"]).status == checks.FAILED  # the flag was not observed on
    loader = checks.dataloader("g-base", "g-amp")
    assert loader.status == checks.PASSED and loader.part("speed").status == checks.PASSED
    assert loader.part("pinned memory") is None
    assert checks.dataloader("g-base", "g-slow").status == checks.FAILED
    placement = checks.on_device(["g-stu"])
    assert placement.status == checks.FAILED and "TODO TP1.1" in placement.message and "cuda" in placement.message
    assert checks.on_device(["g-amp"]).message == "weights and batches were on the GPU"
    bn = checks.sync_bn(["g-ddp-cpu-bn"])
    assert bn.status == checks.FAILED and "convert_sync_batchnorm" in bn.message


def test_syncbatchnorm_is_judged_on_the_running_statistics_each_rank_kept(runs):
    """On GPUs: SyncBatchNorm's ranks keep the same running statistics, plain BatchNorm's part; a SyncBatchNorm run
    whose ranks parted fails (the layers did not synchronise), and the message gives both spreads."""
    synced = {**SOLUTION, "sync_bn": True}
    write(runs, "bn-plain", observed=SOLUTION, gpu=True, world_size=2, bn_means=[[0.5, -0.2], [0.45, -0.21]])
    write(runs, "bn-sync", observed=synced, options={**OPTIONS, "sync_bn": True}, gpu=True, world_size=2,
          bn_means=[[0.48, -0.2], [0.48, -0.2]])
    write(runs, "bn-parted", observed=synced, options={**OPTIONS, "sync_bn": True}, gpu=True, world_size=2,
          bn_means=[[0.48, -0.2], [0.40, -0.2]])
    result = checks.sync_bn(["bn-plain", "bn-sync"])
    assert result.status == checks.PASSED, result.message
    assert "SyncBatchNorm: the ranks' running statistics 0.0e+00 apart" in result.message
    assert "plain BatchNorm: the ranks' running statistics 1.0e-01 apart" in result.message
    parted = checks.sync_bn(["bn-plain", "bn-parted"])
    assert parted.status == checks.FAILED and "did not synchronise" in parted.message and "1.7e-01" in parted.message


def test_a_truncated_trace_fails_the_profiler_check_with_the_file_name(runs):
    write(runs, "cut", observed=SOLUTION, trace=TRACES / "cpu_2steps.pt.trace.json")
    trace = next((runs / "cut" / "profile").iterdir())
    trace.write_text(trace.read_text()[:1500])
    result = checks.profiler(["cut"])
    assert result.status == checks.FAILED and trace.name in result.message
    assert "not a complete Chrome trace" in result.message
    gz = trace.with_name(trace.name + ".gz")
    gz.write_bytes(gzip.compress((TRACES / "cuda_ddp_2steps.pt.trace.json").read_bytes()))
    trace.unlink()
    cuda = checks.profiler(["cut"])
    assert cuda.status == checks.PASSED and "2 profiled step(s)" in cuda.details[0]


def test_not_applicable_in_the_display_and_the_machine_readable_copy(cpu_records, tmp_path, capsys):
    result = checks.sync_bn(["sol-ddp"])
    assert "➖ TP2.3 SyncBatchNorm: not applicable on this hardware:" in capsys.readouterr().out
    bundle = result._repr_mimebundle_()
    payload = bundle[checks.MIME]
    assert set(payload) == {"check", "status", "passed", "mark", "message", "parts", "details", "info"}
    assert (payload["status"], payload["passed"], payload["mark"]) == ("not applicable", True, "➖")
    assert "➖" in bundle["text/html"] and "#6e7781" in bundle["text/html"]
    amp = checks.amp("base", ["sol"])._repr_mimebundle_()[checks.MIME]
    assert [(p["name"], p["status"]) for p in amp["parts"]] == [("code", "passed"), ("speed", "not applicable")]
    assert amp["parts"][1]["mark"] == "➖" and amp["parts"][1]["message"].startswith("not applicable on this hardware")
    notebook = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "data": {**bundle, checks.MIME: json.dumps(payload)}}]}]}
    path = tmp_path / "executed.ipynb"
    path.write_text(json.dumps(notebook))
    assert checks.results_in_notebook(path) == [payload]
    board = checks.scoreboard()
    assert board.set_index("check").loc["TP2.3 SyncBatchNorm", "result"] == "➖"
    assert list(board["status"]) == ["not applicable", "passed"]


def test_result_basics():
    assert checks.CheckResult("x", True, "fine").status == checks.PASSED
    assert checks.CheckResult("x", False, "no").mark == "❌"
    with pytest.raises(ValueError):
        checks.CheckResult("x", "maybe", "?")
    from dlokit.checks.framework import check

    @check("a check that breaks")
    def broken(job_ids):
        raise KeyError("surprise")

    result = broken("1")
    assert result.status == checks.FAILED and "could not run (KeyError" in result.message
    assert broken.check_name == "a check that breaks" and checks.CHECKS["broken"] == "a check that breaks"
    del checks.CHECKS["broken"]


def test_a_part_whose_message_names_it_says_its_name_once():
    """A part's message may begin with its name, so that it reads alone when it heads the check (DeepSpeed's
    "ZeRO-1: no rank holds optimizer states"); listed under the check, the name is not said twice."""
    from dlokit.checks.framework import FAILED, PASSED, from_parts, part

    parts = [part("ZeRO-1", PASSED, "ZeRO-1: each rank holds 0.50 of the optimizer"),
             part("ZeRO-2", FAILED, "ZeRO-2: each rank keeps grads whole")]
    result = from_parts(parts, "each shards what its stage says")
    assert result.message == "ZeRO-2: each rank keeps grads whole"
    assert [str(p) for p in parts] == ["✅ ZeRO-1: each rank holds 0.50 of the optimizer",
                                       "❌ ZeRO-2: each rank keeps grads whole"]
    assert str(part("speed", PASSED, "faster")) == "✅ speed: faster"
