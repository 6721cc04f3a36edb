"""The race leaderboard: a folder of small JSON files on the shared filesystem, one per entry.

    board = Leaderboard(profile=day.profile)   # folder: the profile's leaderboard_dir (default <runs>/leaderboard)
    board.post(job_id)                         # the score is read from the run's own record
    board.widget()                             # sorted table, refresh button
    board.plot()                               # top-1 vs GPU-hours, the Pareto front drawn
    board.publish()                            # an instructor: the check every student then sees

No database and no lock (NFS locks are unreliable): each entry is its own file, written to a temporary name
then renamed (board_files), so thirty students posting at once lose and tear nothing. The folder is the
class's, made by the instructors' set-up (`python -m dlokit.classroom folders`: setgid, sticky): a student's
post never creates it, and nobody removes another's entry.

Nothing in an entry file is trusted: it only says which run to show, and it counts only when the Unix user who
owns the run posted it (a copy or a forgery by anyone else is rejected, whatever its name). What a viewer sees
of an entry comes from a record: the run's own, read again, when the viewer may read it (its owner, the
instructors: "record"); otherwise the instructors' last published check of it ("checked by an instructor");
otherwise nothing but "not verified". A run shows once. The instructor's verify-race re-scores every entry.
No secret anywhere: no API key, no hosted service.
"""
from __future__ import annotations

import html
import json
import math
import os
import stat
import time
from pathlib import Path

import pandas as pd

from ..in_job import shared_folders, untrusted
from . import board_files
from ..submission.jobs import RUN_ID_PATTERN
from ..submission.jobspec import NAME_PATTERN
from ..submission.profiles import Profile, current_profile
from ..in_job.runrecord import is_number
from ..analysis.race_history import history

SCHEMA = 1
TOLERANCE = 1e-9
CHECKED_PREFIX = ".checked-"  # the instructors' published check: .checked-<user>.json
MAX_CHECK_BYTES = 8 * 1024 ** 2  # what a student's board reads of it: publish refuses a larger one
NOT_VERIFIED = "not verified"
SET_UP = "python -m dlokit.classroom folders"
COLUMNS = ["rank", "nickname", "top1", "final_top1", "gpu_hours", "over_budget", "energy", "gpus", "epochs",
           "model", "image_size", "batch_size", "options", "run_id", "job_id", "checked", "posted"]


def effective_options(argv) -> list[str]:
    """The options as the script's parser read them: where one is repeated (the day's size, then the race
    form's) only its last value, which is the one that ran, in the place it first appeared."""
    argv, kept = [str(a) for a in argv], {}
    i = 0
    while i < len(argv):
        takes_value = argv[i].startswith("--") and "=" not in argv[i] and i + 1 < len(argv) \
            and not argv[i + 1].startswith("--")
        kept[argv[i] if argv[i].startswith("--") else f"#{i}"] = argv[i:i + 1 + takes_value]
        i += 1 + takes_value
    return [token for tokens in kept.values() for token in tokens]


class LeaderboardError(ValueError):
    """An entry cannot be posted (the run is not finished, has no validation, belongs to someone else)."""


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, score) points no other point beats on both (less or equal cost, higher score),
    in increasing cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


