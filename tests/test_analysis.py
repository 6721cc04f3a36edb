"""Analysis helpers on real run records (written by RunRecorder) and a real torch.profiler trace."""
import json
import math
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np
import pandas as pd
import pytest
import torch

import dlokit
from dlokit import analysis
from dlokit.analysis.profiler import CATEGORIES
from dlokit.in_job.runrecord import RunRecorder


def figure_texts(figure):
    texts = [t.get_text() for t in figure.texts]
    if figure._suptitle is not None:
        texts.append(figure._suptitle.get_text())
    for ax in figure.axes:
        texts += [t.get_text() for t in ax.texts] + [ax.get_title()]
    return "\n".join(texts)


def line(figure, label=None, marker=None, ax=0):
    for candidate in figure.axes[ax].lines:
        if (label is None or candidate.get_label() == label) and (marker is None or candidate.get_marker() == marker):
            return candidate
    raise AssertionError(f"no line label={label} marker={marker}")


def log_steps(recorder, n, batch, t_data=0.01, t_step=0.05, world_size=1, mem=None, epoch_size=5):
    for step in range(1, n + 1):
        fields = dict(epoch=(step - 1) // epoch_size, step=step, lr=0.1 * step / n, loss=2.0 / step,
                      acc=min(1.0, step / n), batch_size=batch * world_size, t_data=t_data, t_h2d=0.001,
                      t_forward=t_step * 0.3, t_backward=t_step * 0.6, t_optimizer=t_step * 0.1 - 0.001,
                      t_step=t_step, throughput_train=batch * world_size / (t_data + t_step),
                      throughput_compute=batch * world_size / t_step)
        if mem is not None:
            fields["gpu_mem_mb"] = mem
        recorder.log("step", **fields)
        if step % epoch_size == 0:
            epoch = (step - 1) // epoch_size
            recorder.log("epoch", epoch=epoch, train_loss=2.0 / step, train_acc=step / n, epoch_time_s=1.0,
                         throughput_train=fields["throughput_train"])
            recorder.log("val", epoch=epoch, step=step, val_loss=2.5 / step, val_acc=0.5 * step / n, val_acc5=0.9)


DDP_OBSERVED = {"ddp_wrapped": True, "sampler": "DistributedSampler"}


def write_run(runs_dir, run_id, *, batch=32, steps=10, world_size=1, t_data=0.01, t_step=0.05, mem=None,
              energy=None, finish=True, observed=None, interval=None, cpu=None, **config):
    """A synthetic run record; `interval` = (start, end) unix times of its measurement (default: a slot
    of its own, so that synthetic runs do not overlap unless a test says so); `cpu` = each rank's
    (cpu_window_s, cores_busy_s, own_cpu_s) on cores 0 and 1."""
    config = {"batch_size": batch, "model": "tiny", "amp": False, "channels_last": False, "num_workers": 0,
              **config}
    start, end = interval or next_slot()
    for rank in range(world_size):
        recorder = RunRecorder(config, rank=rank, world_size=world_size, run_id=run_id, runs_dir=runs_dir,
                               script="train_tiny.py",
                               extra={"observed": observed or (DDP_OBSERVED if world_size > 1 else {})})
        recorder.amend(measurement={**recorder.header["measurement"], "started_unix": start, "cpus": [0, 1]})
        log_steps(recorder, steps, batch, t_data, t_step, world_size, mem)
        if not finish:
            recorder._metrics.close()
            continue
        recorder.finish(steps=steps, epochs=steps // 5, first_step_load_s=0.2, t_data=t_data, t_step=t_step,
                        ended_unix=end,
                        throughput_train=batch * world_size / (t_data + t_step),
                        throughput_compute=batch * world_size / t_step, gpu_mem_peak_mb=mem,
                        host_rss_peak_mb=500.0 + rank, energy_j=energy, peak_power_w=energy and 300.0,
                        val_acc=0.5, best_val_acc=0.5,
                        **(dict(zip(("cpu_window_s", "cores_busy_s", "own_cpu_s"), cpu)) if cpu else {}))


_slots = iter(range(1_000_000, 2_000_000, 100))


def next_slot():
    start = next(_slots)
    return start, start + 50


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for run_id, batch in (("1001", 32), ("1002", 64), ("1003", 128)):
        write_run(root, run_id, batch=batch, mem=1000.0 + 3.0 * batch, energy=100.0 + batch, name=f"bs{batch}")
    with pytest.raises(torch.OutOfMemoryError):
        with RunRecorder({"batch_size": 256, "model": "tiny"}, run_id="1004", runs_dir=root) as recorder:
            log_steps(recorder, 1, 256, mem=1800.0)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    write_run(root, "1005", steps=12, finish=False, name="still-going")
    write_run(root, "1006", steps=7, finish=False)
    with open(root / "1006" / "rank0" / "metrics.jsonl", "a") as handle:
        handle.write('{"kind": "step", "epoch": 1, "step": 8, "lo')
    return root


@pytest.fixture(scope="module")
def loader_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    trials = ((0, False, False, None, False, 0.40), (4, True, True, 2, True, 0.002), (2, True, False, 2, False, 0.05))
    for index, (workers, pin, non_blocking, prefetch, persistent, t_data) in enumerate(trials):
        write_run(root, f"20{index}", num_workers=workers, pin_memory=pin, non_blocking=non_blocking,
                  prefetch_factor=prefetch, persistent_workers=persistent, t_data=t_data)
    return root


@pytest.fixture(scope="module")
def scaling_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaling")
    for world_size, t_step in ((1, 0.05), (2, 0.055), (4, 0.0625)):
        write_run(root, f"30{world_size}", world_size=world_size, t_data=0.0, t_step=t_step, steps=5)
    write_run(root, "399", world_size=8, finish=False, steps=0)
    return root


def test_load_run_states(runs_dir):
    assert analysis.load_run("1001", runs_dir).state == "completed"
    failed = analysis.load_run("1004", runs_dir)
    assert failed.state == "failed" and failed.oom and "OutOfMemoryError" in failed.error
    running = analysis.load_run("1005", runs_dir)
    assert running.state == "running or killed" and not running.truncated
    assert running.describe_state() == "run 1005 (still-going): running or killed, 12 steps so far"
    killed = analysis.load_run(runs_dir / "1006")
    assert killed.truncated and len(killed.steps) == 7
    missing = analysis.load_run("9999", runs_dir)
    assert missing.state == "missing" and missing.metrics.empty and missing.steps.empty
    assert analysis.list_run_ids(runs_dir) == [f"100{i}" for i in range(1, 7)]


