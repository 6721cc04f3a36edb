"""The race leaderboard: scores read from the runs' own records, thirty writers at once, forgeries rejected."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

from dlokit import race
from dlokit.in_job.runrecord import RunRecorder

matplotlib.use("Agg")
REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tp_scripts" / "solutions" / "train_classifier.py"
WRITERS = 30

sys.path.insert(0, str(REPO / "data"))
import make_synthetic_imagenet  # noqa: E402


def record(runs: Path, run_id: str, nickname: str, val_accs: list[float]) -> None:
    """A finished race run's record, written by the kit's own recorder (what the training script uses)."""
    with RunRecorder({"model": "resnet18", "batch_size": 8, "image_size": 32}, run_id=run_id, runs_dir=runs,
                     extra={"name": nickname, "argv": ["--epochs", str(len(val_accs))]}) as recorder:
        for epoch, acc in enumerate(val_accs):
            recorder.log("val", epoch=epoch, step=6 * (epoch + 1), val_loss=1.0, val_acc=acc, val_acc5=1.0)
        recorder.finish(steps=6 * len(val_accs), epochs=len(val_accs), val_acc=val_accs[-1],
                        best_val_acc=max(val_accs))


def post_when_all_ready(board_args: tuple, run_id: str, barrier) -> None:
    board = race.Leaderboard(*board_args)
    barrier.wait()  # every writer posts at the same moment
    board.post(run_id)


def post_together(board_args: tuple, run_ids: list[str]) -> None:
    """One separate process per entry, all posting at once."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(run_ids))
    writers = [context.Process(target=post_when_all_ready, args=(board_args, run_id, barrier)) for run_id in run_ids]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    assert [writer.exitcode for writer in writers] == [0] * len(writers)


def test_thirty_concurrent_writers_lose_and_tear_nothing(tmp_path):
    runs, folder = tmp_path / "runs", tmp_path / "board"
    for k in range(WRITERS):
        record(runs, f"{100 + k}", f"student{k:02d}", [0.1, 0.2 + k / 100])
    board_args = (folder, runs, 1.0)
    post_together(board_args, [f"{100 + k}" for k in range(WRITERS)])
    names = sorted(p.name for p in folder.iterdir())  # every entry, and no temporary file left
    assert names == sorted(f"student{k:02d}--{100 + k}.json" for k in range(WRITERS))
    accepted, rejected = race.Leaderboard(*board_args).read()
    assert rejected == [] and len(accepted) == WRITERS
    assert {e["nickname"]: e["top1"] for e in accepted} == {f"student{k:02d}": 0.2 + k / 100 for k in range(WRITERS)}

    # the same entry rewritten by thirty processes at once: one whole file, never a torn one
    post_together(board_args, ["100"] * WRITERS)
    assert sorted(p.name for p in folder.iterdir()) == names
    assert json.loads((folder / "student00--100.json").read_text())["run_id"] == "100"
    table = race.Leaderboard(*board_args).table()
    assert list(table["nickname"][:2]) == ["student29", "student28"] and list(table["rank"][:2]) == [1, 2]


def test_forged_entries_are_rejected(tmp_path):
    runs, folder = tmp_path / "runs", tmp_path / "board"
    record(runs, "201", "alice", [0.30, 0.45, 0.40])
    record(runs, "202", "bob", [0.20, 0.25])
    board = race.Leaderboard(folder, runs, budget_gpu_hours=1.0)
    genuine = board.entry("201")
    assert genuine["top1"] == 0.45 and genuine["final_top1"] == 0.40 and genuine["nickname"] == "alice"
    assert board.verify(genuine) is None
    board.write(genuine)
    board.write({**genuine, "nickname": "mallory", "top1": 0.99})                   # a score typed in
    board.write({**board.entry("202"), "top1": 0.95})                               # bob's, inflated
    board.write({**genuine, "nickname": "eve"})                                     # someone else's run
    board.write({**genuine, "run_id": "999", "nickname": "alice"})                  # no record at all
    (folder / "trudy--203.json").write_text('{"schema": 1, "nickname": "trudy", "run_id": "203", "top1": ')
    accepted, rejected = board.read()
    assert [e["nickname"] for e in accepted] == ["alice"]
    reasons = dict(rejected)
    assert "claimed, its record says 0.25" in reasons["bob--202.json"]
    assert "belongs to 'alice'" in reasons["eve--201.json"] and "belongs to 'alice'" in reasons["mallory--201.json"]
    assert "record 999 is missing" in reasons["alice--999.json"] and "unreadable" in reasons["trudy--203.json"]
    with pytest.raises(race.LeaderboardError, match="submitted by 'alice'"):
        board.post("201", nickname="eve")

    # a record doctored after the run: its validation lines no longer match its summary
    metrics = runs / "202" / "rank0" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"val_acc": 0.25', '"val_acc": 0.95'))
    assert "do not match its validation lines" in board.verify({**board.entry("202")})
    assert "bob" not in board.table()["nickname"].tolist()


