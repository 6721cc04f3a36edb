"""What one student writes is untrusted input for everyone else: real Unix users (two students, one instructor) in
a class folder made by the instructors' set-up (`python -m dlokit.classroom folders`).

- A checkpoint that would run code when unpickled is refused by the instructor's verify-race, named, never run.
- The leaderboard: a FIFO, a squatted file name and a deleted entry neither hang the readers nor hide anyone's
  entry; a hand-edited entry never shows its claimed values to anyone: the record's, the instructors' published
  check of it, or "not verified".
- A student's post never creates the class's board folder.

Needs root (useradd, runuser)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_many_users import INSTRUCTOR, INSTRUCTORS, REPO, USERS, as_user, class_folder, instructors_class  # noqa: F401

sys.path.insert(0, str(REPO / "data"))
import make_synthetic_imagenet  # noqa: E402

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root (real Unix users)"),
              pytest.mark.xdist_group("many-users")]

STUDENT = """
import json, math, os, sys
from pathlib import Path
from dlokit import race
action, run_id, nickname, runs = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
board = race.Leaderboard(runs / "leaderboard", runs, budget_gpu_hours=math.inf)
if action in ("run", "evil"):  # a finished race run of this student, its checkpoint, its entry
    import torch, torchvision  # here only: the board's readers and editors start without them (5-8 s each)
    from dlokit.in_job.runrecord import RunRecorder
    with RunRecorder({"model": "resnet18", "batch_size": 8, "image_size": 32}, run_id=run_id, runs_dir=runs,
                     extra={"name": nickname, "argv": ["--epochs", "1"]}) as recorder:
        recorder.log("val", epoch=0, step=6, val_loss=1.0, val_acc=0.5, val_acc5=1.0)
        recorder.finish(steps=6, epochs=1, val_acc=0.5, best_val_acc=0.5)
    class Evil:  # unpickled, it would run a command as whoever loads it
        def __reduce__(self):
            return (os.system, (f"id -un > {runs.parent / 'ran-as'}",))
    model = Evil() if action == "evil" else torchvision.models.resnet18(num_classes=4).state_dict()
    torch.save({"model": model}, runs / run_id / "checkpoint.pt")
    try:
        print(json.dumps({"posted": board.post(run_id).name}))
    except race.LeaderboardError as error:
        print(json.dumps({"refused": str(error)}))
elif action == "edit":  # the student's own entry, edited by hand
    path = runs / "leaderboard" / f"{nickname}--{run_id}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **json.loads(sys.argv[5])}))
elif action == "squat":  # a file under the name another student's next entry would take, and a FIFO
    (runs / "leaderboard" / sys.argv[5]).write_text("{}")
    os.mkfifo(runs / "leaderboard" / "zz-fifo.json")
elif action == "delete":
    try:
        (runs / "leaderboard" / sys.argv[5]).unlink()
        print(json.dumps({"deleted": True}))
    except PermissionError:
        print(json.dumps({"deleted": False}))
if action == "publish":
    print(json.dumps({"published": board.publish().name}))
accepted, rejected = board.read()
print(json.dumps({"shown": {e["run_id"]: e for e in accepted}, "rejected": rejected,
                  "tmp": [p.name for p in (runs / "leaderboard").glob("*.tmp")]}))
"""

VERIFY = """
import json, sys, dlokit
from dlokit import race
dlokit.use_profile("local", race_test_dir=sys.argv[1])
table = race.verify_race(time_max="00:03:00")
print(json.dumps(table[["nickname", "run_id", "test_top1", "flag"]].to_dict("records")))
"""


def run_as(user: str, lab: Path, code: str, *args: str):
    """What the user's process printed as JSON (its lines' objects merged, or its last list); it must end (a reader
    that hangs fails the test)."""
    process = as_user(user, lab, code, *args)
    out, err = process.communicate(timeout=300)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith(("{", "["))]
    assert process.returncode == 0 and lines, f"rc {process.returncode}\n{out}\n{err}"
    if isinstance(lines[-1], list):
        return lines[-1]
    return {key: value for line in lines for key, value in line.items()}


@pytest.fixture(scope="module")
def lab(instructors_class):  # noqa: F811
    """The class folders, the leaderboard among them, made by the instructors' set-up (as root, as the hub does)."""
    env = {**os.environ, "DLOKIT_LOG_DIR": str(instructors_class / "dlokit_jobs"),
           "DLOKIT_RUNS_DIR": str(instructors_class / "runs")}
    made = subprocess.run([sys.executable, "-m", "dlokit.classroom", "folders", "--group", INSTRUCTORS],
                          capture_output=True, text=True, env=env, timeout=120)
    assert made.returncode == 0 and "leaderboard: mode 3777" in made.stdout, made.stdout + made.stderr
    return instructors_class


def test_a_students_post_never_creates_the_class_board(class_folder):  # noqa: F811
    """In a runs folder the class's set-up made without a board, the post is refused, saying how to ask for it."""
    runs = class_folder / "bare-runs"
    subprocess.run(["install", "-d", "-m", "3777", str(runs)], check=True)
    said = run_as(USERS[0], class_folder, STUDENT, "run", "1128-090000-0001", "ann", str(runs))
    assert "python -m dlokit.classroom folders" in said.get("refused", ""), said
    assert not (runs / "leaderboard").exists()