def test_runs_table_rows(runs_dir):
    table = analysis.runs_table(runs_dir=runs_dir).set_index("run_id")
    assert list(table.index) == [f"100{i}" for i in range(1, 7)]
    assert table.loc["1002", "batch_size"] == 64 and table.loc["1002", "name"] == "bs64"
    assert table.loc["1002", "throughput_train"] == pytest.approx(64 / 0.06)
    assert table.loc["1003", "gpu_mem_peak_mb"] == 1384.0 and table.loc["1003", "energy_j"] == 228.0
    assert table.loc["1004", "state"] == "failed" and table.loc["1004", "oom"]
    assert table.loc["1005", "throughput_train"] == pytest.approx(32 / 0.06)
    assert table.loc["1005", "steps"] == 12 and table.loc["1005", "val_acc"] == pytest.approx(0.5 * 10 / 12)
    assert table.loc["1006", "truncated"] and table.loc["1006", "steps"] == 7


def test_runs_table_with_missing_run(runs_dir):
    table = analysis.runs_table(["1001", "nope"], runs_dir=runs_dir)
    assert list(table["state"]) == ["completed", "missing"]


def test_dashboard_complete_and_partial(runs_dir):
    figure = analysis.dashboard("1003", runs_dir)
    assert len(figure.axes) == 4
    assert "run 1003 (bs128): completed, 10 steps" in figure_texts(figure)
    throughput = line(figure, label="train", ax=1)
    assert list(throughput.get_xdata()) == list(range(1, 11))
    assert [p.get_height() for p in figure.axes[2].patches] == [1384.0, 500.0]
    assert "running or killed, 12 steps so far" in figure_texts(analysis.dashboard("1005", runs_dir))
    assert "truncated" in figure_texts(analysis.dashboard("1006", runs_dir))
    assert "missing" in figure_texts(analysis.dashboard("4242", runs_dir))


def test_compare_runs_ratios_and_notes(runs_dir):
    table, figure = analysis.compare_runs(["1001", "1003", "1004", "4242"], baseline="1003", runs_dir=runs_dir)
    ratios = dict(zip(table["arm"], table["ratio"]))
    assert ratios["1003"] == pytest.approx(1.0) and ratios["1001"] == pytest.approx(0.25)
    assert [p.get_height() for p in figure.axes[0].patches][:2] == pytest.approx([32 / 0.06, 128 / 0.06])
    assert "run 4242: missing" in figure_texts(figure)
    bundle = analysis.compare_runs(["1001"], runs_dir=runs_dir)._repr_mimebundle_()
    assert "<img" in bundle["text/html"] and bundle["image/png"]  # saved notebooks keep the chart as a PNG
    with pytest.raises(ValueError, match="unknown metric"):
        analysis.compare_runs(["1001"], metric="speed", runs_dir=runs_dir)


def test_run_picker_filters_and_compares(runs_dir):
    picker = analysis.run_picker(runs_dir)
    assert len(picker.runs.options) == 6
    picker.filter.value = "still"
    assert [v for _, v in picker.runs.options] == ["1005"]
    picker.filter.value = "bs64"
    assert [v for _, v in picker.runs.options] == ["1002"]
    picker.filter.value = ""
    picker.runs.value = ("1001", "1002")
    picker.baseline.value = "1002"
    picker.metric.value = "gpu_mem_peak_mb"
    assert list(picker.comparison.table["ratio"]) == pytest.approx([1096 / 1192, 1.0])
    assert "gpu_mem_peak_mb" in picker.output.outputs[-1]["data"]["text/html"]
    picker.runs.value = ()
    assert picker.output.outputs == () and picker.comparison is None


def test_memory_vs_batch_fit_and_oom(runs_dir):
    table = analysis.memory_table(analysis.load_runs(None, runs_dir))
    fit = analysis.memory_fit(table)
    assert fit["model_mb"] == pytest.approx(1000.0) and fit["activation_mb_per_sample"] == pytest.approx(3.0)
    figure = analysis.memory_vs_batch(None, runs_dir)
    assert list(line(figure, label="GPU peak allocated (max_memory_allocated)").get_xdata()) == [32, 64, 128]
    assert figure.axes[0].get_ylabel() == "GPU peak allocated (MiB)"
    oom = line(figure, label="out of memory")
    assert list(oom.get_xdata()) == [256] and oom.get_ydata()[0] == pytest.approx(1768.0)
    assert "run 1006: running or killed" in figure_texts(figure)


def test_memory_fit_through_two_points_has_no_interval_and_shows_nothing(runs_dir):
    table = analysis.memory_table(analysis.load_runs(None, runs_dir))
    fits = table[(table["state"] == "completed") & ~table["oom"]].dropna(subset=["batch_size", "peak_mb"])
    fit = analysis.memory_fit(fits.head(2))
    assert fit["points"] == 2 and fit["slope_shown"] is False and math.isnan(fit["slope_low"])
    assert analysis.memory_fit(table)["slope_shown"] is True  # three points on a line: an interval above 0


def test_batch_scan_names_the_largest_batch_that_fits_and_reads_the_memory_line(runs_dir):
    jobs, sizes = ["1001", "1002", "1003", "1004"], [32, 64, 128, 256]
    scan = analysis.batch_scan(jobs, sizes, ["COMPLETED"] * 3 + ["OUT_OF_MEMORY"], on_gpu=True, model_states_mib=128,
                               runs_dir=runs_dir)
    assert scan.largest_fitting == 128 and list(scan.oom["batch_size"]) == [256]
    text = str(scan)
    assert text.startswith("out of memory from batch 256 on; the largest batch that fits: 128")
    assert "1000 MiB that do not depend on the batch + 3.00" in text and "128 MiB" in text
    two = analysis.batch_scan(jobs[:2], sizes[:2], ["COMPLETED"] * 2, on_gpu=False, model_states_mib=128,
                              runs_dir=runs_dir)
    assert str(two).splitlines() == ["no out-of-memory in this scan (host memory measured)",
                                     "two batch sizes only: the line through them (3.00 MiB per image) has no interval, "
                                     "so it cannot tell activations from noise; add sizes to BATCH_SWEEP "
                                     "(GPU_BATCH_SWEEP on a GPU)"]
    none = analysis.batch_scan(jobs[3:], sizes[3:], ["OUT_OF_MEMORY"], on_gpu=True, model_states_mib=1,
                               runs_dir=runs_dir)
    assert none.largest_fitting is None and "the largest batch that fits: none" in str(none)


