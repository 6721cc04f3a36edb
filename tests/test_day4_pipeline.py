"""Day 4, pipeline: every stage records each micro-batch's forward and backward (pp_event lines), and the
measured bubble falls with the number of micro-batches, as (p - 1) / (m + p - 1) says.

The bubble runs use a workload where compute dominates the fixed costs of a micro-batch (32 x 128 tokens
per step; at m = 4 a micro-batch of the tiny model is about 6 ms of forward) and one thread per rank,
pinned to its own core (bench/pin_rank.py): with 16 x 64 tokens, or two unpinned ranks sharing the cores,
send/receive waits and the schedule's own work weigh as much as the compute and the trend drowns. The
bubble is a wall-clock measurement, so its tests are marked `alone`: scripts/test.sh runs them after the
parallel tests, with the machine's cores to themselves (beside another test's jobs, m = 2 measured 0.24 and
m = 8 0.27 in CI).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlokit.analysis.pipeline import bubble_plot, bubble_table, pipeline_events, pipeline_timeline

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tp_scripts" / "llm" / "solutions" / "train_llm.py"
PIN = ROOT / "bench" / "pin_rank.py"
COMPUTE_BOUND = ["--config", "tiny", "--batch-size", "32", "--seq-len", "128", "--steps", "5", "--warmup", "2"]
SMALL = ["--config", "tiny", "--batch-size", "8", "--seq-len", "64", "--steps", "2", "--warmup", "0"]


def launch(runs_dir, run_id, options):
    env = {**os.environ, "DLOKIT_RUN_ID": run_id, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_ID"):
        env.pop(key, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(PIN),
               str(SCRIPT), "--mode", "pp", *options, "--runs-dir", str(runs_dir)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{run_id} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return run_id


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pipeline") / "runs"


@pytest.fixture(scope="module")
def gpipe_runs(runs_dir):
    return {m: launch(runs_dir, f"gpipe-m{m}", COMPUTE_BOUND + ["--pp-schedule", "gpipe", "--microbatches", str(m)])
            for m in (1, 2, 8)}


@pytest.fixture(scope="module")
def schedule_runs(runs_dir):
    return {name: launch(runs_dir, name, SMALL + ["--pp-schedule", name, "--microbatches", "4"])
            for name in ("1f1b", "interleaved")}


def assert_complete(runs_dir, run_id, stages, microbatches, steps):
    """Every step: each stage forwards and backwards each micro-batch once, inside the step's span; the
    last stage computes each micro-batch's loss."""
    events = pipeline_events(run_id, runs_dir)
    assert not events.empty
    for step in range(1, steps + 1):
        got = events[events["step"] == step]
        for stage in range(stages):
            mine = got[got["stage"] == stage]
            for phase in ("fwd", "bwd"):
                assert sorted(mine.loc[mine["phase"] == phase, "microbatch"]) == list(range(microbatches)), \
                    (run_id, step, stage, phase)
            losses = sorted(mine.loc[mine["phase"] == "loss", "microbatch"])
            assert losses == (list(range(microbatches)) if stage == stages - 1 else []), (run_id, step, stage)
        assert (got["t_start"] >= 0).all() and (got["t_end"] > got["t_start"]).all()
    for rank in (0, 1):
        lines = [json.loads(line) for line in (runs_dir / run_id / f"rank{rank}" / "metrics.jsonl").open()]
        for line in (line for line in lines if line["kind"] == "step"):
            mine = events[(events["rank"] == rank) & (events["step"] == line["step"])]
            busy = (mine["t_end"] - mine["t_start"]).sum()
            assert mine["t_end"].max() <= line["pp_span_s"] + 1e-6          # within the common step window
            assert line["pp_busy_s"] == pytest.approx(busy, rel=1e-6)       # the busy time is the events' sum
            assert line["pp_idle_fraction"] == pytest.approx(1 - busy / line["pp_span_s"], rel=1e-6)


def test_every_stage_records_every_micro_batch(runs_dir, schedule_runs):
    assert_complete(runs_dir, schedule_runs["1f1b"], stages=2, microbatches=4, steps=2)
    assert_complete(runs_dir, schedule_runs["interleaved"], stages=4, microbatches=4, steps=2)  # 2 stages per rank
    figure = pipeline_timeline(schedule_runs["interleaved"], runs_dir=runs_dir)
    assert len(figure.axes[0].get_yticklabels()) == 4


