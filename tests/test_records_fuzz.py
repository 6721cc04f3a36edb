"""One bad file never breaks a view: a corpus of damaged run records, job cards and usage records (how each task
ended) thrown at every public view of dlokit.analysis, every check of dlokit.checks and the job helpers.

Each damaged run must show up as a row whose state (or `problems`) says what is wrong, the good run must
keep its numbers, and garbage lines must never count as steps.
"""
import json
import os
import pickle
import random
import shutil
import time
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import pandas as pd
import pytest
from matplotlib.figure import Figure

import dlokit
import dlokit.checks as checks
from dlokit import analysis
from dlokit.submission import jobs
from dlokit.in_job.runrecord import RunRecorder, read_rank

GOOD, STEPS, BATCH = "good", 120, 16
NOISE = random.Random(16)  # deterministic "binary" content


def record(runs, run_id, *, steps=STEPS, finish=True, slot=0, world_size=1):
    """A run as the kit's scripts record it (RunRecorder), in a measurement slot of its own."""
    start = 1_000_000.0 + 1000 * slot
    for rank in range(world_size):
        recorder = RunRecorder({"batch_size": BATCH, "model": "tiny", "num_workers": 2, "profile": True,
                                "device_type": "cpu"},
                               rank=rank, world_size=world_size, run_id=run_id, runs_dir=runs, script="train_tiny.py",
                               extra={"observed": {"device": "cpu", "model_device": "cpu", "model_to_device": True,
                                                   "batch_to_device": True, "ddp_wrapped": world_size > 1,
                                                   "sampler": "DistributedSampler"}})
        recorder.amend(measurement={**recorder.header["measurement"], "started_unix": start, "cpus": [0]})
        for step in range(1, steps + 1):
            recorder.log("step", epoch=(step - 1) // 40, step=step, lr=0.01, loss=3.0 / step, acc=step / steps,
                         batch_size=BATCH, t_data=0.01, t_forward=0.02, t_backward=0.03, t_optimizer=0.01,
                         t_step=0.06, throughput_train=BATCH / 0.07, throughput_compute=BATCH / 0.06,
                         gpu_mem_mb=None, breakdown=True)
            if step % 40 == 0:
                recorder.log("val", epoch=(step - 1) // 40, step=step, val_loss=1.0, val_acc=0.5, val_acc5=0.9)
        if finish:
            recorder.finish(steps=steps, throughput_train=200.0, throughput_compute=250.0, t_data=0.01, t_step=0.06,
                            host_rss_peak_mb=321.0 + rank, ended_unix=start + 500, val_acc=0.5, best_val_acc=0.5)
        else:
            recorder._metrics.close()
    return Path(runs) / run_id / "rank0"


def insert_lines(path: Path, after: int, lines: list[bytes]) -> None:
    """Put raw lines after the `after`-th line of a metrics file."""
    content = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(content[:after] + lines + content[after:]))