def test_the_memory_line_reads_the_tensors_a_step_holds_where_host_rss_hides_them(tmp_path):
    """Day 1 on a CPU (issue 49): host RSS ~760 MiB moving by tens of MiB hid 0.43 MiB per image (the slope read
    0.04 [-1.71–1.80] in one course run); the tensors a step holds show it with an interval above 0."""
    rss = {8: 790.0, 16: 741.0, 32: 772.0, 64: 760.0}  # what the process's peak did across a scan
    for batch, host in rss.items():
        with RunRecorder({"batch_size": batch, "model": "tiny"}, run_id=f"m{batch}", runs_dir=tmp_path) as recorder:
            log_steps(recorder, 4, batch)
            recorder.finish(steps=4, host_rss_peak_mb=host, tensor_held_mib=128.0 + 0.43 * batch + 0.01 * (batch % 3),
                            tensor_saved_mib=0.43 * batch)
    jobs = [f"m{b}" for b in rss]
    assert not analysis.memory_fit(analysis.memory_table(jobs, tmp_path, memory="host"))["slope_shown"]
    table = analysis.memory_table(jobs, tmp_path)
    fit = analysis.memory_fit(table)
    assert table.attrs["memory"] == "tensors" and fit["slope_shown"]
    assert 0 < fit["slope_low"] <= 0.43 <= fit["slope_high"] < 0.45 and fit["model_mb"] == pytest.approx(128, abs=0.1)
    figure = analysis.memory_vs_batch(jobs, tmp_path)
    assert figure.axes[0].get_ylabel() == "tensors held by a step (MiB)"
    assert line(figure, label="tensors a step holds (autograd's saved activations + weights, gradients, optimizer "
                              "states)").get_xdata().tolist() == [8, 16, 32, 64]
    text = str(analysis.batch_scan(jobs, list(rss), ["COMPLETED"] * 4, on_gpu=False, model_states_mib=128,
                                   runs_dir=tmp_path))
    assert "+ 0.43 [" in text and "MiB per image (95 % interval), measured on the tensors a step holds" in text
    assert "within noise" not in text and "interpreter" not in text
    assert "16-bit copies" not in text and "in fp32 autocast keeps no copies" in text  # no --amp: no copies to name


def write_scan_run(runs_dir, run_id, batch, images_per_s, spread, seed):
    """A run whose settled steps compute `images_per_s` ± `spread` (a fraction), as a noisy machine gives."""
    rng = np.random.default_rng(seed)
    with RunRecorder({"batch_size": batch, "model": "tiny"}, run_id=run_id, runs_dir=runs_dir) as recorder:
        for step in range(1, 13):
            t_step = batch / (images_per_s * (1 + spread * rng.uniform(-1, 1)))
            recorder.log("step", step=step, batch_size=batch, t_data=0.0, t_step=t_step,
                         throughput_compute=batch / t_step, throughput_train=batch / t_step)
        recorder.finish(steps=12)


def test_the_scan_keeps_a_smaller_batch_only_when_shown_within_5_percent_of_every_larger_one(tmp_path):
    # quiet: 32 computes 98 % of 64's speed, each run's steps within 1 %: one run of each cannot show it as fast,
    # since a second run of one command may differ by ±30 % here (stats.RUN_SPREAD): the largest batch stays
    for run_id, batch, speed in (("q16", 16, 70.0), ("q32", 32, 98.0), ("q64", 64, 100.0)):
        write_scan_run(tmp_path, run_id, batch, speed, spread=0.01, seed=batch)
    table = analysis.batch_speeds(["q16", "q32", "q64"], tmp_path)
    assert list(table["as_fast_as_larger"]) == [False, False, True]
    assert 0.95 > table.loc[1, "low_vs_larger"] > table.loc[0, "low_vs_larger"] and math.isnan(table.loc[2, "low_vs_larger"])
    assert analysis.chosen_batch(["q16", "q32", "q64"], tmp_path) == 64
    # noisy: 16 is 88 % of 64 and their intervals overlap; "within noise" picked 16, nothing shows it as fast: 64
    for run_id, batch, speed in (("n16", 16, 88.0), ("n64", 64, 100.0)):
        write_scan_run(tmp_path, run_id, batch, speed, spread=0.25, seed=batch)
    noisy = analysis.batch_speeds(["n16", "n64"], tmp_path)
    assert noisy.loc[0, "high"] >= noisy.loc[1, "low"]  # the overlap the old rule called a tie
    assert analysis.chosen_batch(["n16", "n64"], tmp_path) == 64
    figure = analysis.throughput_vs_batch(["n16", "n64"], tmp_path)
    assert "chosen: batch 64\n(the largest: no smaller batch shown within 5 % of every larger one)" in figure_texts(figure)
    # the top two equal in truth, the smaller one ahead by its median this time: the choice does not follow it
    write_scan_run(tmp_path, "t32", 32, 100.0, spread=0.2, seed=4)
    write_scan_run(tmp_path, "t64", 64, 100.0, spread=0.2, seed=104)
    tied = analysis.batch_speeds(["t32", "t64"], tmp_path)
    assert tied.loc[0, "throughput_compute"] > tied.loc[1, "throughput_compute"]
    assert not tied.loc[0, "as_fast_as_larger"]
    assert analysis.chosen_batch(["t32", "t64"], tmp_path) == 64
    assert analysis.chosen_batch([], tmp_path) is None and analysis.batch_speeds([], tmp_path).empty


def test_fastest_shown_keeps_the_largest_gain_that_agrees_and_says_why_in_the_verdicts_own_terms():
    from dlokit import lessons
    from dlokit.analysis.stats import Estimate

    def judged(value, low, high, on_gpu=True, effect="amp"):
        return lessons.verdict_of(effect, Estimate(value, low, high, runs=2, steps=20), on_gpu, "x")
    verdicts = {"tf32": judged(1.4, 1.3, 1.5), "bf16": judged(1.5, 1.2, 1.8), "fp16": judged(1.9, 0.8, 3.0)}
    assert analysis.fastest_shown(verdicts, default="fp32") == (
        "bf16", "its gain over fp32 is the largest this machine showed")  # fp16's larger ratio is within noise
    assert analysis.fastest_shown({"fp16": judged(1.9, 0.8, 3.0)}, default="fp32") == (
        "fp32", "fp16 showed no gain over fp32 beyond noise here (×1.90 [0.80–3.00])")
    # one candidate: "the largest" would compare it with nothing (Day 2's loader read so on an H100)
    assert analysis.fastest_shown({"bf16": judged(1.5, 1.2, 1.8)}, default="fp32") == (
        "bf16", "this machine showed its gain over fp32: ×1.50 [1.20–1.80]")
    kept, why = analysis.fastest_shown({"tf32": judged(1.0, 0.8, 1.2), "bf16": judged(0.5, 0.4, 0.6)}, default="fp32")
    assert kept == "fp32" and why == ("tf32 showed no gain over fp32 beyond noise here (×1.00 [0.80–1.20]); "
                                      "bf16 was slower than fp32 here (×0.50 [0.40–0.60])")
    # a gain the lesson says a CPU cannot show: the default stays, and the text does not call a measured gain "none"
    kept, why = analysis.fastest_shown({"channels_last": judged(1.23, 1.02, 1.32, on_gpu=False, effect="channels_last")},
                                       default="NCHW")
    assert kept == "NCHW" and why == ("channels_last's gain does not apply on this hardware: NCHW stays, whatever "
                                      "channels_last measured (×1.23 [1.02–1.32])")