def test_what_the_board_shows_comes_from_the_record_and_a_run_shows_once(tmp_path):
    """An entry whose score matches its record but whose other fields were edited by hand (64 GPUs, resnet152,
    batch 4096, 0.001 Wh measured) shows what the record says; the same entry copied under another file name
    shows once."""
    runs, folder = tmp_path / "runs", tmp_path / "board"
    record(runs, "301", "alice", [0.30, 0.45])
    board = race.Leaderboard(folder, runs, budget_gpu_hours=1.0)
    genuine = board.entry("301")
    edited = {**genuine, "gpus": 64, "epochs": 1, "model": "resnet152", "batch_size": 4096, "energy_wh": 0.001,
              "energy_source": "measured", "options": ["--amp", "bf16"], "over_budget": False}
    board.write(edited)
    (folder / "alice--301-copy.json").write_text(json.dumps(edited))
    accepted, rejected = board.read()
    assert len(accepted) == 1 and [name for name, _ in rejected] == ["alice--301-copy.json"]  # the post's own name wins
    assert "a second entry for run 301 (the board shows alice--301.json)" in dict(rejected)["alice--301-copy.json"]
    shown = accepted[0]
    for key in ("gpus", "epochs", "model", "batch_size", "energy_wh", "energy_source", "options"):
        assert shown[key] == genuine[key], key
    assert board.table()["model"].tolist() == ["resnet18"]


