"""The Imagenet Race notebook, executed headless (papermill, cwd notebooks/) with the tiniest sizes, on the
reference solutions: on the local backend (where a BEGIN start time is refused: the run starts now) and on the
project's real local Slurm (submitted with --begin). The race check must be ✅: the run completed within the
budget, validated every epoch on the held-out split, and its leaderboard entry verifies.

As in test_notebooks.py, a probe cell appended to a copy of the notebook prints what the test asserts on, and
check results are read from their machine-readable output (dlokit.checks.MIME).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat
import pytest

from dlokit import checks, course
from lab_walk import assert_fits

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
RACE = NOTEBOOKS / "race.ipynb"
PROBE_MARK = "DLOKIT_PROBE "

TINY = {"NICKNAME": "racer", "SCRIPTS": "../tp_scripts/solutions", "MODEL": "mobilenet_v3_small", "IMAGE_SIZE": 32,
        "BATCH_SIZE": 16, "TRAIN_PER_CLASS": 8, "TEST_STEPS": 5, "BUDGET_MINUTES": 0.75, "REFRESH_S": 1,
        # a loaded 2-core machine: epochs may run much slower than the test's few steps, and the start-up alone took
        # 11 s of the 15 s that 0.5 minute left to plan on (2026-11-27, a slower machine than CI's)
        "BUDGET_MARGIN": 0.5,
        "FORM_VALUES": {"lr": 0.05, "lr_schedule": "cosine"}}

PROBE = """
import json
report = classroom.class_report(profile.runs, profile.logs.parent)
print("DLOKIT_PROBE " + json.dumps({
    "profile": profile.name,
    "options": options,
    "planned_epochs": plan.epochs,
    "budget_gpu_hours": budget_gpu_hours, "planned_on_gpu_hours": plan.budget_gpu_hours,
    "val_epochs": [int(e) for e in found.val["epoch"]],
    "segments": len(found.segments),
    "best_top1": found.best_top1,
    "tags": [analysis.load_run(job).info.get("tag") for job in (test_job, race_job)],
    "argv": analysis.load_run(race_job).info.get("argv"),
    "begin": dlokit.submission.jobs.find_card(race_job).extra.get("begin"),
    "board": [{"nickname": e["nickname"], "run_id": e["run_id"], "top1": float(e["top1"]),
               "over_budget": bool(e["over_budget"])} for e in board.table().to_dict("records")],
    "report": [{"student": r["student"], "tp": r["tp"], "jobs": int(r["jobs"]), "completed": int(r["completed"])}
               for r in report.to_dict("records")],
}))
"""


def execute(parameters: dict, out_dir: Path) -> tuple[list[dict], dict, str]:
    """Run a copy of the notebook with the probe cell appended; (check results, probe values, executed text)."""
    nb = nbformat.read(RACE, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    source = out_dir / "probed_race.ipynb"
    nbformat.write(nb, source)
    executed = out_dir / "executed_race.ipynb"
    started = time.time()
    course.execute(source, executed, parameters, NOTEBOOKS)
    print(f"race.ipynb ({parameters.get('PROFILE', 'local')}) ran in {time.time() - started:.0f} s")
    probe = {}
    for cell in json.loads(executed.read_text())["cells"]:
        for output in cell.get("outputs", []):
            for line in "".join(output.get("text", "")).splitlines():
                if line.startswith(PROBE_MARK):
                    probe = json.loads(line[len(PROBE_MARK):])
    if "PROFILE" not in parameters:  # the embedded default: a student's read at 1366 px, screenshots kept
        assert_fits(executed, "race", out_dir)
    return checks.results_in_notebook(executed), probe, executed.read_text()


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Job logs, run records, the leaderboard and the device locks in a fresh folder; the kernel inherits them."""
    monkeypatch.setenv("DLOKIT_LOG_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("DLOKIT_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.delenv("DLOKIT_PROFILE", raising=False)
    return tmp_path


def check_race(results: list[dict], probe: dict, profile: str) -> None:
    found = {r["check"]: r for r in results}
    assert "Imagenet Race" in found, list(found)
    failed = {name: r["message"] for name, r in found.items() if r["status"] == "failed"}
    assert not failed, failed
    race = found["Imagenet Race"]
    assert race["status"] == "passed" and [p["status"] for p in race["parts"]] == ["passed"] * 4, race
    assert probe["profile"] == profile
    # the form's values reached the run, after the day's sizes (the later option wins)
    options = probe["options"]
    assert [options[options.index(o) + 1] for o in ("--optimizer", "--lr-schedule")] == ["sgd", "cosine"]
    assert probe["argv"][-len(probe["options"]):] == probe["options"] and "--lr" in probe["argv"]
    # every planned epoch ran and was validated, in one segment (nothing preempted it)
    assert probe["planned_epochs"] >= 1 and probe["segments"] == 1
    assert probe["val_epochs"] == list(range(probe["planned_epochs"]))
    assert race["info"]["epochs"] == probe["planned_epochs"] and race["info"]["rank"] == 1
    # judged on the whole budget (0.75 min on 1 device), planned on half of it (BUDGET_MARGIN)
    assert race["info"]["budget_gpu_hours"] == pytest.approx(0.75 / 60) == probe["budget_gpu_hours"]
    assert probe["planned_on_gpu_hours"] == pytest.approx(0.375 / 60)
    assert race["info"]["gpu_hours"] <= race["info"]["budget_gpu_hours"]
    # both jobs tagged for the class report; the leaderboard's score is the record's
    assert probe["tags"] == ["race", "race"]
    assert probe["board"] == [{"nickname": "racer", "run_id": race["info"]["job_id"], "top1": probe["best_top1"],
                               "over_budget": False}]
    assert {"student": "racer", "tp": "race", "jobs": 2, "completed": 2} in probe["report"]


@pytest.mark.slow
def test_race_notebook_local(isolated):
    # what Day 1 and Day 2 chose, as their notebooks save it: the race form starts from it, the run carries it
    notes = {"batch_size": 8, "amp": "bf16", "tf32": False, "channels_last": True, "loader": ["--num-workers", "1"]}
    (isolated / "runs").mkdir()
    (isolated / "runs" / "course-notes-racer.json").write_text(json.dumps(notes))
    results, probe, text = execute({**TINY, "BATCH_SIZE": None, "BEGIN": "22:00"}, isolated)
    check_race(results, probe, "local")
    argv = probe["argv"]
    assert argv[argv.index("--amp") + 1] == "bf16" and "--channels-last" in argv, argv
    assert argv[argv.index("--num-workers") + 1] == "1" and argv[argv.index("--batch-size") + 1] == "8", argv
    assert "from Day 1: bf16, batch 8, channels_last" in text and "from Day 2: 1 DataLoader worker" in text
    assert probe["begin"] is None and "BEGIN = '22:00' ignored" in text  # no start time on this machine
    assert "epochs = floor((budget − startup)" in text


@pytest.mark.slow
@pytest.mark.slurm
def test_race_notebook_on_local_slurm(isolated, slurm_cluster):
    results, probe, text = execute({**TINY, "PROFILE": "local-slurm", "BEGIN": "now"}, isolated)
    check_race(results, probe, "local-slurm")
    assert probe["begin"] == "now"
    batch = next((isolated / "jobs").rglob(f"{probe['board'][0]['run_id'].split('@')[0]}_submission.sh"), None)
    assert batch is not None and "#SBATCH --begin=now" in batch.read_text().splitlines()


# ---- the check cell's verdicts, on records written by the kit's own recorder (no job needed) ------------------

def race_record(runs: Path, run_id: str, data, val_accs: list[float], epochs: int | None = None) -> None:
    """A finished race run's record: `epochs` asked for, one validation line per value in val_accs."""
    from dlokit.in_job.runrecord import RunRecorder

    config = {"model": "resnet18", "batch_size": 8, "image_size": 32, "data": str(data), "test": False,
              "epochs": epochs or len(val_accs)}
    with RunRecorder(config, run_id=run_id, runs_dir=runs, extra={"name": "racer", "argv": ["--epochs", "2"]}) as rec:
        for epoch, acc in enumerate(val_accs):
            rec.log("val", epoch=epoch, step=6 * (epoch + 1), val_loss=1.0, val_acc=acc, val_acc5=1.0)
        rec.finish(steps=6 * len(val_accs), epochs=len(val_accs), val_acc=val_accs[-1], best_val_acc=max(val_accs))


def test_race_check_passes_only_a_complete_posted_run_within_budget(isolated):
    import dlokit
    from dlokit import race

    dlokit.use_profile("local")
    runs, data = isolated / "runs", isolated / "data"
    for split in ("train", "val"):
        (data / split / "class0").mkdir(parents=True)
        (data / split / "class0" / "a.png").touch()
    race_record(runs, "501", data, [0.3, 0.5])
    race_record(runs, "502", data, [0.3], epochs=2)           # stopped after one of its two epochs
    race_record(runs, "503", "synthetic", [0.9, 0.9])         # no held-out split
    board = race.Leaderboard(isolated / "board", runs, budget_gpu_hours=1.0)

    def verdict(job_id, on=board):
        result = checks.race(job_id, on)
        return result.status, {p.name: p.status for p in result.parts}, result.message

    status, parts, message = verdict("501")
    assert status == "failed" and parts["leaderboard"] == "failed" and "board.post('501')" in message
    board.post("501")
    status, parts, message = verdict("501")
    assert status == "passed" and set(parts.values()) == {"passed"}, message
    assert "best top-1 0.500 in 2 epochs" in message and "rank 1" in message

    status, parts, message = verdict("501", race.Leaderboard(board.folder, runs, budget_gpu_hours=1e-9))
    assert status == "failed" and parts["budget"] == "failed" and message.startswith("over budget")

    entry = board.folder / "racer--501.json"
    entry.write_text(entry.read_text().replace('"top1": 0.5', '"top1": 0.9'))  # a score typed in
    status, parts, message = verdict("501")
    assert parts["leaderboard"] == "failed" and "rejected" in message and "claimed" in message

    for job_id, words in (("502", "epoch(s) [1] have no validation line"), ("503", "--data synthetic")):
        board.post(job_id)
        status, parts, message = verdict(job_id)
        assert status == "failed" and parts["validation"] == "failed" and words in message, message
    status, _, message = verdict("999")
    assert status == "failed" and "left no run record" in message