def test_dataloader_trials_sorted_by_load_time(loader_runs):
    trials = analysis.dataloader_trials(None, loader_runs)
    assert list(trials["workers"]) == [4, 2, 0]
    assert list(trials["load_s_per_step"]) == pytest.approx([0.002, 0.05, 0.40])
    assert trials.iloc[0][["pin_memory", "non_blocking", "prefetch_factor", "persistent_workers"]].tolist() == \
        [True, True, 2, True]
    assert trials["host_rss_peak_mb"].notna().all()


def test_scaling_plot_speedup_and_efficiency(scaling_runs):
    table = analysis.scaling_table(None, scaling_runs)
    assert list(table["world_size"]) == [1, 2, 4]
    assert list(table["speedup"]) == pytest.approx([1.0, 2 * 0.05 / 0.055, 4 * 0.05 / 0.0625])
    figure = analysis.scaling_plot(None, scaling_runs)
    assert list(line(figure, label="ideal").get_ydata()) == [1.0, 2.0, 4.0]
    assert line(figure, marker="o", ax=1).get_ydata()[-1] == pytest.approx(80.0)
    assert "run 399: running or killed" in figure_texts(figure)


def test_scaling_refuses_multi_rank_runs_without_ddp_or_sharding(tmp_path):
    write_run(tmp_path, "501", world_size=1, t_step=0.05)
    write_run(tmp_path, "502", world_size=2, t_step=0.05, observed={"ddp_wrapped": False, "sampler": "RandomSampler"})
    with pytest.raises(analysis.ScalingError, match="without DistributedDataParallel"):
        analysis.scaling_table(["501", "502"], tmp_path)
    write_run(tmp_path, "503", world_size=2, t_step=0.05, observed={"ddp_wrapped": True, "sampler": "RandomSampler"})
    with pytest.raises(analysis.ScalingError, match="own shard"):
        analysis.scaling_table(["501", "503"], tmp_path)
    assert "not a valid scaling comparison" in figure_texts(analysis.scaling_plot(["501", "502"], tmp_path))


def test_no_more_rounds_for_a_scaling_comparison_that_cannot_be_made(tmp_path, monkeypatch):
    """day.submit_until_decided asks verdicts.scaling_decided: ranks without DDP (TODO TP2.2 untouched) make no speed-up
    to judge, so another round would only cost time (the student course ran two more before, 2026-11-29)."""
    from dlokit.analysis import verdicts

    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(tmp_path))
    dlokit.use_profile("local")
    write_run(tmp_path, "601", world_size=1, t_step=0.05)
    # twice as slow a step on 2 ranks: no speed-up, which alone would read "within noise" and ask for another round
    write_run(tmp_path, "602", world_size=2, t_step=0.1, observed={"ddp_wrapped": False, "sampler": "RandomSampler"})
    assert verdicts.scaling_decided(["601", "602"]) is True


def test_an_unreadable_run_is_a_row_of_the_scaling_table_not_a_refusal(tmp_path):
    write_run(tmp_path, "511", world_size=1, t_step=0.05)
    write_run(tmp_path, "512", world_size=2, t_step=0.06, observed={"ddp_wrapped": True,
                                                                     "sampler": "DistributedSampler"})
    (tmp_path / "513" / "rank0").mkdir(parents=True)
    (tmp_path / "513" / "rank0" / "run.json").write_text("[1, 2]")  # not a run record
    table = analysis.scaling_table(["511", "512", "513"], tmp_path)
    assert table["world_size"].tolist()[:2] == [1, 2] and table["speedup"].notna().tolist() == [True, True, False]
    assert table["run_id"].iloc[-1] == "513" and "unreadable" in table["note"].iloc[-1]
    assert "run 513: unreadable" in figure_texts(analysis.scaling_plot(["511", "512", "513"], tmp_path))


def test_a_timed_run_that_met_epoch_ends_says_so_in_the_scaling_table(tmp_path):
    # Day 2's first data set: 320 images, batch 64 per rank, 10 timed steps: 1 rank went through 2 epochs, 2 ranks
    # through 4 (every rank reads 160 images an epoch), and each epoch's first batch waited for the loader
    sharded = {**DDP_OBSERVED, "samples_per_rank_per_epoch": 160}
    write_run(tmp_path, "521", world_size=1, steps=10, test=True, observed={"samples_per_rank_per_epoch": 320})
    write_run(tmp_path, "522", world_size=2, steps=20, test=True, observed=sharded)
    table = analysis.scaling_table(["521", "522"], tmp_path)
    assert "ran over 2 epochs (320 images per rank each)" in table["note"].iloc[0]
    assert "ran over 4 epochs (160 images per rank each)" in table["note"].iloc[1]
    assert "larger data set (TRAIN_PER_CLASS)" in table["note"].iloc[1]
    # the same runs within one epoch, or a real training (not a timed --test run): nothing to say
    write_run(tmp_path, "523", world_size=1, steps=4, test=True)
    write_run(tmp_path, "524", world_size=2, steps=4, test=True, observed=sharded)
    write_run(tmp_path, "525", world_size=2, steps=20, observed=sharded)
    assert analysis.scaling_table(["523", "524"], tmp_path)["note"].tolist() == ["", ""]
    assert analysis.scaling_table(["523", "525"], tmp_path)["note"].tolist() == ["", ""]


def test_efficiency_above_100_percent_always_has_its_reason(tmp_path):
    baseline_slot, other = (10_000, 10_100), (10_050, 10_150)
    write_run(tmp_path, "601", world_size=1, t_data=0.0, t_step=0.10, interval=baseline_slot)
    write_run(tmp_path, "602", world_size=2, t_data=0.0, t_step=0.04)  # 2.5x on 2 ranks
    write_run(tmp_path, "699", world_size=1, t_data=0.0, t_step=0.01, interval=other)  # ran beside the baseline
    table = analysis.scaling_table(["601", "602"], tmp_path)
    above = table[table["efficiency"] > 1.0]
    assert len(above) == 1 and "overlapped" in above["note"].iloc[0] and "601" in above["note"].iloc[0]
    assert table.attrs["kind"] == "weak"
    figure = analysis.scaling_plot(["601", "602"], tmp_path)
    assert "> 100 %" in figure_texts(figure) and "weak scaling" in figure_texts(figure)