def test_a_checkpoint_that_would_run_code_is_refused_by_verify_race(lab):
    runs = lab / "runs"
    run_as(USERS[0], lab, STUDENT, "run", "1128-100000-0a0a", "ann", str(runs))
    run_as(USERS[1], lab, STUDENT, "evil", "1128-100000-0b0b", "bob", str(runs))
    test = lab / "instructors-test"
    make_synthetic_imagenet.main(["--out", str(lab / "held-out"), "--classes", "4", "--train-per-class", "1",
                                  "--val-per-class", "2", "--size", "36", "--quiet"])
    (lab / "held-out" / "val").rename(test)
    subprocess.run(["chgrp", "-R", INSTRUCTORS, str(test)], check=True)
    subprocess.run(["chmod", "-R", "o-rwx,g+rX", str(test)], check=True)

    rows = {row["nickname"]: row for row in run_as(INSTRUCTOR, lab, VERIFY, str(test))}
    assert not (lab / "ran-as").exists(), "the student's checkpoint ran code as the instructor"
    assert "holds more than weights" in rows["bob"]["flag"] and rows["bob"]["flag"].startswith("refused: "), rows
    assert rows["ann"]["flag"] == "" and 0 <= rows["ann"]["test_top1"] <= 1, rows  # the honest one is scored
    said = as_user(INSTRUCTOR, lab, "import sys\nfrom dlokit.classroom import main\nsys.exit(main(sys.argv[1:]))",
                   "verify-race", "--profile", "local", "--test", str(test))
    out, err = said.communicate(timeout=300)
    assert said.returncode == 0 and "2 entries, 1 scored, 1 not scored" in out, out + err
    assert "OUT_OF_MEMORY" not in out and "refused: " in out, out


def test_the_board_survives_what_students_put_in_it_and_shows_no_claimed_value(lab):
    runs, board = lab / "runs", lab / "runs" / "leaderboard"
    ann, bob, ann2, bob2 = "1128-110000-0a01", "1128-110000-0b01", "1128-110000-0a02", "1128-110000-0b02"
    run_as(USERS[0], lab, STUDENT, "run", ann, "ann", str(runs))
    run_as(USERS[1], lab, STUDENT, "run", bob, "bob", str(runs))
    run_as(USERS[1], lab, STUDENT, "run", bob2, "bob", str(runs))
    forged = {"gpus": 64, "epochs": 999, "model": "vit_h_14"}
    run_as(USERS[1], lab, STUDENT, "edit", bob, "bob", str(runs), json.dumps({**forged, "top1": 0.97}))
    run_as(USERS[1], lab, STUDENT, "edit", bob2, "bob", str(runs), json.dumps(forged))
    run_as(USERS[1], lab, STUDENT, "squat", bob, "bob", str(runs), f"ann--{ann2}.json")

    seen = run_as(USERS[0], lab, STUDENT, "run", ann2, "ann", str(runs))  # posts past the squatted name
    assert {ann, ann2, bob, bob2} <= set(seen["shown"]) and seen["tmp"] == [], seen
    assert seen["shown"][ann2]["checked"] == "record" and seen["shown"][ann2]["top1"] == 0.5
    for run in (bob, bob2):  # another student's record: no value the file claims, and nothing else either
        assert seen["shown"][run]["checked"] == "not verified" and "top1" not in seen["shown"][run], seen
    reasons = dict(seen["rejected"])
    assert "not a regular file" in reasons["zz-fifo.json"] and "not a leaderboard entry" in reasons[f"ann--{ann2}.json"]

    teacher = run_as(INSTRUCTOR, lab, STUDENT, "publish", bob, "-", str(runs))
    assert {ann, ann2, bob2} <= set(teacher["shown"]) and bob not in teacher["shown"], teacher
    assert "top-1 0.97 claimed, its record says 0.5" in dict(teacher["rejected"])[f"bob--{bob}.json"]
    assert {k: teacher["shown"][bob2][k] for k in forged} == {"gpus": 1, "epochs": 1, "model": "resnet18"}

    after = run_as(USERS[0], lab, STUDENT, "read", ann, "ann", str(runs))
    assert {ann, ann2, bob2} <= set(after["shown"]) and bob not in after["shown"], after
    assert after["shown"][bob2]["checked"].startswith("checked by an instructor")
    assert {k: after["shown"][bob2][k] for k in forged} == {"gpus": 1, "epochs": 1, "model": "resnet18"}
    assert "an instructor's check: top-1 0.97 claimed" in dict(after["rejected"])[f"bob--{bob}.json"]

    assert run_as(USERS[1], lab, STUDENT, "delete", ann, "bob", str(runs), f"ann--{ann}.json")["deleted"] is False
    gone = run_as(USERS[0], lab, STUDENT, "delete", ann, "ann", str(runs), f"ann--{ann}.json")
    assert ann not in gone["shown"], gone
    assert any(name == f"ann--{ann}" and "is gone from the folder" in why for name, why in gone["rejected"]), gone