class Leaderboard:
    def __init__(self, folder=None, runs_dir=None, budget_gpu_hours: float | None = None,
                 profile: Profile | None = None):
        profile = profile or current_profile()
        self.folder = Path(folder) if folder is not None else profile.leaderboard
        self.runs_dir = Path(runs_dir) if runs_dir is not None else profile.runs
        if budget_gpu_hours is None:
            from .planner import budget

            budget_gpu_hours = budget(profile, profile.race_gpus)[1] if (
                profile.race_budget_gpu_hours or profile.race_budget_minutes) else math.inf
        self.budget_gpu_hours = budget_gpu_hours

    # ---- writing -----------------------------------------------------------------------------------------

    def entry(self, job_id: str, nickname: str | None = None) -> dict:
        """An entry for a finished race job, every number read from its record."""
        found = history(job_id, self.runs_dir)
        if not found.segments:
            raise LeaderboardError(f"no run record for job {job_id} under {self.runs_dir}")
        if found.state != "completed":
            raise LeaderboardError(f"job {job_id} is not finished ({found.state}): post it once it has completed")
        if found.best_top1 is None:
            raise LeaderboardError(f"job {job_id} has no validation line: race runs train with --epochs, not --test")
        first = found.segments[0]
        owner = first.info.get("name")
        nickname = nickname or owner
        if owner and nickname != owner:
            raise LeaderboardError(f"job {job_id} was submitted by {owner!r}, not {nickname!r}")
        if not isinstance(nickname, str) or not NAME_PATTERN.fullmatch(nickname):
            raise LeaderboardError(f"nickname {nickname!r}: letters, digits, '.', '_' or '-'")
        usage, config = found.usage, first.config
        return {"schema": SCHEMA, "nickname": nickname, "run_id": found.job_id, "job_id": found.job_id,
                "segments": [run.run_id for run in found.segments], "options": first.info.get("argv") or [],
                "model": config.get("model"), "image_size": config.get("image_size"),
                "batch_size": config.get("batch_size"), "gpus": first.world_size, "epochs": len(found.val),
                "top1": found.best_top1, "final_top1": found.final_top1, "gpu_hours": usage.gpu_hours,
                "energy_wh": usage.energy_wh, "energy_source": usage.energy_source,
                "budget_gpu_hours": self.budget_gpu_hours if math.isfinite(self.budget_gpu_hours) else None,
                "over_budget": usage.gpu_hours > self.budget_gpu_hours, "posted_at": time.time()}

    def post(self, job_id: str, nickname: str | None = None) -> Path:
        """Write the job's entry (one per run; posting again replaces it); returns its path. Only the run's owner
        may post it."""
        run = self.runs_dir / str(job_id)
        if run.is_dir() and run.stat().st_uid != os.getuid():
            raise LeaderboardError(f"run {job_id} belongs to {untrusted.user_name(run.stat().st_uid)}, not to "
                                   "you: you can post only your own runs")
        return self.write(self.entry(job_id, nickname))

    def write(self, entry: dict) -> Path:
        """The entry under `<nickname>--<run id>.json`, or `<nickname>--<run id>.<random>.json` if another user
        holds that name; this user's earlier posts of the run under such names are removed."""
        name = f"{entry['nickname']}--{entry['run_id']}"
        path = board_files.write_json(self._folder_to_post_in(), f"{name}.json", entry)
        for old in self.folder.glob(f"{name}.*.json"):
            if old != path and old.lstat().st_uid == os.getuid():
                old.unlink(missing_ok=True)
        return path

    def _folder_to_post_in(self) -> Path:
        """The board's folder, refused with what to do when a student cannot (or should not) post in it."""
        folder, fix = self.folder, f"ask an instructor to make it with `{SET_UP}` (docs/instructors.md)"
        if not folder.is_dir():
            parent = folder.parent
            if not (parent.is_dir() and parent.stat().st_uid == os.getuid()):  # a class's folder: its set-up's job
                raise LeaderboardError(f"the race's leaderboard {folder} does not exist, and only the class's set-up "
                                       f"makes it: {fix}")
            shared_folders.shared_top(folder, "the race's leaderboard")  # this user's own runs: their own board
        info = folder.stat()
        if not os.access(folder, os.W_OK | os.X_OK):
            raise LeaderboardError(f"cannot post in {folder}: it belongs to {untrusted.user_name(info.st_uid)} "
                                   f"(mode {stat.S_IMODE(info.st_mode):o}); {fix}")
        if info.st_uid != os.getuid() and info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
            raise LeaderboardError(f"cannot post in {folder}: anyone may remove entries from it (no sticky bit, mode "
                                   f"{stat.S_IMODE(info.st_mode):o}); {fix}")
        return folder

    # ---- reading -----------------------------------------------------------------------------------------

    @staticmethod
    def well_formed(entry) -> str | None:
        """None when the entry has the shape of one, else why not."""
        if not isinstance(entry, dict) or entry.get("schema") != SCHEMA:
            return "not a leaderboard entry"
        nickname, run_id = entry.get("nickname"), entry.get("run_id")
        if not (isinstance(nickname, str) and NAME_PATTERN.fullmatch(nickname)
                and isinstance(run_id, str) and RUN_ID_PATTERN.fullmatch(run_id)):
            return "no valid nickname or run id"
        for key in ("top1", "final_top1", "gpu_hours"):
            if not is_number(entry.get(key)):
                return f"'{key}' is not a number"
        return None

    def verify(self, entry) -> str | None:
        """None when the entry matches its run's record, else why it is rejected."""
        if why := self.well_formed(entry):
            return why
        nickname, run_id = entry["nickname"], entry["run_id"]
        found = history(run_id, self.runs_dir)
        if not found.segments:
            return f"its run record {run_id} is missing from {self.runs_dir}"
        if found.state != "completed":
            return f"its run {run_id} is not completed ({found.state})"
        owner = found.segments[0].info.get("name")
        if owner != nickname:
            return f"run {run_id} belongs to {owner!r}, not {nickname!r}"
        best = found.best_top1
        if best is None:
            return f"run {run_id} recorded no validation"
        summaries = [run.summary.get("best_val_acc") for run in found.segments]
        if max((s for s in summaries if is_number(s)), default=None) != best:
            return f"run {run_id}: its summaries' best top-1 {summaries} do not match its validation lines ({best})"
        if abs(entry["top1"] - best) > TOLERANCE or abs(entry["final_top1"] - found.final_top1) > TOLERANCE:
            return f"top-1 {entry['top1']} claimed, its record says {best}"
        used = found.usage.gpu_hours or 0.0
        if abs(entry["gpu_hours"] - used) > max(TOLERANCE, 1e-6 * used):
            return f"{entry['gpu_hours']} GPU-hours claimed, its record says {used}"
        return None

    def read(self) -> tuple[list[dict], list[tuple[str, str]]]:
        """(the entries shown, [(file name, why rejected)]). An entry file only says which run to show; what the
        board shows of it comes from a record (see the module's docstring), and a run shows once."""
        accepted, rejected, candidates = [], [], {}
        for found in board_files.read_json_files(self.folder):
            if found.name.startswith("."):
                continue
            why = found.problem or self.well_formed(found.value) or self._posted_by_owner(found)
            if why:
                rejected.append((found.name, why))
            else:
                candidates.setdefault(found.value["run_id"], []).append(found)
        try:
            published, when, checked_rejections = self.published()
        except LeaderboardError as error:  # named to whoever reads the board; others' entries then read not verified
            published, when, checked_rejections = {}, "", {}
            rejected.append((f"{CHECKED_PREFIX}*", str(error)))
        for run_id, files in candidates.items():
            shown = None
            for found in sorted(files, key=lambda f: (f.name != f"{f.value['nickname']}--{run_id}.json",
                                                      -_posted_at(f.value))):
                why, fresh = self._shown(found.value, published, when, checked_rejections)
                if not why and shown:
                    why = f"a second entry for run {run_id} (the board shows {shown})"
                if why:
                    rejected.append((found.name, why))
                    continue
                shown = found.name
                accepted.append({**fresh, "posted_at": _posted_at(found.value) or None})
        rejected += [(f"{row.get('nickname')}--{run_id}", f"its entry was on the board when an instructor checked it "
                      f"({when}) and is gone from the folder") for run_id, row in published.items()
                     if run_id not in candidates]
        return accepted, rejected

    def _shown(self, entry: dict, published: dict, when: str, checked_rejections: dict):
        """(why the entry is rejected or None, what the board shows of it): from its record when this user reads
        it, else from the instructors' published check, else "not verified"."""
        run_id = entry["run_id"]
        if self._readable(run_id):
            why = self.verify(entry)
            return why, None if why else {**self.entry(run_id, entry["nickname"]), "checked": "record"}  # this budget
        if run_id in published:
            if published[run_id].get("nickname") != entry["nickname"]:
                return f"run {run_id} is {published[run_id].get('nickname')!r}'s, not {entry['nickname']!r}", None
            return None, {**published[run_id], "checked": f"checked by an instructor ({when})"}
        if run_id in checked_rejections:
            return checked_rejections[run_id], None
        return None, {"nickname": entry["nickname"], "run_id": run_id, "job_id": run_id, "checked": NOT_VERIFIED}

    def _posted_by_owner(self, found) -> str | None:
        """None when the entry's file belongs to the Unix user who owns its run, else why it is rejected."""
        run_id = found.value["run_id"]
        try:
            owner = (self.runs_dir / run_id).stat().st_uid
        except OSError:
            return f"its run record {run_id} is missing from {self.runs_dir}"
        if found.uid != owner:
            return (f"posted by {untrusted.user_name(found.uid)}, but run {run_id} belongs to "
                    f"{untrusted.user_name(owner)}")
        return None

    def _readable(self, run_id: str) -> bool:
        return os.access(self.runs_dir / run_id, os.R_OK | os.X_OK)

    # ---- the instructors' check, published for the students ---------------------------------------------------

    def publish(self) -> Path:
        """An instructor (who reads every record) writes what the board shows, checked against the records, for the
        students, who may not read each other's records. Returns the file written."""
        if os.getuid() not in board_files.trusted_uids(self.folder):
            raise LeaderboardError(f"only the instructors publish the board's check in {self.folder} (the group of "
                                   f"a class folder made with `{SET_UP}`)")
        accepted, rejected = self.read()
        if any(entry["checked"] == NOT_VERIFIED for entry in accepted):
            raise LeaderboardError("some runs cannot be read by you: publish as a user who reads every record")
        by_run = {}
        for found in board_files.read_json_files(self.folder):
            if isinstance(found.value, dict) and not found.name.startswith("."):
                by_run.setdefault(found.name, found.value.get("run_id"))
        check = {"schema": SCHEMA, "published_at": time.time(), "by": untrusted.user_name(os.getuid()),
                 "accepted": [{k: v for k, v in e.items() if k != "checked"} for e in accepted],
                 "rejected": {by_run[name]: why for name, why in rejected if isinstance(by_run.get(name), str)}}
        size = len(json.dumps(check, indent=1).encode())
        if size > MAX_CHECK_BYTES:
            raise LeaderboardError(f"the check would be {size / 1024 ** 2:.1f} MiB, over the {MAX_CHECK_BYTES >> 20} MiB "
                                   f"a student's board reads: not published. {len(accepted)} entries are shown; remove "
                                   "the rejected ones that bloat it (`python -m dlokit.classroom board` lists them)")
        name = f"{CHECKED_PREFIX}{untrusted.user_name(os.getuid())}"
        path = board_files.write_json(self.folder, f"{name}.json", check)
        for old in self.folder.glob(f"{name}.*.json"):  # written earlier past a squatted name: this one replaces them
            if old != path and old.lstat().st_uid == os.getuid():
                old.unlink(missing_ok=True)
        return path

    def published(self) -> tuple[dict, str, dict]:
        """The instructors' latest published check: ({run id: entry as the record has it}, when, {run id: why
        rejected}); empty when none (files by anyone but the instructors are ignored)."""
        trusted = board_files.trusted_uids(self.folder)
        found = [f for f in board_files.read_json_files(self.folder, CHECKED_PREFIX, max_bytes=MAX_CHECK_BYTES)
                 if f.uid in trusted]
        broken = [f for f in found if f.problem is not None]
        if broken:  # never an older check in its place: what the board shows would be stale, silently
            raise LeaderboardError(f"the instructors' check {broken[0].name} cannot be read ({broken[0].problem}): "
                                   "ask an instructor to publish it again")
        checks = [f.value for f in found if isinstance(f.value, dict) and f.value.get("schema") == SCHEMA
                  and isinstance(f.value.get("accepted"), list)]
        if not checks:
            return {}, "", {}
        latest = max(checks, key=_posted_at_key)
        accepted = {e["run_id"]: e for e in latest["accepted"] if isinstance(e, dict) and isinstance(e.get("run_id"), str)}
        rejections = latest.get("rejected") if isinstance(latest.get("rejected"), dict) else {}
        when = time.strftime("%m-%d %H:%M", time.localtime(_posted_at_key(latest)))
        return accepted, when, {k: f"an instructor's check: {v}" for k, v in rejections.items()}

    def table(self) -> pd.DataFrame:
        """The verified entries, best top-1 first (then fewer GPU-hours)."""
        accepted, _ = self.read()
        rows = [{**entry, "energy": "n/a" if entry.get("energy_wh") is None else
                 f"{entry['energy_wh']:.3g} Wh ({entry.get('energy_source')})",
                 "options": " ".join(effective_options(entry.get("options") or [])),
                 "posted": time.strftime("%m-%d %H:%M", time.localtime(entry.get("posted_at") or 0))}
                for entry in accepted]
        table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "rank"])
        table = table.sort_values(["top1", "gpu_hours"], ascending=[False, True]).reset_index(drop=True)
        table.insert(0, "rank", range(1, len(table) + 1))
        return table

    def html(self) -> str:
        table = self.table()
        _, rejected = self.read()
        shown = table.drop(columns=["options", "job_id"]).copy()
        for column, form in (("top1", "{:.3f}"), ("final_top1", "{:.3f}"), ("gpu_hours", "{:.3g}")):
            shown[column] = shown[column].map(lambda value, form=form: form.format(value) if is_number(value)
                                              and not math.isnan(value) else "–")
        over = shown["over_budget"].map(lambda value: value is not None and value == True)  # noqa: E712 (numpy bool, NaN)
        shown["over_budget"] = over.map(lambda flagged: "⚠ over budget" if flagged else "")
        body = (shown.to_html(index=False, classes="dlokit-leaderboard", border=0) if len(shown)
                else "<p>no entry yet</p>")
        budget = f"{self.budget_gpu_hours:.3g} GPU-hours" if math.isfinite(self.budget_gpu_hours) else "none"
        notes = "".join(f"<li>{html.escape(name)}: {html.escape(why)}</li>" for name, why in rejected)
        return (f"<p><b>Imagenet Race leaderboard</b> ({html.escape(str(self.folder))}; budget {budget}; "
                f"{time.strftime('%H:%M:%S')})</p>{body}"
                + (f"<p>rejected entries:</p><ul>{notes}</ul>" if notes else ""))

    def widget(self):
        """The sorted table in a widget, with a button that reads the folder again."""
        import ipywidgets as widgets

        board = widgets.HTML(self.html())
        button = widgets.Button(description="refresh", icon="refresh")
        button.on_click(lambda _: setattr(board, "value", self.html()))
        return widgets.VBox([board, button])

    def plot(self, ax=None):
        """Top-1 against GPU-hours, one point per entry (× over budget), the Pareto front as a step line."""
        import matplotlib.pyplot as plt

        table = self.table().dropna(subset=["top1", "gpu_hours"])  # "not verified": no value to place
        figure = None
        if ax is None:
            figure, ax = plt.subplots(figsize=(7, 4.5))
        points = list(zip(table["gpu_hours"], table["top1"]))
        for row in table.itertuples():
            ax.scatter(row.gpu_hours, row.top1, marker="x" if row.over_budget else "o",
                       color="#cf222e" if row.over_budget else "#0969da")
            ax.annotate(row.nickname, (row.gpu_hours, row.top1), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
        front = [points[i] for i in pareto_front(points)]
        if front:  # a ring on each entry of the front: a front of one entry has no line to draw
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="#1a7f37")
            ax.plot([p[0] for p in front], [p[1] for p in front], "o", markersize=12, markerfacecolor="none",
                    color="#1a7f37", label="Pareto front (no entry both cheaper and better)")
        if math.isfinite(self.budget_gpu_hours):
            ax.axvline(self.budget_gpu_hours, color="#6e7781", linestyle="--", linewidth=1,
                       label=f"budget: {self.budget_gpu_hours:.3g} GPU-hours")
        if front or math.isfinite(self.budget_gpu_hours):
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xlabel("GPU-hours")
        ax.set_ylabel("best validation top-1")
        ax.set_title("Imagenet Race: accuracy against cost" if len(table) else "Imagenet Race: no entry yet")
        return figure or ax.figure


def _posted_at(entry: dict) -> float:
    return entry["posted_at"] if is_number(entry.get("posted_at")) else 0.0


def _posted_at_key(check: dict) -> float:
    return check["published_at"] if is_number(check.get("published_at")) else 0.0