def test_overlapping_runs_are_flagged_in_every_comparison(tmp_path):
    write_run(tmp_path, "701", interval=(20_000, 20_100))
    write_run(tmp_path, "702", interval=(20_090, 20_200))  # overlaps 701 by 10 s on the same cores
    write_run(tmp_path, "703", interval=(20_300, 20_400))
    assert analysis.overlapping(["701", "702", "703"], tmp_path) == {"701": ["702"], "702": ["701"], "703": []}
    table, figure = analysis.compare_runs(["701", "702", "703"], runs_dir=tmp_path)
    assert list(table["overlapped_by"]) == ["702", "701", ""]
    assert "overlapped" in figure_texts(figure)
    assert list(analysis.dataloader_trials(["703", "701"], tmp_path)["overlapped_by"]) in (["", "702"], ["702", ""])


def test_work_outside_the_course_on_a_runs_cores_is_flagged(tmp_path):
    """Two ranks on cores 0-1 for 10 s: 20 core-seconds. The cores were busy 19 s, the ranks used 9 + 9 s:
    1 s (5 %) was someone else's. In 802, 10 s (50 %) was."""
    write_run(tmp_path, "801", world_size=2, cpu=(10.0, 19.0, 9.0))
    write_run(tmp_path, "802", world_size=2, t_step=0.2, cpu=(10.0, 19.0, 4.5))
    write_run(tmp_path, "803", world_size=2)  # a record without the evidence
    table = analysis.runs_table(["801", "802", "803"], tmp_path)
    assert table["foreign_cpu"].tolist()[:2] == [0.05, 0.5] and pd.isna(table["foreign_cpu"].iloc[2])
    assert table["overlapped_by"].tolist() == ["", "", ""]  # no course run was beside them
    table, figure = analysis.compare_runs(["801", "802", "803"], runs_dir=tmp_path)
    texts = figure_texts(figure)
    assert "50 % of run 802's cores" in texts and "run 801's" not in texts and "run 803's" not in texts
    write_run(tmp_path, "804", world_size=1, t_step=0.04, cpu=(10.0, 10.0, 5.0))  # 25 %: at the threshold, not over
    write_run(tmp_path, "805", world_size=1, t_step=0.04, cpu=(10.0, 12.0, 5.0))
    assert analysis.scaling_table(["804", "801"], tmp_path)["note"].tolist() == ["", ""]
    notes = analysis.scaling_table(["805", "801"], tmp_path)["note"].tolist()
    assert "other work kept 35 % of its cores busy" in notes[0] and notes[1] == ""


def test_foreign_share_counts_pinned_ranks_on_their_own_cores(tmp_path):
    from dlokit.analysis.overlap import foreign_cpu_share

    write_run(tmp_path, "811", world_size=2, cpu=(10.0, 10.0, 9.0))
    run = analysis.load_run("811", tmp_path)
    assert foreign_cpu_share(run) == pytest.approx(0.0)  # one core set: 10 busy − 18 own is no foreign work
    for rank, core in ((0, 0), (1, 1)):  # now each rank pinned to its core: each core had 1 s of someone else
        path = tmp_path / "811" / f"rank{rank}" / "run.json"
        record = json.loads(path.read_text())
        record["measurement"]["cpus"] = [core]
        path.write_text(json.dumps(record))
    assert foreign_cpu_share(analysis.load_run("811", tmp_path)) == pytest.approx(0.1)


def test_runs_on_other_cores_or_hosts_do_not_overlap(tmp_path):
    from dlokit.analysis.overlap import Interval

    a = Interval("a", "node1", 0, 10, frozenset({0}), None)
    assert not a.overlaps(Interval("b", "node1", 5, 15, frozenset({1}), None))
    assert not a.overlaps(Interval("c", "node2", 5, 15, frozenset({0}), None))
    assert a.overlaps(Interval("d", "node1", 5, 15, None, None))  # unknown cores count as shared
    assert not Interval("g0", "n", 0, 10, None, frozenset({"0"})).overlaps(Interval("g1", "n", 0, 10, None, frozenset({"1"})))


def test_training_curves(runs_dir):
    figure = analysis.training_curves(["1001", "1005", "4242"], runs_dir)
    loss = line(figure, label="1001 (bs32) train")
    assert list(loss.get_xdata()) == list(range(1, 11)) and loss.get_ydata()[1] == pytest.approx(1.0)
    assert list(line(figure, label="1001 (bs32) val", ax=1).get_ydata()) == pytest.approx([0.25, 0.5])
    assert list(line(figure, label="1001 (bs32) train/epoch", ax=1).get_xdata()) == [5, 10]
    assert line(figure, label="1005 (still-going)", ax=2).get_ydata()[-1] == pytest.approx(0.1)
    assert "run 4242: missing" in figure_texts(figure)
    assert "missing" in figure_texts(analysis.training_curves(["4242"], runs_dir))
    assert figure.axes[0].get_yscale() == "linear"


def test_training_curves_name_each_run_by_what_sets_it_apart(tmp_path):
    common = dict(optimizer="sgd", lr=0.05, lr_schedule="cosine")
    write_run(tmp_path, "1127-000000-aaaa", batch=16, global_batch_size=16, lr_scaling="none", warmup_epochs=0, **common)
    write_run(tmp_path, "1127-000000-bbbb", batch=150, global_batch_size=150, lr_scaling="linear", warmup_epochs=1.0,
              **common)
    figure = analysis.training_curves(["1127-000000-aaaa", "1127-000000-bbbb"], tmp_path)
    labels = [text.get_text() for text in figure.axes[2].get_legend().get_texts()]  # one legend, the runs' colours
    assert labels == ["aaaa: global batch 16, no lr scaling, no warm-up",
                      "bbbb: global batch 150, linear lr scaling, 1-epoch warm-up"]
    assert figure.axes[0].get_legend() is None and figure.axes[1].get_legend() is None
    assert "dashed with circles: validation" in figure_texts(figure)


def test_two_ranks_without_ddp_are_not_called_a_larger_global_batch(tmp_path):
    """Day 2's curves on the untouched script (2026-12-03): "2 rank(s), global batch 64 ... ended within noise of one
    rank's" while each rank had trained its own model at batch 32: neither the legend nor the ending says so now."""
    from dlokit.analysis.large_batch import curve_endings

    write_run(tmp_path, "1203-000000-aaaa", batch=32, global_batch_size=32)
    write_run(tmp_path, "1203-000000-bbbb", batch=32, world_size=2, global_batch_size=64,
              observed={"ddp_wrapped": False, "sampler": "RandomSampler"})
    jobs = ["1203-000000-aaaa", "1203-000000-bbbb"]
    labels = [t.get_text() for t in analysis.training_curves(jobs, tmp_path).axes[2].get_legend().get_texts()]
    assert labels[1] == "bbbb: 2 models apart, batch 32 each (no DDP)" and "global batch 32" in labels[0]
    ending = curve_endings(jobs, 32, 2, runs_dir=tmp_path)
    assert "2 rank(s), batch 32 on each of its own models" in ending and "global batch 64" not in ending
    assert "no larger global batch to compare" in ending and "TP2.2" in ending and "within noise" not in ending
    write_run(tmp_path, "1203-000000-cccc", batch=32, world_size=2, global_batch_size=64)  # DDP, sharded
    assert "2 rank(s), global batch 64" in curve_endings([jobs[0], "1203-000000-cccc"], 32, 2, runs_dir=tmp_path)


