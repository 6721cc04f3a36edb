"""Day 4, memory: what each rank holds, measured from its tensors by train_llm.py, against the model
(dlokit.memory_model), under DDP, ZeRO-1 and FSDP2 (with and without resharding after forward); the
collectives each step issues; the calculator widget and the views; a DDP job that runs out of memory
under the job's limit while FSDP2 fits (through the kit, on both backends); FSDP2 leaving cleanly.

The reference solution (tp_scripts/llm/solutions/train_llm.py) runs on 2 gloo ranks, tiny config, fp32.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlokit.memory_model import estimate, estimate_for_run, per_rank_table
import preloaded
from ranks import run_ranks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "tp_scripts" / "llm" / "solutions" / "train_llm.py"
STUDENT = ROOT / "tp_scripts" / "llm" / "train_llm.py"
ZERO1 = ROOT / "tp_scripts" / "llm" / "zero1_optimizer.py"  # TP4.1's file, imported by train_llm.py
COMMON = ["--config", "tiny", "--steps", "2", "--batch-size", "8", "--seq-len", "64"]
RUNS = {  # name -> options, all on 2 ranks but the single process
    "single": [],
    "ddp": ["--mode", "ddp"],
    "zero1": ["--mode", "zero1"],
    "fsdp": ["--mode", "fsdp"],
    "fsdp-no-reshard": ["--mode", "fsdp", "--no-reshard-after-forward"],
}
STATES = ("params", "grads", "optimizer")


def launch(runs_dir, run_id, args, nproc=2, script=SOLUTION, check=True, timeout=240):
    env = {**os.environ, "DLOKIT_RUN_ID": run_id, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        env.pop(key, None)
    command = [sys.executable, str(script), *args, "--runs-dir", str(runs_dir)]
    result = (preloaded.run(command, env=env, timeout=timeout) if nproc == 1 else
              run_ranks(command, nproc, env, timeout=timeout))
    if check and result.returncode != 0:
        raise AssertionError(f"{run_id} failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return result


def summary(runs_dir, run_id, rank=0):
    return json.loads((Path(runs_dir) / run_id / f"rank{rank}" / "summary.json").read_text())


def config(runs_dir, run_id):
    return json.loads((Path(runs_dir) / run_id / "rank0" / "run.json").read_text())["config"]


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("day4-memory")
    for name, options in RUNS.items():
        launch(folder, name, COMMON + options, nproc=1 if name == "single" else 2)
    return folder


def memory(runs_dir, name, rank=0):
    return summary(runs_dir, name, rank)["memory_bytes"]


def states(measured):
    return sum(measured[key] for key in STATES)


# ---- measured: FSDP2 holds 1/N of DDP's model states, ZeRO-1 1/N of its optimizer states ----

def test_fsdp_holds_half_of_ddp_model_states_per_rank(runs_dir):
    """Parameters, gradients and AdamW states per rank, from the tensors (DTensor local shards): on 2
    ranks FSDP2 holds half of what DDP holds, within the sharding granularity (each weight is cut along
    its first dimension, padded to a multiple of 2 rows: at most one row of each weight)."""
    ddp = [memory(runs_dir, "ddp", r) for r in range(2)]
    fsdp = [memory(runs_dir, "fsdp", r) for r in range(2)]
    assert ddp[0] == ddp[1] and states(ddp[0]) > 0
    for rank in range(2):
        for key in STATES:
            assert fsdp[rank][key] == pytest.approx(ddp[rank][key] / 2, rel=0.01), (key, fsdp[rank], ddp[rank])
    assert states(fsdp[0]) + states(fsdp[1]) == pytest.approx(states(ddp[0]), rel=0.01)  # nothing held twice


def test_zero1_shards_only_the_optimizer_states(runs_dir):
    """ZeroRedundancyOptimizer gives each rank whole parameters to update (a greedy partition by size):
    each rank's states are half of DDP's within the largest parameter's states; weights and gradients stay whole."""
    ddp, zero = memory(runs_dir, "ddp"), [memory(runs_dir, "zero1", r) for r in range(2)]
    largest_state = 2 * 4 * 256 * 64  # AdamW's m and v of the embedding (the largest weight), fp32
    for rank in range(2):
        assert zero[rank]["params"] == ddp["params"] and zero[rank]["grads"] == ddp["grads"]
        assert abs(zero[rank]["optimizer"] - ddp["optimizer"] / 2) <= largest_state, zero[rank]
    assert zero[0]["optimizer"] + zero[1]["optimizer"] == pytest.approx(ddp["optimizer"], rel=1e-3)
    assert summary(runs_dir, "zero1")["optimizer"] == "ZeroRedundancyOptimizer"