def test_a_real_race_run_scores_from_its_record(tmp_path):
    data = tmp_path / "tiny"
    make_synthetic_imagenet.main(["--out", str(data), "--classes", "4", "--train-per-class", "12",
                                  "--val-per-class", "3", "--size", "36", "--quiet"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DLOKIT_RUN_ID": "301", "DLOKIT_JOB_NAME": "carol"}
    command = [sys.executable, str(SCRIPT), "--runs-dir", str(tmp_path / "runs"), "--data", str(data), "--model",
               "resnet18", "--image-size", "32", "--batch-size", "8", "--epochs", "2", "--lr", "0.05"]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as process:
        try:
            out, _ = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert process.returncode == 0, out
    lines = [json.loads(line) for line in (tmp_path / "runs" / "301" / "rank0" / "metrics.jsonl").open()]
    val = [line["val_acc"] for line in lines if line["kind"] == "val"]

    board = race.Leaderboard(tmp_path / "board", tmp_path / "runs", budget_gpu_hours=1e-6)  # a tiny budget
    path = board.post("301")
    entry = json.loads(path.read_text())
    assert path.name == "carol--301.json" and entry["top1"] == max(val) and entry["final_top1"] == val[-1]
    assert entry["epochs"] == 2 and entry["gpus"] == 1 and entry["gpu_hours"] > 0 and entry["over_budget"]
    assert entry["energy_wh"] is None or entry["energy_source"] == "rapl"  # CPU: RAPL where readable, else n/a
    assert "--epochs" in entry["options"]
    table = board.table()
    assert table.loc[0, "nickname"] == "carol" and bool(table.loc[0, "over_budget"])
    assert table.loc[0, "energy"] == ("n/a" if entry["energy_wh"] is None else table.loc[0, "energy"])
    assert "carol" in board.html() and "over budget" in board.html()
    assert "carol" in board.widget().children[0].value
    figure = board.plot()
    assert figure.axes[0].get_xlabel() == "GPU-hours" and figure.axes[0].get_legend() is not None


def test_pareto_front_keeps_what_nothing_beats():
    points = [(1.0, 0.50), (2.0, 0.40), (2.0, 0.60), (3.0, 0.60), (0.5, 0.10), (4.0, 0.70)]
    assert race.pareto_front(points) == [4, 0, 2, 5]
    assert race.pareto_front([]) == []


def test_verify_race_rescores_each_entry_and_flags_a_forged_record(tmp_path, workspace):
    """A record edited consistently (its validation lines and summary at 0.999) passes the board's checks; the
    instructor's verify-race scores the run's final weights again on a test split no student job read, in a job
    of its own, and flags the claim. The honest entry is not flagged."""
    import dlokit

    data, test = tmp_path / "tiny", tmp_path / "instructors" / "test"
    make_synthetic_imagenet.main(["--out", str(data), "--classes", "4", "--train-per-class", "12",
                                  "--val-per-class", "8", "--size", "36", "--quiet"])
    make_synthetic_imagenet.main(["--out", str(tmp_path / "held-out"), "--classes", "4", "--train-per-class", "1",
                                  "--val-per-class", "10", "--size", "36", "--seed", "7", "--quiet"])
    test.parent.mkdir()
    (tmp_path / "held-out" / "val").rename(test)  # the held-out images only: one folder per class
    profile = dlokit.use_profile("local", race_test_dir=str(test))
    common = f"{SCRIPT} --data {data} --model resnet18 --image-size 32 --batch-size 8 --epochs 2 --lr 0.05 " \
             "--checkpoint-epochs"
    honest, forged = dlokit.gpu_jobs_submitter([common, common], n_gpu=1, name="carol", time_max="00:05:00",
                                               verbose=False)
    assert [o.state for o in dlokit.wait([honest, forged], timeout_s=300)] == ["COMPLETED"] * 2
    rank0 = profile.runs / forged / "rank0"
    lines = [json.loads(line) for line in (rank0 / "metrics.jsonl").open()]
    (rank0 / "metrics.jsonl").write_text("".join(json.dumps({**line, "val_acc": 0.999} if line["kind"] == "val"
                                                            else line) + "\n" for line in lines))
    summary = json.loads((rank0 / "summary.json").read_text())
    (rank0 / "summary.json").write_text(json.dumps({**summary, "val_acc": 0.999, "best_val_acc": 0.999}))
    board = race.Leaderboard(profile=profile)
    board.post(honest)
    board.post(forged)
    assert len(board.read()[0]) == 2  # the forged record passes every check the board can make

    table = race.verify_race()
    assert set(table["run_id"]) == {honest, forged} and table["rank"].tolist() == [1, 2]
    by_run = table.set_index("run_id")
    assert by_run.loc[forged, "claimed_top1"] == pytest.approx(0.999, abs=0.02)
    assert "disagree beyond noise" in by_run.loc[forged, "flag"]
    assert by_run.loc[honest, "flag"] == "" and 0 <= by_run.loc[honest, "test_top1"] <= 1
    scoring = dlokit.submission.jobs.find_card(by_run.loc[forged, "score_job"])
    assert str(test) in scoring.command_line and "checkpoint.pt" in scoring.command_line


def test_a_check_too_large_for_the_students_is_refused_and_a_broken_one_is_named(tmp_path, monkeypatch):
    """The instructors' check is never silently stale: one larger than a student's board reads is refused at publish,
    naming the size; one that cannot be read (here cut short) is named on the board, not replaced by an older one."""
    from dlokit.race import leaderboard

    runs, folder = tmp_path / "runs", tmp_path / "board"
    record(runs, "401", "alice", [0.3])
    board = race.Leaderboard(folder, runs, budget_gpu_hours=1.0)
    board.post("401")
    monkeypatch.setattr(leaderboard, "MAX_CHECK_BYTES", 200)
    with pytest.raises(race.LeaderboardError, match=r"MiB, over the 0 MiB a student's board reads: not published"):
        board.publish()
    assert not list(folder.glob(".checked-*"))
    monkeypatch.undo()
    published = board.publish()
    published.write_text(published.read_text()[:40])  # cut short
    accepted, rejected = board.read()
    assert [entry["run_id"] for entry in accepted] == ["401"]  # this user reads the record itself
    assert any(name == ".checked-*" and published.name in why and "not JSON" in why for name, why in rejected), rejected