def test_epoch_times_stack_each_epochs_validation_on_its_training(tmp_path):
    recorder = RunRecorder({"batch_size": 32}, run_id="1201", runs_dir=tmp_path, script="train_classifier.py")
    for epoch, (train_s, val_s) in enumerate([(3.0, 1.0), (2.0, 2.0)]):
        recorder.log("step", step=epoch + 1, epoch=epoch, loss=1.0, acc=0.1, lr=0.1)
        recorder.log("epoch", epoch=epoch, epoch_time_s=train_s, train_loss=1.0, train_acc=0.1)
        recorder.log("val", epoch=epoch, step=epoch + 1, val_time_s=val_s, val_loss=1.0, val_acc=0.2)
    recorder.finish(steps=2, epochs=2)
    ax = analysis.epoch_times(["1201"], tmp_path).axes[0]
    training, validation = ax.containers
    assert [bar.get_height() for bar in training] == [3.0, 2.0]
    assert [(bar.get_y(), bar.get_height()) for bar in validation] == [(3.0, 1.0), (2.0, 2.0)]
    assert "validation: 38% of an epoch" in ax.get_title()  # (1/4 + 2/4) / 2
    test_run = RunRecorder({"batch_size": 32, "test": True}, run_id="1202", runs_dir=tmp_path)
    test_run.log("step", step=1, epoch=0, loss=1.0, acc=0.1, lr=0.1)
    test_run.finish(steps=1)
    assert "no epoch lines" in figure_texts(analysis.epoch_times(["1202"], tmp_path))


def test_a_loss_spanning_decades_is_drawn_on_a_log_scale(tmp_path):
    """A first validation loss of 2,400 (BatchNorm statistics of a few steps) would flatten the train loss."""
    recorder = RunRecorder({"batch_size": 32}, run_id="1101", runs_dir=tmp_path, script="train_classifier.py")
    for step, loss in enumerate([2.4, 2.3, 2.2, 2.1], start=1):
        recorder.log("step", step=step, epoch=1 + (step > 2), loss=loss, acc=0.1, lr=0.1)
    recorder.log("val", step=2, epoch=1, val_loss=2400.0, val_acc=0.1)
    recorder.log("val", step=4, epoch=2, val_loss=2.2, val_acc=0.2)
    recorder.finish(steps=4, epochs=2)
    loss_ax = analysis.training_curves(["1101"], tmp_path).axes[0]
    assert loss_ax.get_yscale() == "log" and "log" in loss_ax.get_title()