@pytest.mark.alone
def test_measured_bubble_falls_with_micro_batches(runs_dir, gpipe_runs):
    for m, run_id in gpipe_runs.items():
        assert_complete(runs_dir, run_id, stages=2, microbatches=m, steps=5)
    table = bubble_table([gpipe_runs[m] for m in (1, 2, 8)], runs_dir).set_index("m")
    measured = table["bubble_measured"]
    assert list(table["bubble_theory"]) == pytest.approx([1 / 2, 1 / 3, 1 / 9])
    assert measured[1] > measured[2] > measured[8], table.to_string()
    assert all(len(stages) == 2 for stages in table["idle_by_stage"])


@pytest.mark.alone
def test_views_draw_the_timeline_and_the_bubble(runs_dir, gpipe_runs):
    figure = pipeline_timeline(gpipe_runs[8], runs_dir=runs_dir)
    ax = figure.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["stage 0 (rank 0)", "stage 1 (rank 1)"]
    # one bar collection per stage and phase: fwd, bwd on both stages, the loss on the last
    assert len(ax.collections) == 5
    plot = bubble_plot(list(gpipe_runs.values()), runs_dir)
    measured_line = plot.axes[0].lines[0]
    assert list(measured_line.get_xdata()) == [1, 2, 8]
    missing = pipeline_timeline("no-such-run", runs_dir=runs_dir)
    assert "missing" in missing.axes[0].texts[0].get_text()


def write_gpipe(runs_dir, run_id, m, idle, cpu):
    """A two-stage GPipe record: each rank's idle fraction, and its (cpu_window_s, cores_busy_s, own_cpu_s)."""
    from dlokit.in_job.runrecord import RunRecorder

    for rank in (0, 1):
        recorder = RunRecorder({"mode": "pp", "pp": 2, "pp_schedule": "gpipe", "microbatches": m, "warmup": 0},
                               rank=rank, world_size=2, run_id=run_id, runs_dir=runs_dir, script="train_llm.py")
        recorder.log("step", step=1, pp_idle_fraction=idle)
        recorder.finish(steps=1, pp_microbatches=m, **dict(zip(("cpu_window_s", "cores_busy_s", "own_cpu_s"), cpu)))


@pytest.mark.parametrize("other_work, status", [(0.2, "failed"), (0.6, "not applicable")])
def test_a_bubble_that_grew_fails_unless_other_work_had_the_cores(tmp_path, monkeypatch, other_work, status):
    from dlokit import checks

    cores = len(os.sched_getaffinity(0))  # the records' cores: this process's
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(tmp_path))
    write_gpipe(tmp_path, "m1", 1, 0.40, (2.0, 2.0, 1.0))  # the two ranks' 1 s each: nobody else
    write_gpipe(tmp_path, "m4", 4, 0.45, (2.0, 2.0 + other_work * 2.0 * cores, 1.0))  # rose: measured 0.40 → 0.45
    result = checks.pipeline_bubble(["m1", "m4"]).as_json()
    assert result["status"] == status, result
    if status == "not applicable":
        assert "of run m4's cores busy" in result["message"]


@pytest.mark.alone
def test_records_tell_runs_alone_from_runs_beside_other_work(runs_dir, gpipe_runs):
    """The gpipe runs above had the cores to themselves; one run beside two spinning processes did not."""
    from dlokit.analysis import load_run
    from dlokit.analysis.overlap import BUSY_SHARE, foreign_cpu_share

    alone = [foreign_cpu_share(load_run(run_id, runs_dir)) for run_id in gpipe_runs.values()]
    spin = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(len(os.sched_getaffinity(0)))]
    try:
        beside = foreign_cpu_share(load_run(launch(runs_dir, "gpipe-beside", COMPUTE_BOUND + ["--pp-schedule", "gpipe", "--microbatches", "2"]),
                                            runs_dir))
    finally:
        for spinner in spinners:
            spinner.kill()
    assert max(alone) < BUSY_SHARE < beside, (alone, beside)
