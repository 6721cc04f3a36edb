"""TP1.5, fit_levers.py: k micro-batches are the large batch's maths where nothing depends on the batch (GroupNorm),
not with BatchNorm, by what the TP reports; the solution passes its check and the untouched student copy fails it,
naming the TODO; under one memory limit the plain step runs out of memory and the levers fit, read from the records."""
import os
import sys
from pathlib import Path

import preloaded
import pytest
import torch
import torch.nn as nn

import dlokit
from dlokit.analysis import fit_levers as view
from dlokit.checks.day1 import fit_levers as fit_check
from tp_imports import common, load_script

REPO = Path(__file__).resolve().parents[1]
SOLUTION, STUDENT = REPO / "tp_scripts" / "solutions" / "fit_levers.py", REPO / "tp_scripts" / "fit_levers.py"
SMALL = ["--image-size", "16", "--batch-size", "16", "--micro-batches", "4", "--steps", "2"]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """The checks read the current profile's runs folder: the local profile's, pointed here."""
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    dlokit.use_profile("local")
    return tmp_path


def one_step(script, norm: str, micro_batches: int):
    """(loss, gradient norm, weights after the step) of one step from seeded weights on one seeded batch: the plain
    step for micro_batches 0, else the script's accumulated_step (its accumulate_step, one optimizer step)."""
    harness = common("fit_harness")
    model = harness.build_model("resnet18", 10, norm, "cpu", seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    images, labels = torch.randn(16, 3, 16, 16, generator=generator), torch.randint(0, 10, (16,), generator=generator)
    if micro_batches:
        loss = script.accumulated_step(model, optimizer, nn.functional.cross_entropy, images, labels, micro_batches)
    else:
        loss = script.plain_step(model, optimizer, nn.functional.cross_entropy, images, labels)
    return float(loss), harness.grad_norm(model), torch.cat([p.detach().flatten() for p in model.parameters()])


def test_accumulation_is_the_large_batch_without_batch_statistics_and_differs_with_batchnorm():
    script = load_script(SOLUTION)
    loss, norm, weights = one_step(script, "group", 0)
    k_loss, k_norm, k_weights = one_step(script, "group", 4)
    assert abs(k_loss - loss) / loss < 1e-5 and abs(k_norm - norm) / norm < 1e-5
    assert torch.allclose(k_weights, weights, rtol=0, atol=1e-6)  # one optimizer step, on the same gradients
    loss, norm, _ = one_step(script, "batch", 0)
    k_loss, k_norm, _ = one_step(script, "batch", 4)
    assert abs(k_norm - norm) / norm > 100 * view.ROUNDING  # each micro-batch normalised by its own statistics
    assert abs(k_loss - loss) / loss > view.ROUNDING


def run(runs: Path, script: Path, *options, run_id: str, expect: int = 0) -> str:
    env = {**os.environ, "DLOKIT_RUN_ID": run_id, "DLOKIT_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1"}
    result = preloaded.run([sys.executable, str(script), *options], env=env, timeout=300)
    assert result.returncode == expect, result.stderr[-3000:]
    return run_id


def test_the_solution_passes_and_reports_the_batchnorm_difference_it_measured(runs):
    job = run(runs, SOLUTION, *SMALL, "--norm-lesson", "batch,group", "--norm-steps", "1", run_id="fit-solution")
    result = fit_check([job])
    assert result.status == "passed", result
    assert {p.name: p.status for p in result.parts}["BatchNorm lesson"] == "passed"
    table = view.norm_table(job)
    batch, group = (table[table["norm"] == norm].iloc[0] for norm in ("batch", "group"))
    script = load_script(SOLUTION)  # the first step again, here: what the TP reports is what the step computes
    for norm, row in (("batch", batch), ("group", group)):
        first_batch = common("fit_harness").fixed_batches("synthetic", 16, 16, 4, "cpu", 0)[0][0]  # the run's first
        model = {how: common("fit_harness").build_model("resnet18", 10, norm, "cpu", 0) for how in ("p", "a")}
        optimizers = {how: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for how, m in model.items()}
        plain = script.plain_step(model["p"], optimizers["p"], nn.functional.cross_entropy, *first_batch)
        accumulated = script.accumulated_step(model["a"], optimizers["a"], nn.functional.cross_entropy, *first_batch, 4)
        assert float(plain) == pytest.approx(row["loss_plain"], rel=1e-6)
        assert float(accumulated) == pytest.approx(row["loss_accumulate"], rel=1e-6)
    assert batch["grad_norm_apart"] > 100 * group["grad_norm_apart"] and group["grad_norm_apart"] < view.ROUNDING
    levers = view.lever_table(job).set_index("lever")
    assert levers.loc["gradient accumulation", "memory_verdict"] == "falls: agrees"
    assert levers.loc["activation checkpointing", "memory_verdict"] == "falls: agrees"


def test_the_untouched_student_copy_fails_its_check_naming_the_todo(runs):
    assert "TODO TP1.5" in STUDENT.read_text() and "checkpoint(self.block" not in STUDENT.read_text()
    job = run(runs, STUDENT, *SMALL, "--norm-lesson", "batch,group", "--norm-steps", "1", run_id="fit-student")
    result = fit_check([job])
    assert result.status == "failed" and "TODO TP1.5" in result.message, result
    parts = {p.name: p for p in result.parts}
    assert parts["checkpointing"].status == "failed" and "TODO TP1.5" in parts["checkpointing"].message
    assert parts["BatchNorm lesson"].status == "failed"
    # no effect shown for a lever that did not happen: the same computation, said so
    assert all(parts[f"memory and time, {lever}"].message.startswith("same computation")
               for lever in ("accumulate", "checkpoint"))
    assert view.lever_table(job).set_index("lever").loc["gradient accumulation", "time_x"] == "no effect to judge"


def test_under_one_limit_the_plain_step_runs_out_of_memory_and_the_levers_fit(runs):
    measured = run(runs, SOLUTION, *SMALL, "--levers", "plain", run_id="fit-measure")
    limit = view.scan_limit(measured, 128)
    scan = ["--image-size", "16", "--batch-size", "128", "--micro-batches", "4", "--steps", "0",
            "--memory-limit", str(limit)]
    ids = [run(runs, SOLUTION, *scan, "--levers", "plain", run_id="fit-plain", expect=3),
           run(runs, SOLUTION, *scan, "--levers", "accumulate", run_id="fit-accumulate"),
           run(runs, SOLUTION, *scan, "--levers", "checkpoint", run_id="fit-checkpoint")]
    table = view.scan_table(ids)
    assert dict(zip(table["lever"], table["outcome"])) == {"plain": "out of memory", "accumulate": "fits",
                                                           "checkpoint": "fits"}
    assert (table["limit_mib"] == limit).all() and table.loc[table["outcome"] == "fits", "held_mib"].lt(limit).all()
    assert "plain large batch out of memory" in view.describe(table)


def test_under_ddp_the_gradients_are_reduced_once_per_accumulated_step(tmp_path):
    """model.no_sync() on every micro-batch but the last: DDP's buckets go to the all-reduce once a step, not k times
    (a comm hook counts them; one gloo rank is enough for DDP to run its reducer)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    script = load_script(SOLUTION)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(12, 4)))
        reduced = []

        def count(state, bucket):
            reduced.append(bucket.index())
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
            return future

        model.register_comm_hook(None, count)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        script.accumulated_step(model, optimizer, nn.functional.cross_entropy, torch.randn(8, 3, 2, 2),
                               torch.randint(0, 4, (8,)), 4)
        assert len(reduced) == 1  # one bucket (a small model), reduced once
    finally:
        dist.destroy_process_group()