def profile_tiny_loop(folder, batch_size, steps=3, worker=None):
    from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

    data = torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randint(0, 10, (512,)))
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(folder), worker_name=worker)) as profiler:
        for index, (x, y) in enumerate(loader):
            with record_function("forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.step()
            if index == steps + 2:
                break


def test_profiler_breakdown_of_real_cpu_trace(tmp_path):
    profile_tiny_loop(tmp_path / "small", 8)
    profile_tiny_loop(tmp_path / "large", 128)
    small = analysis.profiler_breakdown(tmp_path / "small")
    assert list(small.index) == list(CATEGORIES) and small.attrs["steps"] == 3
    assert small.loc[["Kernel", "Memcpy", "Memset", "Runtime"], "ms_per_step"].sum() == 0
    assert small.loc["DataLoader", "ms_per_step"] > 0 and small.loc["CPU Exec", "ms_per_step"] > 0
    assert small["percent"].sum() == pytest.approx(100.0)
    assert small["ms_per_step"].sum() == pytest.approx(small.attrs["step_ms"])
    large = analysis.profiler_breakdown(analysis.trace_files(tmp_path / "large")[0])
    assert large.attrs["step_ms"] > 0
    figure = analysis.breakdown_pie([small, large], titles=["batch 8", "batch 128"])
    assert len(figure.axes) == 2 and "batch 128" in figure.axes[1].get_title()
    wedges = [p.get_label() for p in figure.axes[0].patches]
    assert "CPU Exec" in wedges and "Kernel" not in wedges
    assert "no Chrome-trace" in figure_texts(analysis.breakdown_pie(tmp_path / "empty-folder"))
    # the table a notebook shows: a CPU's empty GPU categories said once, not five rows of 0
    shown = analysis.profiler.breakdown_percents({"batch 8": small, "batch 128": large})
    assert "Kernel" not in shown.index and {"DataLoader", "CPU Exec"} <= set(shown.index)
    assert shown.attrs["notes"][0].startswith("no time in Kernel, Memcpy, Memset") and "had no GPU" in shown.attrs["notes"][0]


def test_profiler_breakdown_of_a_run_folder(tmp_path):
    write_run(tmp_path, "77", steps=3)
    profile_tiny_loop(tmp_path / "77" / "profile", 16, worker="rank0")
    table = analysis.profiler_breakdown(analysis.load_run("77", tmp_path), rank=0)
    assert table.attrs["trace"].endswith(".pt.trace.json") and "rank0." in table.attrs["trace"]
    with pytest.raises(FileNotFoundError):
        analysis.profiler_breakdown(tmp_path / "77", rank=1)


def test_breakdown_prioritises_device_over_host():
    from dlokit.analysis.profiler import _breakdown_events

    events = [{"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100},
              {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 10, "dur": 50},
              {"ph": "X", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 20, "dur": 10},
              {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 25, "dur": 40},
              {"ph": "X", "name": "Memcpy HtoD", "cat": "gpu_memcpy", "ts": 90, "dur": 20}]
    totals, steps, span = _breakdown_events(events)
    assert (steps, span) == (1, 110)
    assert totals == {"Kernel": 40, "Memcpy": 20, "Memset": 0, "Runtime": 5, "DataLoader": 0,
                      "CPU Exec": 10, "Other": 35}


@pytest.fixture(scope="module")
def odd_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("odd")
    write_run(root, "empty-running", steps=0, finish=False)
    with pytest.raises(RuntimeError):
        with RunRecorder({"batch_size": 8}, run_id="failed-at-start", runs_dir=root):
            raise RuntimeError("CUDA error: device-side assert triggered")
    garbage = root / "garbage" / "rank0"
    garbage.mkdir(parents=True)
    (garbage / "run.json").write_text("[1, 2]")
    (garbage / "summary.json").write_text("{not json")
    (garbage / "metrics.jsonl").write_text('42\n"text"\n{"kind": "step", "step": "x", "loss": null}\n{"kind"')
    write_run(root, "half-the-ranks", world_size=2, steps=4)
    for name in ("metrics.jsonl", "run.json"):
        (root / "half-the-ranks" / "rank1" / name).unlink()
    (root / "half-the-ranks" / "rank1" / "summary.json").unlink()
    return root


@pytest.mark.parametrize("helper", ["dashboard", "training_curves", "epoch_times", "memory_vs_batch", "scaling_plot",
                                    "compare_runs", "runs_table", "dataloader_trials"])
@pytest.mark.parametrize("run_id", ["empty-running", "failed-at-start", "garbage", "half-the-ranks", "absent"])
def test_every_helper_survives_partial_runs(odd_runs, helper, run_id):
    function = getattr(analysis, helper)
    runs = analysis.load_run(run_id, odd_runs) if helper == "dashboard" else [analysis.load_run(run_id, odd_runs)]
    result = function(runs) if helper != "dashboard" else function(runs)
    assert result is not None
    state = analysis.load_run(run_id, odd_runs).state
    assert state == {"empty-running": "running or killed", "failed-at-start": "failed", "garbage": "unreadable: rank0/run.json: not a JSON object (a list)",
                     "half-the-ranks": "running or killed", "absent": "missing"}[run_id]


def test_energy_counts_each_physical_gpu_once(tmp_path):
    """NVML's counter belongs to a GPU: two ranks reading the same GPU must not add it twice."""
    for run_id, uuids in (("801", ["GPU-a", "GPU-a"]), ("802", ["GPU-a", "GPU-b"]), ("803", [None, None])):
        for rank, uuid in enumerate(uuids):
            recorder = RunRecorder({"batch_size": 8}, rank=rank, world_size=2, run_id=run_id, runs_dir=tmp_path)
            recorder.finish(energy_j=100.0 + 10 * rank, gpu_uuid=uuid)
    energy = dict(zip(*analysis.runs_table(["801", "802", "803"], tmp_path)[["run_id", "energy_j"]].T.values))
    assert energy == {"801": 110.0, "802": 210.0, "803": 210.0}


def test_the_untuned_large_batch_gets_a_bar_of_its_own():
    """Day 3's optimiser plot: a large-batch run whose LR was not scaled, beside a scaled one of the same
    optimiser and batch, is a bar of its own, not hidden behind it."""
    import pandas as pd

    from dlokit.analysis.large_batch import _bar_labels

    table = pd.DataFrame({"optimizer": ["sgd", "lamb", "sgd", "lamb", "sgd"],
                          "global_batch": [32, 32, 1000, 1000, 1000],
                          "lr_scaling": [None, None, "linear", "sqrt", "none"]})
    assert _bar_labels(table) == ["sgd", "lamb", "sgd", "lamb", "sgd\n(LR not scaled)"]


def test_power_vs_batch_reads_the_gpu_peak_and_says_na_without_a_counter(tmp_path):
    for run_id, batch, watts in (("p1", 32, 180.0), ("p2", 128, 420.0)):
        write_run(tmp_path, run_id, batch=batch, t_step=0.01 * batch / 32, energy=1000.0)
        summary = tmp_path / run_id / "rank0" / "summary.json"
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "peak_power_w": watts}))
    table = analysis.power_table(["p1", "p2"], tmp_path)
    assert table["power_w"].tolist() == [180.0, 420.0] and set(table["source"]) == {"GPU peak (NVML)"}
    # J per image = W / (img/s): 180 / 3,200 and 420 / 3,200 (the compute throughput is the same here)
    assert table["joules_per_image"].tolist() == pytest.approx([180 / 3200, 420 / 3200])
    assert len(analysis.power_vs_batch(["p1", "p2"], tmp_path).axes) == 2

    write_run(tmp_path, "cpu", batch=16)  # no NVML, no RAPL: the record says why
    summary = tmp_path / "cpu" / "rank0" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "peak_power_w": None, "energy_j": None,
                                   "host_energy_unavailable": "no RAPL package zone under /sys/class/powercap"}))
    figure = analysis.power_vs_batch(["cpu"], tmp_path)
    assert "n/a on this hardware (no RAPL package zone" in " ".join(t.get_text() for t in figure.axes[0].texts)


def test_a_checks_line_shows_the_verdicts_ratio_with_its_interval(tmp_path):
    from dlokit.analysis import stats
    from dlokit.checks.records import compare_text

    write_scan_run(tmp_path, "base", 32, 80.0, spread=0.1, seed=1)
    write_scan_run(tmp_path, "other", 32, 100.0, spread=0.1, seed=2)
    base, other = analysis.load_run("base", tmp_path), analysis.load_run("other", tmp_path)
    line = compare_text("compute throughput", other, base, "throughput_compute", "img/s")
    assert line.endswith(f"({stats.ratio(base, other, 'throughput_compute').text()})")  # the verdict's ×… [low–high]
    assert compare_text("host", other, base, "host_rss_peak_mb", "MiB") == "host: not measured"  # no peak recorded


def test_the_allreduce_share_never_says_more_than_its_numbers():
    # course run 2026-11-28: 61 ms exposed against 47 [23-74] ms lost read "about 100 % ... the rest is not waiting"
    said = analysis.allreduce_share(61, (47, 23, 74), profiled_step_ms=289)
    assert "accounts for all of the time lost per step, within noise" in said and "the rest" not in said
    said = analysis.allreduce_share(10, (47, 23, 74))
    assert said.startswith("so waiting for the all-reduce is about 21 % [14–43]") and "the rest, about 37 ms" in said
    said = analysis.allreduce_share(90, (47, 23, 74), profiled_step_ms=289)
    assert "upper bound" in said and "289 ms" in said and "%" not in said
    assert "no loss to attribute" in analysis.allreduce_share(61, (5, -10, 20))