def test_resharding_after_forward_keeps_fewer_weights_gathered(runs_dir):
    """With resharding, a block's gathered weights are freed after its forward (the root's are kept):
    fewer gathered bytes at once than without, where every block stays gathered until backward."""
    whole = memory(runs_dir, "single")["params"]
    resharded, kept = memory(runs_dir, "fsdp")["gathered_params_peak"], memory(runs_dir, "fsdp-no-reshard")["gathered_params_peak"]
    assert kept == whole                   # every weight gathered at once
    assert 0 < resharded < 0.5 * whole     # the root (embedding, output) and one block
    # without resharding, its peak holds what ZeRO-2 holds: the whole weights, gradients and optimizer states as shards
    ddp, zero2 = memory(runs_dir, "ddp"), memory(runs_dir, "fsdp-no-reshard")
    for key in ("grads", "optimizer"):
        assert zero2[key] == pytest.approx(ddp[key] / 2, rel=0.02), (key, zero2, ddp)
    assert memory(runs_dir, "ddp")["gathered_params_peak"] is None


def test_activations_are_per_local_batch(runs_dir):
    """Saved activations are counted per rank: half the batch per rank, half the bytes."""
    single, ddp = memory(runs_dir, "single")["activations_peak"], memory(runs_dir, "ddp")["activations_peak"]
    assert ddp == pytest.approx(single / 2, rel=0.02)
    assert memory(runs_dir, "fsdp")["activations_peak"] == ddp


# ---- modelled vs measured ----

@pytest.mark.parametrize("name", list(RUNS))
def test_memory_model_agrees_with_the_measurement(runs_dir, name):
    """estimate_for_run(config) against the busiest rank: model states within 1 %, saved activations
    within 5 % (the model counts them tensor by tensor; see dlokit.memory_model)."""
    predicted = estimate_for_run(config(runs_dir, name))
    for rank in range(1 if name == "single" else 2):
        measured = memory(runs_dir, name, rank)
        assert predicted.weights == pytest.approx(measured["params"], rel=0.01)
        assert predicted.gradients == pytest.approx(measured["grads"], rel=0.01)
        assert predicted.optimizer == pytest.approx(measured["optimizer"], rel=0.02 if name == "zero1" else 0.01)
        assert predicted.activations == pytest.approx(measured["activations_peak"], rel=0.05)


def test_memory_model_stages_ranks_precision_optimizer_and_checkpointing():
    shape = {"dim": 1024, "n_layers": 8, "n_heads": 16, "n_kv_heads": 4, "ffn_dim": 4096, "vocab_size": 32000,
             "tie_embeddings": False}
    psi = 8 * (2 * 1024 * 1024 + 2 * 1024 * 256 + 3 * 1024 * 4096 + 2 * 1024) + 2 * 32000 * 1024 + 1024
    per_rank = {stage: estimate(shape, batch_size=1, seq_len=128, dp=8, zero=stage, precision="bf16-mixed")
                for stage in range(4)}
    assert [per_rank[s].weights / psi for s in range(4)] == [2, 2, 2, 2 / 8]
    assert [per_rank[s].gradients / psi for s in range(4)] == [2, 2, 2 / 8, 2 / 8]
    assert [per_rank[s].optimizer / psi for s in range(4)] == [12, 12 / 8, 12 / 8, 12 / 8]
    assert per_rank[3].gathered > 0 and per_rank[2].gathered == 0
    amp = estimate(shape, batch_size=1, seq_len=128, precision="bf16-amp")
    assert (amp.weights, amp.gradients, amp.optimizer) == (4 * psi, 4 * psi, 8 * psi)
    assert estimate(shape, batch_size=1, seq_len=128, precision="fp32", optimizer="sgd").optimizer == 0
    assert estimate(shape, batch_size=1, seq_len=128, precision="bf16-mixed", optimizer="sgd").optimizer == 4 * psi
    resharded = estimate(shape, batch_size=1, seq_len=128, dp=8, zero=3)
    kept = estimate(shape, batch_size=1, seq_len=128, dp=8, zero=3, reshard_after_forward=False)
    assert kept.gathered > resharded.gathered
    plain = estimate(shape, batch_size=4, seq_len=512)
    checkpointed = estimate(shape, batch_size=4, seq_len=512, activation_checkpointing=True)
    assert checkpointed.activations < plain.activations / 3 and checkpointed.recomputed > 0
    assert estimate(shape, batch_size=8, seq_len=512).activations == pytest.approx(2 * plain.activations)
    for bad in ({"optimizer": "lamb"}, {"precision": "fp8"}, {"zero": 4}, {"dp": 0}):
        with pytest.raises(ValueError):
            estimate(shape, batch_size=1, seq_len=8, **bad)


