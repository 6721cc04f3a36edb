"""One training run as the notebooks see it: every rank's record, read tolerantly.

Nothing on disk makes a Run raise: a record file that cannot be used gives the state
"unreadable: rank<k>/<file>: <why>" (see dlokit.in_job.runrecord.read_rank), smaller damage (skipped metrics
lines, dropped fields) is listed in `problems`, and every view shows both instead of failing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dlokit.in_job import untrusted
from dlokit.in_job.runrecord import UNREADABLE, default_runs_dir, read_rank, refused_rank

COMPLETED, FAILED, RUNNING, MISSING = "completed", "failed", "running or killed", "missing"
CANCELLED, SKIPPED = "cancelled", "skipped"
CHECKPOINTED = "checkpointed"  # a race segment that saved on Slurm's signal and requeued (dlokit.race)
ENDED_BADLY = (FAILED, "oom", "aborted")  # summary statuses of a run that stopped on an error
OOM_MARKERS = ("out of memory", "outofmemoryerror", "can't allocate memory")  # the last: PyTorch's CPU allocator


@dataclass
class Run:
    """A run record: `ranks` maps rank -> read_rank() dict; the other fields summarise them."""

    run_id: str
    path: Path
    ranks: dict[int, dict] = field(default_factory=dict)
    owner: int | None = None  # the uid whose folder it is (None: no folder)

    @property
    def rank0(self) -> dict:
        if not self.ranks:
            return {"run": None, "metrics": [], "summary": None, "state": MISSING, "truncated": False,
                    "unreadable": None, "problems": []}
        return self.ranks[min(self.ranks)]

    @property
    def info(self) -> dict:
        return self.rank0["run"] or {}

    @property
    def config(self) -> dict:
        config = self.info.get("config")
        return config if isinstance(config, dict) else {}

    @property
    def summary(self) -> dict:
        return self.rank0["summary"] or {}

    @property
    def summaries(self) -> list[dict]:
        return [r["summary"] for r in self.ranks.values() if r["summary"]]

    @property
    def world_size(self) -> int:
        try:
            return max(1, int(self.info.get("world_size") or len(self.ranks) or 1))
        except (TypeError, ValueError):
            return max(1, len(self.ranks))

    @property
    def device_type(self) -> str:
        """'cuda' or 'cpu': the device the run was meant to compute on: the script's resolved device or the one it was
        told (--device), else whether its process saw a GPU. Never its process group's backend: an FSDP2 job that
        offloads to the host joins "cpu:gloo,cuda:nccl" on GPUs."""
        for told in (self.config.get("device_type"), self.summary.get("device_type"), self.config.get("device")):
            kind = str(told or "").split(":")[0]
            if kind in ("cpu", "cuda"):
                return kind
        return "cuda" if (self.info.get("hardware") or {}).get("gpu_count") else "cpu"

    @property
    def on_gpu(self) -> bool:
        return self.device_type == "cuda"

    @property
    def unreadable(self) -> str | None:
        """'rank<k>/<file>: <why>' of the first record file that could not be used at all, else None."""
        return next((r["unreadable"] for _, r in sorted(self.ranks.items()) if r.get("unreadable")), None)

    @property
    def problems(self) -> list[str]:
        """Everything the reader could not use, file by file: unreadable files, skipped lines, dropped fields."""
        return [p for _, r in sorted(self.ranks.items()) for p in r.get("problems") or []]

    @property
    def state(self) -> str:
        """'completed', 'failed', 'running or killed', 'missing', 'cancelled', 'skipped', 'checkpointed' or
        'unreadable: rank<k>/<file>: <why>'."""
        if self.unreadable:
            return f"{UNREADABLE}: {self.unreadable}"
        states = [r["state"] for r in self.ranks.values()]
        if not states or all(s == MISSING for s in states):
            return MISSING
        if any(s in ENDED_BADLY for s in states):  # the scripts also write "oom" and "aborted"
            return FAILED
        if CANCELLED in states:
            return CANCELLED
        if all(s == COMPLETED for s in states) and len(states) >= self.world_size:
            return COMPLETED
        if all(s in (COMPLETED, SKIPPED) for s in states) and SKIPPED in states:
            return SKIPPED
        if all(s == CHECKPOINTED for s in states) and len(states) >= self.world_size:
            return CHECKPOINTED
        return RUNNING

    @property
    def truncated(self) -> bool:
        return any(r["truncated"] for r in self.ranks.values())

    @property
    def error(self) -> str | None:
        for summary in self.summaries:
            if summary.get("error"):
                return str(summary["error"])
        return None

    @property
    def oom(self) -> bool:
        if any(r["state"] == "oom" for r in self.ranks.values()):  # the scripts' own status for it
            return True
        texts = [self.error or ""]
        texts += [str(m.get("error", "")) for r in self.ranks.values() for m in r["metrics"]
                  if m.get("kind") == "event"]
        return any(marker in text.lower() for text in texts for marker in OOM_MARKERS)

    @property
    def metrics(self) -> pd.DataFrame:
        """Every metrics line of every rank, with a `rank` column."""
        rows = [{"rank": k, **m} for k, r in sorted(self.ranks.items()) for m in r["metrics"]]
        return pd.DataFrame(rows, columns=None if rows else ["rank", "kind", "time"])

    def lines(self, kind: str, rank: int | None = None) -> pd.DataFrame:
        """Metrics lines of one kind ('step', 'epoch', 'val', 'event') for one rank (default: lowest)."""
        rank = min(self.ranks) if rank is None and self.ranks else rank
        record = self.ranks.get(rank, self.rank0)
        lines = pd.DataFrame([m for m in record["metrics"] if m.get("kind") == kind])
        lines.attrs.update(hidden=["kind", "time"],  # the record's bookkeeping: a shown table leaves them out
                           basis=f"the {kind} lines of run {self.run_id}, rank {rank}, as its script wrote them")
        return lines

    @property
    def steps(self) -> pd.DataFrame:
        return self.lines("step")

    @property
    def label(self) -> str:
        name = self.config.get("name") or self.config.get("tag") or self.info.get("name") or self.info.get("tag")
        return f"{self.run_id} ({name})" if name else str(self.run_id)

    def describe_state(self) -> str:
        """One line: 'run 1234: running or killed, 12 steps so far (last line truncated)';
        'run 1234: unreadable: rank0/run.json: not a JSON object (a list); 12 steps readable'; other problems
        of the record follow a ' ⚠ '."""
        state = self.state
        if state == MISSING:
            return f"run {self.run_id}: missing (no record under {self.path})"
        n = len(self.steps)
        if self.unreadable:
            text = f"run {self.label}: {state}; {n} steps readable"
        else:
            text = f"run {self.label}: {state}, {n} steps" + (" so far" if state == RUNNING else "")
        if state == FAILED and self.error:
            text += f" — {self.error[:120]}"
        if self.truncated:
            text += " (last metrics line truncated)"
        others = [p for p in self.problems if p != self.unreadable]
        if others:
            text += f" ⚠ {others[0]}" + (f" (+{len(others) - 1} more)" if len(others) > 1 else "")
        return text

    def __repr__(self) -> str:
        return f"<Run {self.describe_state()}>"


def runs_folder(runs_dir=None) -> Path:
    """runs_dir if given, else the current profile's runs folder (what the notebook's jobs write to)."""
    if runs_dir is not None:
        return Path(runs_dir).expanduser()
    try:
        from dlokit.submission.profiles import current_profile

        return current_profile().runs
    except Exception:  # no usable profile (e.g. a broken profiles file): the plain default
        return default_runs_dir()


def _resolve(run_id_or_path, runs_dir) -> tuple[Path, int | None]:
    """The run's folder, and whose it must be (None: whoever owns it). A job id of this user's is followed to the
    folder its job card names (a Slurm job's is `<id>@<cluster>`), which must be theirs: a folder another user made
    under that id is not their run."""
    text = str(run_id_or_path)
    if os.sep in text or "/" in text:
        path = Path(text).expanduser()
        return (path.parent if path.name.startswith("rank") and (path / "run.json").exists() else path), None
    root = runs_folder(runs_dir)
    try:
        from dlokit.submission.jobs import find_card

        card = find_card(text)
        if Path(card.runs_dir).resolve() == root.resolve():
            return card.run_dir, os.lstat(card.path).st_uid
    except Exception:  # no card of this user's for it (another user's run, a record without a job), or no profile
        pass
    return root / text, None


def _sanitised(record: dict) -> dict:
    """read_rank's record with the types every view relies on (read_rank already checks them)."""
    for key in ("run", "summary"):
        if not isinstance(record.get(key), dict):
            record[key] = None
    record["metrics"] = [m for m in record.get("metrics") or [] if isinstance(m, dict)]
    record.setdefault("unreadable", None)
    record.setdefault("problems", [])
    return record


def load_run(run_id_or_path, runs_dir=None, owner: int | None = None, metrics: bool = True) -> Run:
    """A run by job id (looked up in runs_dir, default $DLOKIT_RUNS_DIR or ./runs) or by folder path. Every file of
    it must be `owner`'s (a uid; default: the job's, see _resolve, else the folder's owner); a run that is not is
    read as unreadable, naming why. metrics=False reads run.json and summary.json only."""
    if isinstance(run_id_or_path, Run):
        return run_id_or_path
    path, expected = _resolve(run_id_or_path, runs_dir)
    owner = owner if owner is not None else expected
    try:
        found = untrusted.folder_owner(path)
    except FileNotFoundError:
        return Run(run_id=path.name, path=path)
    except untrusted.Refused as error:
        return Run(run_id=path.name, path=path, ranks={0: refused_rank(error.why)})
    if owner is not None and found != owner:
        why = (f"{path.name}: belongs to {untrusted.user_name(found)}, not to {untrusted.user_name(owner)} whose job "
               "it is: not read")
        return Run(run_id=path.name, path=path, ranks={0: refused_rank(why)}, owner=found)
    ranks = {}
    for folder in sorted(path.glob("rank*")):
        suffix = folder.name[4:]
        if suffix.isdigit():  # a 'rank0' that is not a folder reads as unreadable
            ranks[int(suffix)] = _sanitised(read_rank(folder, found, metrics))
    return Run(run_id=path.name, path=path, ranks=ranks, owner=found)


def list_run_ids(runs_dir=None) -> list[str]:
    """Run ids under runs_dir, oldest first."""
    root = runs_folder(runs_dir)
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and any(p.glob("rank*"))]
    return [p.name for p in sorted(folders, key=lambda p: (p.lstat().st_mtime, p.name))]


def load_runs(run_ids=None, runs_dir=None, metrics: bool = True) -> list[Run]:
    """Several runs: given ids/paths/Run objects, or every run under runs_dir."""
    if run_ids is None:
        run_ids = list_run_ids(runs_dir)
    elif isinstance(run_ids, (str, os.PathLike, Run)):
        run_ids = [run_ids]
    return [load_run(r, runs_dir, metrics=metrics) for r in run_ids]


def ran_on_gpu(run_id_or_path, runs_dir=None) -> bool:
    """Did this run have a GPU (its record's hardware)? What decides a day's GPU-only comparisons."""
    return load_run(run_id_or_path, runs_dir).on_gpu


def arm_jobs(arms: dict, without=()) -> list:
    """The job ids of the arms of a comparison ({label: [ids]}, as day.submit_arms returns them), in order, but
    those of the labels in `without`."""
    return [job for label, jobs in arms.items() if label not in without for job in jobs]
