"""The race leaderboard: a folder of small JSON files on the shared filesystem, one per entry.

    board = Leaderboard(profile=day.profile)   # folder: the profile's leaderboard_dir (default <runs>/leaderboard)
    board.post(job_id)                         # the score is read from the run's own record
    board.widget()                             # sorted table, refresh button
    board.plot()                               # top-1 vs GPU-hours, the Pareto front drawn

No database and no lock (NFS locks are unreliable): each entry is its own file, written to a temporary name
then renamed (os.replace is atomic), so thirty students posting at once lose and tear nothing. Nothing in an
entry is trusted: reading the board (and `verify`) re-reads each run's record from the board's runs folder
and rejects an entry whose score, GPU-hours or student do not match it, or whose record is missing; what the
board shows of an accepted entry comes from the record, never from the file, and a run shows once. Another
student's record is theirs (only they and the instructors read it): such an entry is shown as posted
("checked": "as posted") if the Unix user who posted it owns the run, and the instructor's verify-race, which
reads every record, re-scores it. No
secret anywhere: no API key, no hosted service.
"""
from __future__ import annotations

import html
import json
import math
import os
import secrets
import time
from pathlib import Path

import pandas as pd

from ..in_job import shared_folders
from ..submission.jobs import JOB_ID_PATTERN
from ..submission.jobspec import NAME_PATTERN
from ..submission.profiles import Profile, current_profile
from ..in_job.runrecord import is_number
from ..analysis.race_history import history

SCHEMA = 1
TOLERANCE = 1e-9
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
        """Write the job's entry (one file per student and run; posting again replaces it); returns its path."""
        return self.write(self.entry(job_id, nickname))

    def write(self, entry: dict) -> Path:
        """Atomically: a temporary file of this process, flushed to disk, renamed over the entry's name."""
        shared_folders.shared_top(self.folder, "the race's leaderboard")  # every student posts here
        path = self.folder / f"{entry['nickname']}--{entry['run_id']}.json"
        tmp = self.folder / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        with open(tmp, "w") as handle:
            json.dump(entry, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        return path

    # ---- reading -----------------------------------------------------------------------------------------

    @staticmethod
    def well_formed(entry) -> str | None:
        """None when the entry has the shape of one, else why not."""
        if not isinstance(entry, dict) or entry.get("schema") != SCHEMA:
            return "not a leaderboard entry"
        nickname, run_id = entry.get("nickname"), entry.get("run_id")
        if not (isinstance(nickname, str) and NAME_PATTERN.fullmatch(nickname)
                and isinstance(run_id, str) and JOB_ID_PATTERN.fullmatch(run_id)):
            return "no valid nickname or run id"
        for key in ("top1", "final_top1", "gpu_hours"):
            if not is_number(entry.get(key)):
                return f"'{key}' is not a number"
        return None

    def private_record(self, entry: dict, path: Path) -> str | None:
        """For an entry whose run record this user may not read (another student's, see shared_folders): None
        when the entry file was posted by the Unix user who owns the run, else why it is rejected."""
        if path.stat().st_uid != (self.runs_dir / entry["run_id"]).stat().st_uid:
            return f"posted by another user than the owner of run {entry['run_id']}"
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
        """(the verified entries, [(file name, why rejected)]). An entry file only says which run to show: what
        the board shows of it (GPUs, epochs, model, batch, options, energy, score) is read again from the run's
        record, and a run shows once, whatever the files that name it."""
        accepted, rejected, shown = [], [], {}
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError) as error:
                rejected.append((path.name, f"unreadable ({type(error).__name__})"))
                continue
            why = self.well_formed(entry)
            private = not why and self._unreadable(entry["run_id"])
            if not why:
                why = self.private_record(entry, path) if private else self.verify(entry)
            if not why and entry["run_id"] in shown:
                why = f"a second entry for run {entry['run_id']} (the board shows {shown[entry['run_id']]})"
            if why:
                rejected.append((path.name, why))
                continue
            shown[entry["run_id"]] = path.name
            if private:  # only its owner and the instructors read it: shown as posted, re-scored by verify-race
                fresh = {key: entry.get(key) for key in COLUMNS if key not in ("rank", "posted", "energy")}
                fresh.update(energy_wh=entry.get("energy_wh"), energy_source=entry.get("energy_source"),
                             over_budget=entry["gpu_hours"] > self.budget_gpu_hours, checked="as posted")
            else:
                fresh = {**self.entry(entry["run_id"], entry["nickname"]), "checked": "record"}  # this budget
            fresh["posted_at"] = entry["posted_at"] if is_number(entry.get("posted_at")) else None
            accepted.append(fresh)
        return accepted, rejected

    def _unreadable(self, run_id: str) -> bool:
        folder = self.runs_dir / run_id
        return folder.is_dir() and not os.access(folder, os.R_OK | os.X_OK)

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
        shown["top1"] = shown["top1"].map("{:.3f}".format)
        shown["final_top1"] = shown["final_top1"].map("{:.3f}".format)
        shown["gpu_hours"] = shown["gpu_hours"].map("{:.3g}".format)
        shown["over_budget"] = shown["over_budget"].map(lambda over: "⚠ over budget" if over else "")
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

        table = self.table()
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
        if front:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="#1a7f37",
                    label="Pareto front")
            ax.legend(loc="lower right")
        if math.isfinite(self.budget_gpu_hours):
            ax.axvline(self.budget_gpu_hours, color="#6e7781", linestyle="--", linewidth=1)
        ax.set_xlabel("GPU-hours")
        ax.set_ylabel("best validation top-1")
        ax.set_title("Imagenet Race: accuracy against cost" if len(table) else "Imagenet Race: no entry yet")
        return figure or ax.figure