def test_calculator_widget_recomputes_its_table():
    """The real ipywidgets: changing the ZeRO stage changes the table it shows."""
    from dlokit.memory_model import calculator

    widget = calculator()
    controls = {child.description: child for child in widget.children[:-1]}
    output = widget.children[-1]

    def total_shown() -> float:
        text = "".join(str(o.get("text", "")) for o in output.outputs)
        return float(text.split(" GiB per rank")[0].split()[-1])

    ddp = total_shown()  # Llama-3.2-3B, bf16-mixed, 8 ranks: 16 bytes a weight on every rank, > 48 GiB
    controls["ZeRO"].value = 3
    fsdp = total_shown()
    assert ddp > 48 and fsdp < ddp / 3, (ddp, fsdp)  # the activations (~8 GiB) are not sharded
    controls["model"].value = "Llama-3.1-70B"
    assert total_shown() > fsdp
    table = per_rank_table({"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128,
                            "vocab_size": 256, "tie_embeddings": False}, batch_size=1, seq_len=16)
    assert table.loc["total", "GiB per rank"] > 0


# ---- the collectives a step issues, as the dispatcher saw them ----

def test_collectives_of_a_step_per_data_parallel_strategy(runs_dir):
    """DDP all-reduces every gradient once; ZeRO-1 adds a broadcast of every weight from its owner;
    FSDP2 reduce-scatters every gradient, all-gathers every block's weights twice (forward, and again in
    backward) when resharding and once when not."""
    whole = memory(runs_dir, "single")["params"]
    ddp = summary(runs_dir, "ddp")["collectives_per_step"]
    zero = summary(runs_dir, "zero1")["collectives_per_step"]
    fsdp = summary(runs_dir, "fsdp")["collectives_per_step"]
    kept = summary(runs_dir, "fsdp-no-reshard")["collectives_per_step"]
    assert ddp["allreduce"]["bytes"] == whole
    assert zero["allreduce"]["bytes"] == whole and zero["broadcast"]["bytes"] >= whole
    assert fsdp["reduce_scatter"]["bytes"] == whole and "allreduce" not in fsdp
    assert fsdp["allgather"]["calls"] == 2 * 4 + 1 and kept["allgather"]["calls"] == 4 + 1  # 4 blocks + root
    assert kept["allgather"]["bytes"] == whole // 2  # each rank hands over its shard once
    assert summary(runs_dir, "single")["collectives_per_step"] == {}


# ---- the student's TODO TP4.1 ----

def test_untouched_zero1_todo_keeps_every_optimizer_state(tmp_path, runs_dir):
    """The generated student copy builds a plain AdamW for --mode zero1: its measured optimizer states
    per rank do not shrink (the check the notebook makes fails), the solution's do."""
    launch(tmp_path, "student-zero1", COMMON + RUNS["zero1"], script=STUDENT)
    student = memory(tmp_path, "student-zero1")
    assert student["optimizer"] == memory(runs_dir, "ddp")["optimizer"]
    assert memory(runs_dir, "zero1")["optimizer"] < 0.6 * student["optimizer"]
    assert "TODO TP4.1" in ZERO1.read_text() and "ZeroRedundancyOptimizer(" not in ZERO1.read_text()
    assert "TODO" not in STUDENT.read_text()  # the loop beside it has nothing to edit


