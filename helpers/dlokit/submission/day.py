"""One call sets up a course day: the profile, the training script, the data, and a command builder.

    day = dlokit.setup_day(NICKNAME, PROFILE, SCRIPTS, data=DATA, model=MODEL, image_size=IMAGE_SIZE,
                           batch_size=BATCH_SIZE, steps=STEPS)
    ids = day.submit(day.command("--amp", "bf16"))     # submits, shows the live queue, returns the ids
    analysis.compare_runs(ids)                          # views read the profile's runs folder

The cell -> helper -> script path is one hop each: `day.command` writes the command line of
`<SCRIPTS>/train_classifier.py`, `day.submit` is `dlokit.gpu_jobs_submitter(..., wait=True)`. Day 4's
`setup_llm_day` gives an LlmDay, whose `command(mode, ...)` writes those of `tp_scripts/llm/`.
"""
from __future__ import annotations

import json
import numbers
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from . import week
from .jobspec import check_name
from .profiles import Profile, use_profile
from .submit import gpu_jobs_submitter

REPO = Path(__file__).resolve().parents[3]
DATA_MAKER = REPO / "data" / "make_synthetic_imagenet.py"


def size(label: str, value) -> int:
    """`value` as an int when it is a whole number above 0; else a ValueError naming `label` (what to change)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{label} = {value!r}: give a whole number above 0")
    return int(value)


@dataclass
class Day:
    nickname: str
    profile: Profile
    script: Path
    data: str
    model: str = "resnet18"
    image_size: int = 64
    batch_size: int = 16
    steps: int = 10
    time_max: str = "00:10:00"
    refresh_s: float = 5.0
    carry_from: tuple = ()      # the earlier days whose choices every command starts from (dlokit.submission.week)
    submitted: list = field(default_factory=list)

    @property
    def runs(self) -> Path:
        return self.profile.runs

    @property
    def solutions(self) -> bool:
        """Is this day running the reference solutions (the course runner's default)?"""
        return self.script.resolve().parent.name == "solutions"

    def command(self, *options, batch_size: int | None = None, steps: int | None = None,
                epochs: int | None = None, script: str | None = None) -> str:
        """The command line of one job of the training script: what the earlier days chose (`carried`), then the
        TP's options, which win where they name the same option; a timed `--test` run of `steps` steps, or, with
        `epochs`, a real training with validation after each epoch.
        `script`: another script a TP runs (read_bench.py), with `options` only."""
        if script is not None:
            return shlex.join([str(self.beside(script)), *map(str, options)])
        batch_size = self.batch_size if batch_size is None else size("day.command(batch_size=...)", batch_size)
        steps = self.steps if steps is None else size("day.command(steps=...)", steps)
        length = ["--epochs", str(size("day.command(epochs=...)", epochs))] if epochs is not None else \
            ["--test", "--test-nsteps", str(steps)]
        argv = [str(self.script), "--data", self.data, "--model", self.model, "--image-size", str(self.image_size),
                "--batch-size", str(batch_size), *length, "--print-every", "1",
                *week.without_overridden(self.carried, options), *map(str, options)]
        return shlex.join(argv)

    @property
    def carried(self) -> list[str]:
        """The training script's options that repeat what the days of `carry_from` chose (course notes)."""
        return week.carried_options(self.recall(), self.carry_from)

    def beside(self, script: str) -> Path:
        """A script a TP runs but no student edits: beside the student's scripts, one folder up from the
        reference's (tp_scripts/solutions/../)."""
        folder = self.script.parent
        return folder / script if (folder / script).exists() else folder.parent / script

    def submit(self, commands, n_gpu=1, wait: bool = True, tp: str | None = None, **options) -> list[str]:
        """Submit (one job per command x GPU count), show the live queue until they end, return the ids.
        `tp` ("TP1.2", "race") tags the jobs' records: the instructor's class report groups runs by it."""
        ids = gpu_jobs_submitter(commands, n_gpu=n_gpu, name=self.nickname, time_max=self.time_max, wait=wait,
                                 refresh_s=self.refresh_s, tag=tp, **options)
        self.submitted += ids
        return ids

    def submit_arms(self, arms: dict, repeats: int = 1, n_gpu: int = 1, tp: str | None = None, **options) -> dict:
        """Submit each command of `arms` ({label: command}, or {label: (command, n_gpu)}) `repeats` times,
        alternating (A B A B ...: on this machine's queue the jobs run in that order, so a drift of the machine
        over the minutes hits every arm alike; on Slurm, arms of one layout go as one array); show the queue
        until they end; return {label: [job ids]}, the arms that dlokit.analysis.compare_runs and
        dlokit.lessons take."""
        if repeats < 1:
            raise ValueError(f"repeats must be 1 or more, got {repeats}")
        order = [label for _ in range(repeats) for label in arms]
        jobs = [arms[label] if isinstance(arms[label], tuple) else (arms[label], n_gpu) for label in order]
        ids = self.submit(jobs, tp=tp, **options)
        jobs = {label: [] for label in arms}
        for label, job in zip(order, ids):
            jobs[label].append(job)
        return jobs

    # ---- what one day hands to the next (e.g. the batch size Day 1 chose) ----------------------
    @property
    def _notes_path(self) -> Path:
        return self.runs / f"course-notes-{self.nickname}.json"

    def remember(self, **values) -> None:
        notes = self.recall()
        notes.update(values)
        self._notes_path.parent.mkdir(parents=True, exist_ok=True)
        self._notes_path.write_text(json.dumps(notes, indent=1))

    def recall(self, key: str | None = None, default=None):
        try:
            notes = json.loads(self._notes_path.read_text())
        except (OSError, ValueError):
            notes = {}
        notes = notes if isinstance(notes, dict) else {}
        return notes if key is None else notes.get(key, default)

    def carried_lines(self) -> list[str]:
        """describe()'s lines on what the earlier days chose."""
        return week.describe(self.recall(), self.carry_from)

    def describe(self) -> str:
        mode = "the reference SOLUTIONS" if self.solutions else "YOUR script (student mode)"
        lines = [f"profile {self.profile.name!r}: {self.profile.description}",
                 *(["every command starts from what the earlier days chose:",
                    *self.carried_lines()] if self.carry_from else []),
                 f"  backend {self.profile.backend}, {self.profile.node_gpus()} GPU(s) (or CPU processes) per node",
                 f"  training script {self.script} -> {mode}",
                 f"  data {self.data}", f"  job logs in {self.profile.logs}", f"  run records in {self.runs}"]
        if self.profile.backend == "local":
            lines.append("  measurements run alone: a job waits while another holds the devices it needs "
                         "(each GPU, or the whole CPU), and each task keeps to its device's share of the cores")
        elif self.profile.exclusive_measurements:
            lines.append("  measurements run alone: every job asks Slurm for whole nodes (--exclusive), "
                         "so two measurements never share cores")
        return "\n".join(lines)


def synthetic_data(train_per_class: int, image_size: int, classes: int = 10, hard: bool = False,
                   val_per_class: int | None = None) -> str:
    """The kit's generated ImageNet-layout JPEG folder for these sizes (made once, then reused).

    hard: the CIFAR-like set of Day 3 (make_synthetic_imagenet.py --hard), square images of the crop's size.
    val_per_class: validation images per class; None: a fifth of train_per_class (at least 4). The training
    images are the same whatever it is (each image has its own random stream)."""
    source_size = image_size if hard else max(64, image_size * 5 // 4)  # ImageNet-like: a little larger than the crop
    kind = "hard" if hard else "shapes"
    default_val = max(4, train_per_class // 5)
    if val_per_class is not None and (isinstance(val_per_class, bool) or not isinstance(val_per_class, int)
                                      or val_per_class < 1):
        raise ValueError(f"val_per_class {val_per_class!r} (VAL_PER_CLASS): a whole number of at least 1, the "
                         "validation images of each class; None: a fifth of train_per_class")
    val_per_class = default_val if val_per_class is None else val_per_class
    suffix = "" if val_per_class == default_val else f"-val{val_per_class}"
    folder = REPO / "data" / "generated" / f"{kind}-{train_per_class}x{classes}-{source_size}px{suffix}"
    if (folder / "train").is_dir():  # made already: no lock, so students on JupyterHub need no write access
        return str(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):  # two notebooks starting together make it once
        if not (folder / "train").is_dir():
            partial = folder.with_name(folder.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            subprocess.run([sys.executable, str(DATA_MAKER), "--out", str(partial), "--classes", str(classes),
                            "--train-per-class", str(train_per_class),
                            "--val-per-class", str(val_per_class), "--size", str(source_size),
                            *(["--hard"] if hard else [])], check=True)
            partial.rename(folder)  # complete or absent, never half-written
    return str(folder)


def setup_day(nickname: str, profile: str, scripts: str, *, data: str | None = None, train_per_class: int = 32,
              model: str = "resnet18", image_size: int = 64, batch_size: int | None = 16, steps: int = 10,
              time_max: str = "00:10:00", refresh_s: float = 5.0, script: str = "train_classifier.py",
              verbose: bool = True, hard_data: bool = False, val_per_class: int | None = None,
              carry_from=()) -> Day:
    """Choose the profile, find the training script, make or find the data; returns the Day.
    hard_data: generate the hard CIFAR-like set (Day 3) when `data` is None; val_per_class: its validation
    images per class (None: a fifth of train_per_class).
    carry_from: earlier days (e.g. [1, 2]) whose saved choices every command starts from; batch_size None then
    means the batch Day 1 chose (16 when it saved none)."""
    check_name(nickname, label="NICKNAME")  # it becomes the job name: refused here, not at the first submission
    image_size, steps, train_per_class = (size("IMAGE_SIZE", image_size), size("STEPS", steps),
                                          size("TRAIN_PER_CLASS", train_per_class))
    batch_size = None if batch_size is None else size("BATCH_SIZE", batch_size)
    chosen = use_profile(profile)
    path = Path(scripts) / script
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: SCRIPTS should be '../tp_scripts' (your script) or "
                                "'../tp_scripts/solutions' (the reference); regenerate yours with "
                                "`python -m dlokit.material build` at the top of the repository")
    if data is None:
        data = synthetic_data(train_per_class, image_size, hard=hard_data, val_per_class=val_per_class)
    elif data != "synthetic" and not (Path(data) / "train").is_dir():
        raise FileNotFoundError(f"DATA={data!r} has no train/ folder: give an ImageNet-layout folder "
                                "(train/<class>/*.JPEG, val/...) or None to generate a small synthetic one")
    data = data if data == "synthetic" else str(Path(data).resolve())
    day = Day(nickname, chosen, path, data, model=model, image_size=image_size, batch_size=batch_size or 16,
              steps=steps, time_max=time_max, refresh_s=refresh_s, carry_from=tuple(carry_from))
    if batch_size is None and 1 in day.carry_from and day.recall("batch_size"):
        day.batch_size = int(day.recall("batch_size"))
    if verbose:
        print(day.describe())
    return day


LLM_MODE_OPTIONS = {"fsdp-keep": ["--mode", "fsdp", "--no-reshard-after-forward"]}  # modes that are not --mode M


@dataclass
class LlmDay(Day):
    """Day 4: the scripts of tp_scripts/llm (the student's, or llm/solutions), and the sizes of every job."""
    config: str = "tiny"
    seq_len: int = 64

    def command(self, mode: str | None, *options, script: str = "train_llm.py", steps: int | None = None,
                config: str | None = None) -> str:
        """One job's command line: train_llm.py in a parallel `mode` (None: none) at the day's sizes, or another
        script of tp_scripts/llm (a checker, compress_bench.py) with `options` only."""
        folder = self.script.parent
        mode_options = LLM_MODE_OPTIONS.get(mode, ["--mode", mode]) if mode else []
        argv = [str(self.beside(script)), *mode_options]
        if script == "train_llm.py":
            steps = self.steps if steps is None else size("day.command(steps=...)", steps)
            sizes = ["--config", config or self.config, "--seq-len", self.seq_len, "--batch-size", self.batch_size,
                     "--steps", steps]
            argv += week.without_overridden([*map(str, sizes), *self.carried], options)
        elif script.startswith("check_") and folder.name == "solutions":
            argv.append("--solution")  # the checkers live beside the student's copies: ask them for the reference
        return shlex.join(map(str, [*argv, *options]))

    @property
    def carried(self) -> list[str]:
        return week.llm_carried_options(self.recall(), self.carry_from)

    @property
    def dtype(self) -> str:
        """The compute dtype the day's runs carry (--dtype), else train_llm.py's default: what the memory model needs."""
        groups = dict(week.option_groups(self.carried))
        return (groups.get("--dtype") or ["fp32"])[0]

    def parallel_ranks(self, wanted: int) -> int:
        """The ranks of every parallel job: `wanted`, or fewer where one node of the profile has fewer devices.
        Every layout of the day needs two: with one device, say so (and what to do) before a job is submitted."""
        ranks = min(wanted, self.profile.node_gpus())
        if ranks < 2:
            raise RuntimeError(
                f"Day 4's parallel layouts need 2 devices per job, and one node of profile {self.profile.name!r} "
                f"offers {self.profile.node_gpus()}. Choose a profile whose nodes have 2 GPUs or more, or, on a "
                "machine with one GPU, start Jupyter with CUDA_VISIBLE_DEVICES= (empty): the jobs then run as CPU "
                "processes with gloo, as on a laptop without a GPU")
        return ranks

    def carried_lines(self) -> list[str]:
        return [*week.describe(self.recall(), self.carry_from), *week.llm_describe(self.recall(), self.carry_from)]


def setup_llm_day(nickname: str, profile: str, scripts: str, *, config: str = "tiny", seq_len: int = 64,
                  batch_size: int = 8, steps: int = 6, time_max: str = "00:15:00", refresh_s: float = 5.0,
                  verbose: bool = True, carry_from=()) -> LlmDay:
    """Day 4's set-up: SCRIPTS '../tp_scripts/solutions' means the reference (tp_scripts/llm/solutions), else
    the student's tp_scripts/llm; the data is generated by the script itself.
    carry_from=[1]: every train_llm.py command computes in the precision Day 1 kept (week.llm_carried_options)."""
    seq_len, batch_size, steps = size("SEQ_LEN", seq_len), size("BATCH", batch_size), size("STEPS", steps)
    folder = Path(scripts).parent / "llm" / "solutions" if Path(scripts).name == "solutions" else Path(scripts) / "llm"
    base = setup_day(nickname, profile, str(folder), data="synthetic", script="train_llm.py", time_max=time_max,
                     refresh_s=refresh_s, verbose=False)
    day = LlmDay(base.nickname, base.profile, base.script, base.data, batch_size=batch_size, steps=steps,
                 time_max=time_max, refresh_s=refresh_s, carry_from=tuple(carry_from), config=config, seq_len=seq_len)
    if verbose:
        print(day.describe())
    return day