GARBAGE_LINES = [b"42", b'"text"', b"[1, 2]", b"null", b"true", b"NaN", b"{}", b'{"no_kind": 1}', b'{"kind": 5}',
                 b'{"kind": null, "step": 3}', b'{"kind": ["step"]}', b'{"kind": "step", "step": "x", "loss": null}',
                 b'{"kind": "step", "step": 7, "loss": "nan"}', b'{"kind": "step", "step": [1]}',
                 b'{"kind": "step", "step": true}', b'{"kind": "step", "step": 9, "t_step": {}}',
                 b'{"kind": "step", "step": 9, "throughput_train": "fast"}', b'{"kind": "val", "val_acc": "high"}',
                 b"[" * 100_000 + b"]" * 100_000, b"garbage", b"\x00\x01\x02", b"\xff\xfe{}",
                 b'{"kind": "step", "step": 3, "note": "caf\xe9"}', b"<html>", b"1 2 3", b"'single'",
                 b"},", b"]"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """{run_id: what the state must say} over a runs folder of one good run and damaged ones."""
    runs = tmp_path_factory.mktemp("runs")
    expect = {}
    slots = iter(range(1, 100))

    def run(run_id, state, **kwargs):
        expect[run_id] = state
        return record(runs, run_id, slot=next(slots), **kwargs)

    run(GOOD, "completed")
    folder = run("truncated", "running or killed", steps=50, finish=False)
    with open(folder / "metrics.jsonl", "a") as handle:
        handle.write('{"kind": "step", "epoch": 1, "step": 51, "lo')
    run("empty-metrics", "completed").joinpath("metrics.jsonl").write_bytes(b"")
    run("empty-run-json", "unreadable: rank0/run.json: empty file").joinpath("run.json").write_bytes(b"")
    run("empty-summary", "unreadable: rank0/summary.json: empty file").joinpath("summary.json").write_bytes(b"")
    folder = run("all-empty", "unreadable: rank0/run.json: empty file")
    for name in ("run.json", "metrics.jsonl", "summary.json"):
        (folder / name).write_bytes(b"")
    # one invalid UTF-8 byte: in a metrics line it spoils that line only; in run.json/summary.json the file
    folder = run("utf8-metrics", "completed")
    insert_lines(folder / "metrics.jsonl", 10, [b'{"kind": "step", "step": 10, "loss": "\xff"}'])
    metrics = folder / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes().replace(b'"step": 20,', b'"step": 20\xc3,', 1))
    folder = run("utf8-run-json", "unreadable: rank0/run.json: not UTF-8 text")
    (folder / "run.json").write_bytes((folder / "run.json").read_bytes().replace(b'"tiny"', b'"ti\xffny"'))
    folder = run("utf8-summary", "unreadable: rank0/summary.json: not UTF-8 text")
    (folder / "summary.json").write_bytes(b"\xef\xbb\xbf\xff" + (folder / "summary.json").read_bytes())
    for kind, text in (("list", "[1, 2]"), ("number", "42"), ("string", '"done"'), ("null", "null")):
        run(f"run-json-{kind}", f"unreadable: rank0/run.json: not a JSON object").joinpath("run.json").write_text(text)
        run(f"summary-{kind}", f"unreadable: rank0/summary.json: not a JSON object").joinpath(
            "summary.json").write_text(text)
    run("summary-truncated", "unreadable: rank0/summary.json: not JSON").joinpath("summary.json").write_text(
        '{"status": "completed", "steps": 12')
    run("summary-status-number", "unreadable: rank0/summary.json: 'status' is a number").joinpath(
        "summary.json").write_text('{"status": 1, "steps": 120}')
    folder = run("metrics-folder", "unreadable: rank0/metrics.jsonl: a folder, not a file")
    (folder / "metrics.jsonl").unlink()
    (folder / "metrics.jsonl").mkdir()
    folder = run("summary-folder", "unreadable: rank0/summary.json: a folder, not a file")
    (folder / "summary.json").unlink()
    (folder / "summary.json").mkdir()
    folder = run("binary-metrics", "unreadable: rank0/metrics.jsonl: no line is a metrics record")
    (folder / "metrics.jsonl").write_bytes(bytes(NOISE.randrange(256) for _ in range(50_000)).replace(b"{", b"("))
    run("binary-run-json", "unreadable: rank0/run.json").joinpath("run.json").write_bytes(
        bytes(NOISE.randrange(256) for _ in range(5_000)))
    # a huge single line (several MB) of garbage among good lines, and a huge good one
    folder = run("huge-line", "completed")
    insert_lines(folder / "metrics.jsonl", 30, [b"x" * 6_000_000,
                                                json.dumps({"kind": "event", "event": "note", "text": "y" * 3_000_000})
                                                .encode()])
    # garbage among the good step lines: never steps
    insert_lines(run("garbage-lines", "completed") / "metrics.jsonl", 60, GARBAGE_LINES)
    insert_lines(run("garbage-lines-running", "running or killed", steps=30, finish=False) / "metrics.jsonl", 5,
                 GARBAGE_LINES)
    # valid objects with fields of the wrong type: dropped and named, the rest used
    folder = run("wrong-fields", "completed")
    header = json.loads((folder / "run.json").read_text())
    header.update(config=[1, 2], world_size="two", hardware="cpu", measurement={"started_unix": "yesterday", "cpus": 5})
    (folder / "run.json").write_text(json.dumps(header))
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(throughput_train="fast", host_rss_peak_mb=[1], ended_unix={}, steps="many", observed=[])
    (folder / "summary.json").write_text(json.dumps(summary))
    # two ranks, the second one damaged; a rank "folder" that is a file
    folder = run("rank1-broken", "unreadable: rank1/summary.json: not a JSON object", world_size=2)
    (folder.parent / "rank1" / "summary.json").write_text("[]")
    folder = run("rank0-a-file", "unreadable: rank0: a file, not a folder")
    shutil.rmtree(folder)
    folder.write_bytes(b"\x00" * 10)
    folder.parent.joinpath("rank1").mkdir()  # so that the run is listed whatever its rank0 is
    # a damaged profiler trace in the good run's folder and in a run of its own
    profile = runs / GOOD / "profile"
    profile.mkdir()
    (profile / "rank0.1.pt.trace.json").write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 1, "\xff')
    (profile / "rank0.0.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08 not gzip")
    os.utime(profile / "rank0.1.pt.trace.json", (time.time() + 5, time.time() + 5))  # the newest
    folder = run("bad-trace", "completed")
    (folder.parent / "profile").mkdir()
    (folder.parent / "profile" / "rank0.2.pt.trace.json").write_text('{"traceEvents": "none"}')
    (folder.parent / "profile" / "rank0.3.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "ts": "a"}]}')
    os.utime(folder.parent / "profile" / "rank0.3.pt.trace.json", (time.time() + 5, time.time() + 5))
    return runs, expect


@pytest.fixture(scope="module")
def good_row(corpus, tmp_path_factory):
    """The good run's runs_table row when it is alone in its folder."""
    alone = tmp_path_factory.mktemp("alone")
    shutil.copytree(corpus[0] / GOOD, alone / GOOD)
    return analysis.runs_table(None, alone).set_index("run_id").loc[GOOD]


def test_every_damaged_run_is_a_row_that_says_what_is_wrong(corpus, good_row):
    runs, expect = corpus
    assert sorted(analysis.list_run_ids(runs)) == sorted(expect)
    table = analysis.runs_table(None, runs).set_index("run_id")
    assert sorted(table.index) == sorted(expect)
    for run_id, state in expect.items():
        assert table.loc[run_id, "state"].startswith(state), (run_id, table.loc[run_id, "state"])
        described = analysis.load_run(run_id, runs).describe_state()
        assert state in described, (run_id, described)
    # the good run: every number as when it is alone
    row = table.loc[GOOD]
    for column in table.columns:
        assert row[column] == good_row[column] or (pd.isna(row[column]) and pd.isna(good_row[column])), column
    assert row["steps"] == STEPS and row["throughput_train"] == pytest.approx(BATCH / 0.07) and row["problems"] == ""
    assert not row["truncated"] and row["overlapped_by"] == ""


def test_garbage_lines_never_count_as_steps(corpus):
    runs, _ = corpus
    steps = {run_id: len(analysis.load_run(run_id, runs).steps) for run_id in
             (GOOD, "garbage-lines", "garbage-lines-running", "huge-line", "utf8-metrics", "truncated")}
    assert steps == {GOOD: STEPS, "garbage-lines": STEPS, "garbage-lines-running": 30, "huge-line": STEPS,
                     "utf8-metrics": STEPS - 1, "truncated": 50}
    table = analysis.runs_table(["garbage-lines-running", "garbage-lines"], runs).set_index("run_id")
    assert table.loc["garbage-lines-running", "steps"] == 30
    assert table.loc["garbage-lines", "problems"].startswith(
        f"rank0/metrics.jsonl: {len(GARBAGE_LINES)} line(s) skipped, not metrics records (line 61: ")
    garbage = analysis.load_run("garbage-lines", runs)
    assert garbage.state == "completed" and "⚠ rank0/metrics.jsonl" in garbage.describe_state()
    assert pd.to_numeric(garbage.steps["step"]).tolist() == list(range(1, STEPS + 1))
    assert len(garbage.lines("val")) == 3  # the "val" line with a text val_acc is not a validation
    utf8 = analysis.load_run("utf8-metrics", runs)
    assert "line 11: not UTF-8 text (byte 0xff)" in utf8.problems[0]
    assert analysis.load_run("truncated", runs).truncated and not analysis.load_run("truncated", runs).problems


def test_wrong_field_types_are_dropped_and_named(corpus):
    runs, _ = corpus
    run = analysis.load_run("wrong-fields", runs)
    assert run.config == {} and run.world_size == 1 and "hardware" not in run.info
    assert run.summary.get("throughput_train") is None and run.summary.get("steps") is None
    text = "\n".join(run.problems)
    for field in ("config", "world_size", "hardware", "started_unix", "cpus", "throughput_train",
                  "host_rss_peak_mb", "ended_unix", "steps", "observed"):
        assert f"'{field}'" in text, field
    row = analysis.runs_table([run]).iloc[0]
    assert row["state"] == "completed" and row["steps"] == STEPS  # counted from the step lines
    assert row["throughput_train"] == pytest.approx(BATCH / 0.07)  # the mean of the step lines instead
    assert "throughput_train" in row["problems"]


def test_read_rank_never_raises_and_keeps_what_it_can(corpus):
    runs, expect = corpus
    for run_id in expect:
        for folder in (runs / run_id).glob("rank*"):
            rank = read_rank(folder)
            assert isinstance(rank["metrics"], list) and all(isinstance(m, dict) for m in rank["metrics"])
            assert rank["run"] is None or isinstance(rank["run"], dict)
            assert rank["summary"] is None or isinstance(rank["summary"], dict)
            assert (rank["unreadable"] is None) == (not rank["state"].startswith("unreadable"))
    broken = read_rank(runs / "summary-list" / "rank0")
    assert broken["run"]["run_id"] == "summary-list" and len(broken["metrics"]) == STEPS + 3


def figures_and_tables(runs, ids):
    """Every public view of dlokit.analysis over these runs (by id, by path and as Run objects)."""
    loaded = analysis.load_runs(ids, runs)
    assert [r.run_id for r in loaded] == ids
    yield "load_runs", analysis.load_runs(None, runs)
    yield "runs_table", analysis.runs_table(ids, runs)
    yield "runs_table paths", analysis.runs_table([runs / i for i in ids])
    for metric in ("throughput_train", "t_step", "gpu_mem_peak_mb", "val_acc"):
        yield f"compare_runs {metric}", analysis.compare_runs(loaded, metric)
    yield "compare_runs baseline", analysis.compare_runs(loaded, baseline=GOOD)
    try:
        yield "scaling_table", analysis.scaling_table(loaded)
    except analysis.ScalingError as error:  # its documented refusal of multi-rank runs without DDP evidence
        yield "scaling_table refused", pd.Series([str(error)])
    single = [r for r in loaded if r.world_size == 1]
    yield "scaling_table single rank", analysis.scaling_table(single)
    yield "scaling_plot", analysis.scaling_plot(loaded)
    yield "dataloader_trials", analysis.dataloader_trials(loaded)
    yield "memory_table", analysis.memory_table(loaded)
    yield "memory_fit", analysis.memory_fit(analysis.memory_table(loaded)) or pd.DataFrame()
    yield "memory_vs_batch", analysis.memory_vs_batch(loaded)
    yield "memory_vs_batch host", analysis.memory_vs_batch(loaded, memory="host")
    yield "throughput_vs_batch", analysis.throughput_vs_batch(loaded)
    yield "training_curves", analysis.training_curves(loaded)
    yield "epoch_times", analysis.epoch_times(loaded)
    yield "overlapping", pd.Series(analysis.overlapping(loaded))
    yield "breakdown_pie", analysis.breakdown_pie([runs / i for i in ids])
    yield "config_value", pd.Series([analysis.config_value(r, "batch_size") for r in loaded])
    for run in loaded:
        yield f"dashboard {run.run_id}", analysis.dashboard(run)
        yield f"dashboard by id {run.run_id}", analysis.dashboard(run.run_id, runs)


def test_every_analysis_view_survives_the_whole_corpus(corpus):
    runs, expect = corpus
    ids = sorted(expect)
    for name, result in figures_and_tables(runs, ids):
        assert isinstance(result, (Figure, pd.DataFrame, pd.Series, list, analysis.Comparison)), name
        if isinstance(result, analysis.Comparison):
            table = result.table.set_index("arm")  # one arm per run when runs are listed
            assert sorted(table.index) == ids, name
            assert table.loc["metrics-folder", "state"].startswith("unreadable: rank0/metrics.jsonl"), name
            result._repr_mimebundle_()  # what a notebook shows: the table and the chart as PNG
    trials = analysis.dataloader_trials(ids, runs)
    assert sorted(trials["run_id"]) == ids
    assert trials.set_index("run_id").loc["run-json-list", "state"] == \
        "unreadable: rank0/run.json: not a JSON object (a list)"
    dashboard = analysis.dashboard("metrics-folder", runs)
    texts = "\n".join(t.get_text() for ax in dashboard.axes for t in ax.texts)
    assert "unreadable: rank0/metrics.jsonl: a folder, not a file" in texts


def test_run_picker_lists_damaged_runs(corpus):
    pytest.importorskip("ipywidgets")
    runs, expect = corpus
    picker = analysis.run_picker(runs)
    assert len(picker.runs.options) == len(expect)
    picker.runs.value = (GOOD, "binary-metrics", "summary-number")
    assert picker.comparison is not None and len(picker.comparison.table) == 3


def test_a_damaged_trace_is_named_not_a_crash(corpus):
    runs, _ = corpus
    for trace in (runs / GOOD / "profile" / "rank0.1.pt.trace.json", runs / GOOD / "profile",
                  runs / GOOD / "profile" / "rank0.0.pt.trace.json.gz", runs / "bad-trace"):
        with pytest.raises(ValueError) as raised:  # the documented contract: ValueError naming the file
            analysis.profiler_breakdown(trace)
        assert ".pt.trace.json" in str(raised.value)
    with pytest.raises(FileNotFoundError):
        analysis.profiler_breakdown(runs / "metrics-folder")
    assert isinstance(analysis.breakdown_pie([runs / GOOD, runs / "bad-trace"]), Figure)


@pytest.fixture
def profile_runs(corpus, tmp_path, monkeypatch):
    """The corpus as the current profile's runs folder (what the checks read), no job cards."""
    runs, expect = corpus
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(runs))
    monkeypatch.setenv("DLOKIT_LOG_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("DLOKIT_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("DLOKIT_PROFILE", raising=False)
    dlokit.use_profile("local")
    checks.RESULTS.clear()
    return runs, expect


def test_every_check_says_what_is_wrong_with_a_damaged_run(profile_runs, capsys):
    runs, expect = profile_runs
    calls = {
        "completed": lambda i: checks.completed([i]), "on_device": lambda i: checks.on_device([i]),
        "amp": lambda i: checks.amp(GOOD, [i]), "tf32": lambda i: checks.tf32(GOOD, [i]),
        "channels_last": lambda i: checks.channels_last([i], GOOD), "profiler": lambda i: checks.profiler([i]),
        "dataloader": lambda i: checks.dataloader(GOOD, i), "ddp": lambda i: checks.ddp([i]),
        "sync_bn": lambda i: checks.sync_bn([i]), "augmentation": lambda i: checks.augmentation([i], GOOD),
    }
    for run_id, state in expect.items():
        for name, call in calls.items():
            result = call(run_id)
            assert isinstance(result, checks.CheckResult), (name, run_id)
            assert "could not run" not in result.message, (name, run_id, result.message)
            if state.startswith("unreadable"):
                assert result.status == checks.FAILED and state in result.message, (name, run_id, result.message)
    assert checks.completed([GOOD]).status == checks.PASSED
    assert checks.on_device([GOOD]).status == checks.PASSED
    assert "rank0.1.pt.trace.json" in checks.profiler([GOOD]).message  # the newest trace is the damaged one
    assert isinstance(checks.scoreboard(), pd.DataFrame)


# ---- job cards and usage records -------------------------------------------------------------------------

DEAD_PID = "4194999"  # above any pid_max: never a live launcher


def write_card(logs: Path, job_id: str, **changes) -> jobs.JobCard:
    folder = logs / "fuzz"
    folder.mkdir(parents=True, exist_ok=True)
    card = jobs.JobCard(job_id=job_id, native_id=DEAD_PID + job_id[-1], name="fuzz", backend="local",
                        profile="local", folder=str(folder), argv=["train.py"], command_line="python train.py",
                        n_gpu=0, nodes=1, tasks=1, time_seconds=600, runs_dir=str(dlokit.current_profile().runs),
                        submitted_at=time.time() - 100, **changes)
    card.save()
    return card


def usage_file(card: jobs.JobCard, task: int = 0) -> Path:
    return Path(card.folder) / f"{card.scheduler_id}_{task}_usage.json"


class Planted:
    """A pickle that runs a command when loaded: what a student could leave as submitit's result file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def job_corpus(workspace):
    """{job id: why its card is broken} and {job id: (expected outcome, text of the cause)} in the log folder."""
    dlokit.use_profile("local")
    logs = dlokit.current_profile().logs
    outcomes = {}
    done = write_card(logs, "1123-104259-e3c1")
    usage_file(done).write_text(json.dumps({"returncode": 0, "peak_rss_mb": 12.0}))
    done.log_path().write_text("epoch 1\n")
    # submitit's result pickle is never read: one that would run a command changes nothing
    (Path(done.folder) / f"{done.scheduler_id}_0_result.pkl").write_bytes(
        pickle.dumps(Planted(workspace / "pickle-ran")))
    outcomes[done.job_id] = ("COMPLETED", "")
    failed = write_card(logs, "1123-104259-e3c2")
    usage_file(failed).write_text(json.dumps({"returncode": 1}))
    failed.log_path(err=True).write_text("Traceback (most recent call last):\n  File \"x\"\nValueError: boom\n")
    outcomes[failed.job_id] = ("FAILED", "ValueError: boom")
    for job_id, content, why in (
            ("1123-104259-e3c3", b"", "empty"), ("1123-104259-e3c4", b"\x80\x04garbage\xff" * 10, "cannot be read"),
            ("1123-104259-e3c5", bytes(NOISE.randrange(256) for _ in range(3000)), "cannot be read"),
            ("1123-104259-e3c6", b"42", "not the kit's"),
            ("1123-104259-e3c7", b'{"returncode": "0"}', "not the kit's"),
            ("1123-104259-e3c8", b'{"returncode": true}', "not the kit's"),
            ("1123-104259-e3c9", b'{"returncode": 0, "peak', "cannot be read")):
        card = write_card(logs, job_id)
        usage_file(card).write_bytes(content)
        outcomes[job_id] = ("UNKNOWN", why)
    fifo = write_card(logs, "1123-104259-e3ca")
    os.mkfifo(usage_file(fifo))  # opened for reading, it would block the reader until someone writes
    outcomes[fifo.job_id] = ("UNKNOWN", "a FIFO, not a regular file")
    linked = write_card(logs, "1123-104259-e3cb")
    usage_file(linked).symlink_to(usage_file(done))
    outcomes[linked.job_id] = ("UNKNOWN", "a symbolic link")
    folder_usage = write_card(logs, "1123-104259-e3cc")
    usage_file(folder_usage).mkdir()
    outcomes[folder_usage.job_id] = ("UNKNOWN", "a folder")
    folder = logs / "fuzz"
    good = json.loads(done.path.read_text())
    broken = {}

    def card(job_id, content, why):
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        (folder / f"{job_id}_job.json").write_bytes(data)
        broken[job_id] = why

    card("b-truncated", done.path.read_bytes()[:40], "not JSON")
    card("b-empty", b"", "not JSON")
    card("b-list", [good], "not a JSON object")
    card("b-number", 7, "not a JSON object")
    card("b-utf8", done.path.read_bytes().replace(b'"fuzz"', b'"fu\xffzz"'), "not UTF-8")
    card("b-missing", {k: v for k, v in good.items() if k != "tasks"}, "no 'tasks'")
    card("b-tasks-text", {**good, "job_id": "b-tasks-text", "tasks": "2"}, "'tasks' is str")
    card("b-tasks-bool", {**good, "job_id": "b-tasks-bool", "tasks": True}, "'tasks' is bool")
    card("b-tasks-huge", {**good, "job_id": "b-tasks-huge", "tasks": 10**12}, "tasks")
    card("b-folder-number", {**good, "job_id": "b-folder-number", "folder": 5}, "'folder' is int")
    card("b-submitted", {**good, "job_id": "b-submitted", "submitted_at": "today"}, "'submitted_at' is str")
    card("b-argv", {**good, "job_id": "b-argv", "argv": "train.py"}, "'argv' is str")
    card("b-job-id", {**good, "job_id": "../../etc"}, "not a job id")
    card("b-cluster", {**good, "job_id": "b-cluster", "cluster": "../x"}, "not a cluster name")
    card("b-binary", bytes(NOISE.randrange(256) for _ in range(500)), "")
    (folder / "b-dir_job.json").mkdir()
    broken["b-dir"] = "a folder, not a regular file"
    os.mkfifo(folder / "b-fifo_job.json")
    broken["b-fifo"] = "a FIFO, not a regular file"
    (folder / "b-link_job.json").symlink_to(done.path)
    broken["b-link"] = "a symbolic link"
    return outcomes, broken


def test_broken_job_cards_are_skipped_and_named(job_corpus):
    outcomes, broken = job_corpus
    assert sorted(c.job_id for c in jobs.all_cards()) == sorted(outcomes)
    assert sorted(c.job_id for c in jobs.all_cards("fuzz")) == sorted(outcomes)
    for job_id, why in broken.items():
        with pytest.raises(LookupError) as raised:
            jobs.find_card(job_id)
        assert f"{job_id}_job.json" in str(raised.value) and why in str(raised.value), str(raised.value)
        with pytest.raises(LookupError):
            dlokit.job_outcome(job_id)
    logs = dlokit.search_log(with_err=True)
    assert any(Path(p).name.startswith(DEAD_PID) for p in logs)
    assert dlokit.search_log("fuzz", contains="b-") == []
    assert isinstance(dlokit.job_table(), pd.DataFrame) and isinstance(dlokit.job_table("fuzz"), pd.DataFrame)


def test_usage_reader_says_unknown_with_the_reason(job_corpus):
    outcomes, _ = job_corpus
    for job_id, (state, why) in outcomes.items():
        card = jobs.find_card(job_id)
        record, problem = jobs.usage_record(card, 0)
        if state == "UNKNOWN":
            assert record is None and why in problem and usage_file(card).name in problem, (job_id, problem)
        else:
            assert isinstance(record["returncode"], int) and problem == ""


def test_a_damaged_usage_record_never_reads_as_completed_or_failed(job_corpus, workspace):
    """job_outcome (_local_outcome) decides from the usage records, never from submitit's result pickle."""
    outcomes, _ = job_corpus
    for job_id, (state, why) in outcomes.items():
        outcome = dlokit.job_outcome(job_id)
        assert outcome.state == state and why in outcome.cause, (job_id, str(outcome))
    assert not (workspace / "pickle-ran").exists()  # the planted result pickle was never loaded


def test_tail_and_traceback_tail_survive_odd_logs(job_corpus, tmp_path):
    outcomes, _ = job_corpus
    assert jobs.tail(tmp_path) == "" and jobs.tail(tmp_path / "absent") == ""
    os.mkfifo(tmp_path / "fifo.out")
    assert jobs.tail(tmp_path / "fifo.out") == ""  # never opened for good: it would block
    card = jobs.find_card(next(iter(outcomes)))
    card.log_path(err=True).write_bytes(b"\xff\xfe Traceback\n" + bytes(NOISE.randrange(256) for _ in range(20_000)))
    assert isinstance(jobs.traceback_tail(card), str)
    card.log_path(err=True).unlink()
    card.log_path(err=True).mkdir()
    assert jobs.traceback_tail(card) == ""