def test_untouched_fsdp_todo_keeps_the_whole_model_and_fails_its_check(runs_dir, monkeypatch):
    """The generated parallel_fsdp.py shards nothing (TODO TP4.2): each rank keeps every weight. The check the
    notebook makes fails it, naming the TODO, and passes the solution's run."""
    import dlokit
    from dlokit import checks

    launch(runs_dir, "student-fsdp", COMMON + RUNS["fsdp"], script=STUDENT)
    for rank in (0, 1):
        assert memory(runs_dir, "student-fsdp", rank)["params"] == memory(runs_dir, "single")["params"]
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(runs_dir))
    dlokit.use_profile("local")
    assert checks.fsdp_sharding("fsdp", "single").status == "passed"
    result = checks.fsdp_sharding("student-fsdp", "single")
    assert result.status == "failed" and "TODO TP4.2" in result.message, result.message
    assert "TODO TP4.2" in (STUDENT.parent / "parallel_fsdp.py").read_text()


# ---- the views ----

def test_memory_views_put_model_and_measurement_side_by_side(runs_dir):
    from dlokit.analysis.llm_memory import memory_comparison, memory_plot

    names = ["ddp", "zero1", "fsdp", "fsdp-no-reshard"]
    table = memory_comparison(names, runs_dir)
    assert list(table["source"]) == ["modelled", "measured"] * 4
    measured = table[table["source"] == "measured"].set_index("run_id")
    assert measured["states_ratio"].between(0.99, 1.01).all(), measured
    assert measured.loc["fsdp", "params"] == pytest.approx(measured.loc["ddp", "params"] / 2, rel=0.01)
    assert list(measured["mode"]) == ["ddp ×2", "zero1 ×2", "fsdp ×2", "fsdp no-reshard = ZeRO-2 ×2"]
    figure = memory_plot(names + ["missing-run"], runs_dir)
    bars = [p for p in figure.axes[0].patches]
    assert len(bars) == 4 * 2 * 5  # runs x (modelled, measured) x categories
    assert any("missing-run" in t.get_text() for t in figure.texts)


def test_every_ranks_memory_is_shown_not_only_the_busiest(runs_dir):
    from dlokit.analysis.llm_memory import rank_memory_plot, rank_memory_table

    table = rank_memory_table(["ddp", "zero1", "fsdp"], runs_dir)
    assert list(zip(table["run_id"], table["rank"])) == [(r, k) for r in ("ddp", "zero1", "fsdp") for k in (0, 1)]
    by = table.set_index(["run_id", "rank"])
    assert by.loc[("ddp", 0), "optimizer"] == by.loc[("ddp", 1), "optimizer"]  # replicas hold the same
    for rank in (0, 1):  # ZeRO-1: each rank keeps the optimizer states of its partition only
        assert by.loc[("zero1", rank), "optimizer"] < 0.75 * by.loc[("ddp", rank), "optimizer"]
    assert by.loc[("zero1", 0), "optimizer"] + by.loc[("zero1", 1), "optimizer"] == pytest.approx(
        by.loc[("ddp", 0), "optimizer"], rel=0.01)
    figure = rank_memory_plot(["ddp", "zero1", "fsdp", "missing-run"], runs_dir)
    assert len(figure.axes[0].patches) == 3 * 2 * 5  # runs x ranks x categories
    assert any("missing-run" in t.get_text() for t in figure.texts)


def test_each_ranks_collectives_of_a_step_are_drawn(runs_dir):
    """The traffic view reads every rank's collectives_per_step: each FSDP2 rank reduce-scatters all the gradients
    (its input is the whole gradient) and hands half the weights to each round of all-gathers; DDP's ranks all-reduce
    them all."""
    from dlokit.analysis.step_traffic import traffic_plot, traffic_table

    whole = memory(runs_dir, "single")["params"] / 2**20
    table = traffic_table(["single", "ddp", "fsdp", "fsdp-no-reshard"], runs_dir)
    by = table.set_index(["run_id", "rank", "collective"])
    for rank in (0, 1):
        assert by.loc[("ddp", rank, "allreduce"), "MiB"] == pytest.approx(whole)
        assert by.loc[("fsdp", rank, "reduce_scatter"), "MiB"] == pytest.approx(whole)
        assert by.loc[("fsdp", rank, "allgather"), "calls"] == 2 * by.loc[("fsdp-no-reshard", rank, "allgather"), "calls"] - 1
        assert by.loc[("fsdp-no-reshard", rank, "allgather"), "MiB"] == pytest.approx(whole / 2)
    assert "single" not in set(table["run_id"])  # one process hands nothing over
    figure = traffic_plot(["single", "ddp", "fsdp", "fsdp-no-reshard"], runs_dir)
    assert len(figure.axes[0].get_xticks()) == 3 * 2  # a bar per rank of each run with collectives
    # stacked by collective: DDP all-reduces and broadcasts its buffers (the RoPE tables), FSDP gathers and scatters
    assert len(figure.axes[0].patches) == 2 * (2 + 2 + 2) == len(table)
    assert any("no collective logged (one process)" in t.get_text() for t in figure.texts)