def test_arms_whose_records_show_one_computation_get_no_ratio_no_verdict_and_keep_the_default(tmp_path):
    """TP1.2 untouched (2026-11-28): the bf16 job's logits came out in float32, yet the bars drew ×1.27 [1.12–1.47]
    for bf16 against fp32. The records say both arms computed the same thing: the bar says so, the verdict names the
    TODO, and nothing is kept for the rest of the course."""
    from dlokit import lessons

    fp32 = {"amp_dtype": "float32", "tf32": False, "device": "cpu", "model_device": "cpu"}
    write_run(tmp_path, "fp32", t_step=0.05, amp="none", observed=fp32)
    write_run(tmp_path, "bf16", t_step=0.04, amp="bf16", observed=fp32)  # the TODO untouched: still float32
    write_run(tmp_path, "done", t_step=0.04, amp="bf16", observed={**fp32, "amp_dtype": "bfloat16"})
    comparison = analysis.compare_runs({"fp32": ["fp32"], "bf16": ["bf16"], "done": ["done"]}, "throughput_compute",
                                       baseline="fp32", runs_dir=tmp_path, lesson="amp")
    rows = comparison.table.set_index("arm")
    assert math.isnan(rows.loc["bf16", "ratio"]) and not comparison.ratio("bf16").usable
    assert rows.loc["bf16", "basis"].startswith("same computation: the arm that asked for amp bf16 shows logits in "
                                                "float32, as its baseline does: TODO TP1.2")
    assert rows.loc["done", "ratio"] == pytest.approx(1.25)  # the treatment happened: a ratio as before
    labels = [t.get_text() for t in comparison.figure.axes[0].texts]
    assert "same computation" in labels and not any(t.startswith("×") and "bf16" in t for t in labels)
    assert "bf16: same computation as fp32" in figure_texts(comparison.figure)

    runs = [analysis.load_run(r, tmp_path) for r in ("fp32", "bf16")]
    verdict = lessons.judge("amp", runs[:1], runs[1:], on_gpu=True, what="bf16 against fp32")
    assert verdict.outcome == lessons.SAME_COMPUTATION and "TODO TP1.2" in verdict.text
    assert "agrees" not in verdict.text and "[" not in verdict.text  # no interval drawn as an effect
    assert analysis.fastest_shown({"bf16": verdict}, default="fp32") == (
        "fp32", "bf16 computed the same as fp32: the arm that asked for amp bf16 shows logits in float32, as its "
        "baseline does: TODO TP1.2")
    # the same device on a CPU-only machine, nothing asked: the same computation, no TODO to name
    assert lessons.untreated("gpu_vs_cpu", runs[:1], runs[1:]) == "both arms' records show batches on cpu, weights on cpu"
    # a record without the fact proves nothing
    write_run(tmp_path, "old", t_step=0.04, amp="bf16", observed={"device": "cpu"})
    assert lessons.untreated("amp", runs[:1], [analysis.load_run("old", tmp_path)]) == ""


def write_compile_run(runs_dir, run_id, *, compiled: bool, t_compile: float, compiled_step: float):
    """A compile_bench.py record of the function part: eager, and compile-default (compiled or, compile_with
    untouched, run eagerly with a compile time of 0 s)."""
    rng = np.random.default_rng(5)
    with RunRecorder({"parts": "function"}, run_id=run_id, runs_dir=runs_dir, script="compile_bench.py") as recorder:
        for variant, step, done, seconds in (("eager", 0.010, False, None),
                                             ("compile-default", compiled_step, compiled, t_compile)):
            times = list(step * (1 + 0.02 * rng.standard_normal(12)))
            recorder.log("compile_result", part="function", variant=variant, status="ok", reference="eager",
                         t_compile=seconds, t_step=float(np.median(times)), step_times=times, warmup_steps=1,
                         compiled=done, graphs=1 if done else 0, agrees=True, max_abs_diff=0.0)
        recorder.finish(steps=12)


def test_an_uncompiled_compile_variant_is_eager_against_eager(tmp_path):
    """TP3.3 with compile_with untouched (2026-11-28): "compile-default against eager ... ×1.66 ... agrees", eager
    against eager. Its record says it did not compile: same computation, the TODO named; a compiled one agrees."""
    from dlokit import lessons
    from dlokit.lessons import compile_verdicts

    write_compile_run(tmp_path, "eager-twice", compiled=False, t_compile=0.0, compiled_step=0.006)
    [verdict] = compile_verdicts("eager-twice", on_gpu=False, runs_dir=tmp_path)
    assert verdict.outcome == lessons.SAME_COMPUTATION and "TODO TP3.3" in verdict.text
    assert "compiled False, compile time 0.0 s" in verdict.text and "agrees" not in verdict.text
    write_compile_run(tmp_path, "compiled", compiled=True, t_compile=2.5, compiled_step=0.004)
    [verdict] = compile_verdicts("compiled", on_gpu=False, runs_dir=tmp_path)
    assert verdict.outcome == lessons.AGREES and verdict.estimate.value == pytest.approx(2.5, rel=0.05)


def test_a_comparison_shows_each_number_to_what_its_interval_supports(tmp_path):
    """TP1.2, 2026-11-28: 127.5 and 162.2 in compare_runs beside six decimals in runs_table. Each value and ratio of a
    comparison is shown to two significant digits of its interval's half-width, no more."""
    from dlokit.analysis import stats

    write_scan_run(tmp_path, "a", 32, 120.0, spread=0.1, seed=1)
    write_scan_run(tmp_path, "b", 32, 157.0, spread=0.1, seed=2)
    comparison = analysis.compare_runs({"a": ["a"], "b": ["b"]}, "throughput_compute", runs_dir=tmp_path)
    shown, table = comparison.shown().set_index("arm"), comparison.table.set_index("arm")
    ratio = comparison.ratio("b")
    assert stats.decimals(ratio.low, ratio.high) == 2  # a ratio of one run each: about ±30 %
    assert shown.loc["b", ["ratio", "ratio_low", "ratio_high"]].tolist() == [f"{v:.2f}" for v in
                                                                             (ratio.value, ratio.low, ratio.high)]
    value, low, high = table.loc["a", ["throughput_compute", "low", "high"]]
    places = stats.decimals(low, high)
    assert places <= 2 and shown.loc["a", "throughput_compute"] == f"{value:.{places}f}"
    assert shown.loc["a", "throughput_compute"] in comparison._repr_mimebundle_()["text/plain"]
    assert stats.decimals(1.0, 1.0) is None and stats.decimals(100, 140) == 0 and stats.decimals(1.12, 1.47) == 2


def test_the_dashboards_legends_cover_no_data(runs_dir):
    figure = analysis.dashboard("1003", runs_dir)
    figure.canvas.draw()
    for ax in figure.axes[:2]:  # the time split (stacked areas) and the throughput (lines)
        box = ax.get_legend().get_window_extent()
        inside = ax.get_window_extent()
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and box.y1 <= inside.y1, ax.get_title()  # within the plot
        points = [line.get_xydata() for line in ax.lines] + \
                 [path.vertices for area in ax.collections for path in area.get_paths()]
        for data in points:
            shown = ax.transData.transform(data[np.isfinite(data).all(axis=1)])
            assert not any(box.contains(x, y) for x, y in shown), ax.get_title()