def test_loss_match_view_against_the_single_process(runs_dir):
    from dlokit.analysis.loss_match import loss_match_table, loss_overlay

    table = loss_match_table(["ddp", "zero1", "fsdp"], reference="single", runs_dir=runs_dir)
    assert table["matched"].all() and (table["max_abs_dloss"] < 1e-5).all(), table
    assert (table["steps_compared"] == 2).all()
    figure = loss_overlay(["ddp", "zero1", "fsdp"], reference="single", runs_dir=runs_dir)
    assert len(figure.axes[0].lines) == 4  # the reference and three runs


# ---- DDP out of memory, FSDP2 fits: the margin of the notebook's limit ----

def oom_demo_limit() -> dict:
    from dlokit.analysis.llm_memory import model_config, oom_demo_limit_mb

    return oom_demo_limit_mb(model_config(SOLUTION.parent, "oom-demo"), ranks=2, batch_size=2, seq_len=16)


@pytest.mark.slow
def test_ddp_peak_is_well_above_fsdp_peak(tmp_path):
    """TP4.2's margin, from the records of unlimited runs: what DDP's tensors need per rank is at least 1.25 x
    what FSDP2's do (the 95 M weights' 16 bytes each against half of them on 2 ranks), and the notebook's limit
    sits between the two with room on both sides."""
    options = ["--config", "oom-demo", "--batch-size", "2", "--seq-len", "16", "--steps", "1"]
    launch(tmp_path, "ddp", options + ["--mode", "ddp"])
    launch(tmp_path, "fsdp", options + ["--mode", "fsdp", "--meta-init"])
    from dlokit.analysis import load_run

    def peak(run_id):
        measured = [s["memory_bytes"] for s in load_run(tmp_path / run_id).summaries]
        return max(sum(float(m.get(k) or 0) for k in ("params", "grads", "optimizer", "activations_peak",
                                                     "gathered_params_peak")) for m in measured) / 2**20

    ddp, fsdp = peak("ddp"), peak("fsdp")
    assert ddp >= 1.25 * fsdp, (ddp, fsdp)
    limit = oom_demo_limit()["limit_mb"]
    assert 1.2 * fsdp < limit < ddp, (fsdp, limit, ddp)


@pytest.mark.slow
def test_a_limit_counts_tensors_not_the_autograd_threads_fsdp_starts(tmp_path):
    """FSDP2's first backward (through its DTensor weights) starts the autograd engine's 8 device threads, whose
    reserved stacks (64 MiB) RLIMIT_DATA counts: before they were started ahead of the limit, FSDP2 of the small
    config needed 150 MiB where DDP needed 123 (measured by bisection). Under 100 MiB FSDP2 now completes and DDP,
    which holds twice the weights' states and the gradient buckets, runs out of memory (bisected on 2026-11-28 on
    a fresh 2-core machine: FSDP2 between 85 and 90 MiB, DDP between 110 and 120; the session before measured 55
    and 91 on its machine, where 80 sat between them)."""
    from dlokit.analysis import load_run

    options = ["--config", "small", "--seq-len", "64", "--batch-size", "4", "--steps", "2", "--memory-limit", "100"]
    launch(tmp_path, "fsdp", options + ["--mode", "fsdp", "--meta-init"])
    result = launch(tmp_path, "ddp", options + ["--mode", "ddp"], check=False)
    assert result.returncode != 0 and load_run(tmp_path / "ddp").oom, result.stderr[-2000:]
    assert load_run(tmp_path / "fsdp").state == "completed"


# TP4.2 itself (DDP runs out of memory under the notebook's limit, FSDP2 completes under the same one, both
# recorded as such) runs in Day 4's notebook on both backends: tests/test_notebooks.py, local and Slurm.


# ---- FSDP2 leaves cleanly, every time ----

@pytest.mark.slow
def test_fsdp_exits_cleanly_every_time(tmp_path):
    """A completed FSDP2 run on 2 gloo ranks used to end with SIGABRT on rank 0 ("terminate called without
    an active exception"): a gloo worker thread freeing a finished collective's tensors while Python
    finalises (dlokit.in_job.peers.leave_now; issue 12 saw 2 runs in 9, 1 in 12 here under load). A 1-in-5
    failure survives these 3 runs with 0.8^3 = 51 %, and the suite's other FSDP2 runs on 2 ranks (Day 4's
    notebook, the parallel and checkpoint tests: 15 more) check the exit status too: 0.8^18 < 2 %."""
    failures = []
    for attempt in range(3):
        result = launch(tmp_path, f"exit-{attempt}", ["--mode", "fsdp", "--config", "tiny", "--steps", "2",
                                                      "--batch-size", "4", "--seq-len", "32"], check=False)
        if result.returncode != 0 or "terminate called" in result.stderr:
            failures.append((attempt, result.returncode, result.stderr[-1500:]))
    assert not failures, failures


def _fake_gpu(monkeypatch, total_mib):
    """A CUDA device of `total_mib` MiB, as the allocator's limit sees it; returns the fractions it was given."""
    import torch
    from types import SimpleNamespace

    fractions = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=total_mib * 2**20))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda fraction, device: fractions.append(fraction))
    return fractions


def test_a_memory_limit_above_the_gpu_is_lowered_to_it_and_the_record_says_so(monkeypatch, capsys):
    import torch
    from tp_imports import common

    fractions = _fake_gpu(monkeypatch, 40960)
    kept = common("device_memory", llm=True).limit_memory(48939, torch.device("cuda", 0))
    assert fractions == [1.0]
    assert kept["memory_limit_mb"] == 40960 and kept["memory_limit_requested_mb"] == 48939
    assert "more than this GPU's 40960 MiB: lowered" in kept["memory_limit_note"]
    assert "lowered" in capsys.readouterr().err


def test_a_memory_limit_within_the_gpu_applies_as_asked(monkeypatch):
    import torch
    from tp_imports import common

    fractions = _fake_gpu(monkeypatch, 81920)
    kept = common("device_memory", llm=True).limit_memory(20480, torch.device("cuda", 0))
    assert fractions == [0.25] and kept == {"memory_limit_mb": 20480, "memory_limit_on": "cuda allocator"}


def test_on_cuda_the_model_counts_adamws_foreach_temporaries():
    """torch.optim.AdamW's foreach step (CUDA's default) allocates sqrt(v): 4 bytes a weight it updates."""
    config = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 176, "vocab_size": 256,
              "tie_embeddings": False}
    from dlokit.memory_model import params_on_rank

    psi = params_on_rank(config)
    for zero, dp, share in ((0, 1, 1), (1, 4, 4), (3, 4, 4)):
        cpu, cuda = (estimate(config, batch_size=2, seq_len=16, dp=dp, zero=zero, cuda=c) for c in (False, True))
        assert cuda.optimizer_step == pytest.approx(4 * psi / share) and cpu.optimizer_step == 0
        assert cuda.total - cpu.total == pytest.approx(4 * psi / share)
    assert estimate(config, batch_size=2, seq_len=16, optimizer="sgd", cuda=True).optimizer_step == 0


def test_the_oom_demo_limit_refuses_a_batch_the_ranks_cannot_split():
    """Planned for max(1, 2 // 4) before: a limit for a job train_llm.py refuses (exit 2) at --batch-size 2 on 4 ranks."""
    from dlokit.analysis.llm_memory import model_config, oom_demo_limit_mb

    with pytest.raises(ValueError, match="--batch-size 2 does not split over 4 ranks"):
        oom_demo_limit_mb(model_config(SOLUTION.parent, "oom-demo"), ranks=4, batch_size=2, seq_len=16)
