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
import math
import numbers
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from . import devices, week
from ..script_modules import script_digests
from .jobs import find_card
from .jobspec import check_name
from .profiles import Profile, use_profile
from .submit import gpu_jobs_submitter

REPO = Path(__file__).resolve().parents[3]
DATA_MAKER = REPO / "data" / "make_synthetic_imagenet.py"
FORMAT_CONVERTER = REPO / "data" / "convert_formats.py"


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
    ran: dict = field(default_factory=dict)  # (command, n_gpu) -> the job id that ran it: what submit(reuse=True) reuses

    @property
    def runs(self) -> Path:
        return self.profile.runs

    @property
    def solutions(self) -> bool:
        """Is this day running the reference solutions (the course runner's default)?"""
        return self.script.resolve().parent.name == "solutions"

    def command(self, *options, batch_size: int | None = None, steps: int | None = None,
                epochs: int | None = None, script: str | None = None) -> str:
        """The command line of one job of the training script: the day's sizes and what the earlier days chose
        (`carried`), then the TP's options, which replace any of them they name (each option once on the line); a timed `--test` run of `steps` steps, or, with
        `epochs`, a real training with validation after each epoch.
        `script`: another script a TP runs (read_bench.py), with `options` only."""
        if script is not None:
            return shlex.join([str(self.beside(script)), *map(str, options)])
        batch_size = self.batch_size if batch_size is None else size("day.command(batch_size=...)", batch_size)
        steps = self.steps if steps is None else size("day.command(steps=...)", steps)
        length = ["--epochs", str(size("day.command(epochs=...)", epochs))] if epochs is not None else \
            ["--test", "--test-nsteps", str(steps)]
        base = ["--data", self.data, "--model", self.model, "--image-size", str(self.image_size),
                "--batch-size", str(batch_size), *length, "--print-every", "1", *self.carried]
        return shlex.join([str(self.script), *week.without_overridden(base, options), *map(str, options)])

    @property
    def carried(self) -> list[str]:
        """The training script's options that repeat what the days of `carry_from` chose (course notes)."""
        return week.carried_options(self.recall(), self.carry_from)

    def beside(self, script: str) -> Path:
        """A script a TP runs but no student edits: beside the student's scripts, one folder up from the
        reference's (tp_scripts/solutions/../)."""
        folder = self.script.parent
        return folder / script if (folder / script).exists() else folder.parent / script

    def submit(self, commands, n_gpu=1, wait: bool = True, tp: str | None = None, reuse: bool = False,
               expected=None, **options) -> list[str]:
        """Submit (one job per command x GPU count), show the live queue until they end, return the ids.
        `tp` ("TP1.2", "race") tags the jobs' records: the instructor's class report groups runs by it.
        `reuse`: a command this day ran already on as many GPUs, on the same script files (the script and the
        student's modules it imports, by content), is not run again; its job id comes back in its place (Day 1's
        scans reuse the first job, or TP1.1's scan when the precision kept is fp32). A file edited since (a TODO
        fixed) is said, and the command runs again.
        `expected`: how a job that fails by design is meant to end, {state: why}, for every command or a list with
        one per command (None: meant to complete); its card, the queue and the runs table say "failed as expected"."""
        jobs = pairs(commands, n_gpu)
        meant = dict(zip(jobs, expected_per_job(commands, n_gpu, expected)))
        if reuse:
            changed = {job: changed_scripts(self.ran[job], shlex.split(job[0])[0])
                       for job in dict.fromkeys(jobs) if job in self.ran}
            new = [job for job in dict.fromkeys(jobs) if job not in changed or changed[job]]
            self.say_reused(changed)
        else:
            new = jobs
        ids = gpu_jobs_submitter(new, name=self.nickname, time_max=self.time_max, wait=wait, refresh_s=self.refresh_s,
                                 tag=tp, expected=[meant[job] for job in new], **options) if new else []
        self.submitted += ids
        self.ran.update(zip(new, ids))
        return [self.ran[job] for job in jobs] if reuse else ids

    def say_reused(self, changed: dict) -> None:
        """What submit(reuse=True) did with the jobs this day ran already ({job: the files changed since}): those
        run again because a file changed ("your train_classifier.py changed since job 1234: submitted again"), the
        others reused."""
        by_files = {}
        for job, files in changed.items():
            by_files.setdefault(tuple(files), []).append(f"job {self.ran[job]}")
        for files, ran in by_files.items():
            print(f"your {', '.join(files)} changed since {', '.join(ran)}: submitted again" if files else
                  f"run already on these files, not submitted again: {', '.join(ran)}")

    def submit_until_decided(self, commands, decided, *, rounds: int, max_rounds: int, n_gpu=1, tp: str | None = None,
                             **options) -> list[str]:
        """`rounds` rounds of `commands` on each of `n_gpu` (alternated, as submit orders them), then one round more at
        a time while `decided(the job ids so far)` says the comparison is within noise, up to `max_rounds`: an interval
        over two runs each rests on one slow run (TP2.2's weak scaling read ×1.27 [0.89–1.81] once where it read ×1.8
        twice, 2026-11-28). Each extra round is said."""
        ids = self.submit(list(commands) * rounds, n_gpu=n_gpu, tp=tp, **options)
        for round_ in range(rounds + 1, max_rounds + 1):
            if decided(ids):
                break
            print(f"the interval does not decide on {round_ - 1} runs each: round {round_} of at most {max_rounds}")
            ids += self.submit(list(commands), n_gpu=n_gpu, tp=tp, **options)
        return ids

    def submit_arms(self, arms: dict, repeats: int = 1, n_gpu: int = 1, tp: str | None = None, reuse: bool = False,
                    **options) -> dict:
        """Submit each command of `arms` ({label: command}, or {label: (command, n_gpu)}) `repeats` times,
        alternating (A B A B ...: on this machine's queue the jobs run in that order, so a drift of the machine
        over the minutes hits every arm alike; on Slurm, arms of one layout go as one array); show the queue
        until they end; return {label: [job ids]}, the arms that dlokit.analysis.compare_runs and
        dlokit.lessons take. `reuse` (submit's) holds for one run per arm only: repeats alternate fresh runs."""
        if repeats < 1:
            raise ValueError(f"repeats must be 1 or more, got {repeats}")
        order = [label for _ in range(repeats) for label in arms]
        jobs = [arms[label] if isinstance(arms[label], tuple) else (arms[label], n_gpu) for label in order]
        ids = self.submit(jobs, tp=tp, reuse=reuse and repeats == 1, **options)
        jobs = {label: [] for label in arms}
        for label, job in zip(order, ids):
            jobs[label].append(job)
        return jobs

    @property
    def scan_ends(self) -> dict:
        """submit's `expected` for a batch scan: each run fits, or runs out of memory past what fits."""
        return {"COMPLETED": "", "OUT_OF_MEMORY": "past the largest batch that fits: where the scan stops"}

    # ---- the commands of the TPs ----------------------------------------------------------------
    def scan(self, batches, *options, steps: int | None = None) -> list[str]:
        """A batch scan's commands: `options` at each batch size of `batches`, in their order."""
        return [self.command(*options, batch_size=batch, steps=steps) for batch in batches]

    def device_sizes(self, on_gpu: bool, gpu_image_size: int | None, sweep: list, gpu_sweep: list) -> list:
        """Day 1, once the first job showed its device: on a GPU the day's crop becomes `gpu_image_size` (a step
        at a small crop is mostly kernel launches, and TP1.2-1.3 need busy tensor cores) and the scans take
        `gpu_sweep`; on a CPU they take `sweep`. Says which; returns the scans' batch sizes."""
        print("the job had a GPU" if on_gpu else "the job ran on CPU only: GPU-only effects are explained, not measured")
        if on_gpu and gpu_image_size and gpu_image_size != self.image_size:
            print(f"from the batch scan on, {gpu_image_size} px crops instead of {self.image_size} px: on a GPU a step "
                  "this small is mostly kernel launches (TP1.4 shows it), and the effects of TP1.2 and TP1.3 need "
                  "busy tensor cores")
            self.image_size = gpu_image_size
        return gpu_sweep if on_gpu else sweep

    def precision_arms(self, on_gpu: bool, modes=None, batch_size: int | None = None) -> dict:
        """TP1.2's commands, {precision: command}: fp32, TF32 on a GPU, then `modes` (None: fp16 and bf16 on a
        GPU, bf16 on a CPU)."""
        modes = modes or (["fp16", "bf16"] if on_gpu else ["bf16"])
        precisions = ["fp32", *(["tf32"] if on_gpu else []), *modes]
        return {name: self.command(*precision_options(name), batch_size=batch_size) for name in precisions}

    def gpu_counts(self) -> list[int]:
        """1, 2, 4 ... up to one node of the profile: the process counts of TP2.2's weak scaling."""
        return [2**k for k in range(int(math.log2(self.profile.node_gpus())) + 1)]

    def training(self, optimizer: str, lr, global_batch: int, base_batch: int, epochs: int, *options) -> str:
        """A training of TP3.1-3.2: `optimizer` at `lr` (tuned at `base_batch`) with a cosine schedule, `epochs`
        epochs at `global_batch`."""
        return self.command("--optimizer", optimizer, "--lr", lr, "--lr-schedule", "cosine", "--base-batch-size",
                            base_batch, *options, batch_size=global_batch, epochs=epochs)

    def large_batch_trainings(self, optimizers, base_lr: dict, small_batch: int, large_batch: int,
                              warmup_epochs: int, epochs: int) -> list[str]:
        """TP3.1's trainings: SGD at the small batch (with --tensorboard), each optimiser at the large batch with
        its LR scaling rule and a warm-up, then SGD at the large batch untuned (the small batch's lr, no warm-up)."""
        small = self.training("sgd", base_lr["sgd"], small_batch, small_batch, epochs, "--tensorboard")
        large = [self.training(name, base_lr[name], large_batch, small_batch, epochs, "--lr-scaling",
                               lr_scaling(name), "--warmup-epochs", warmup_epochs) for name in optimizers]
        return [small, *large, self.training("sgd", base_lr["sgd"], large_batch, small_batch, epochs)]

    def found_lr_trainings(self, found_lrs: dict, large_batch: int, base_batch: int, warmup_epochs: int,
                           epochs: int) -> list[str]:
        """TP3.2's trainings: each optimiser at the large batch, at the lr its range test suggested ({name: lr}),
        with a warm-up."""
        return [self.training(name, f"{lr:.4g}", large_batch, base_batch, epochs, "--warmup-epochs", warmup_epochs)
                for name, lr in found_lrs.items()]

    def submit_sync_bn(self, on_gpu: bool, n_gpu: int, *options, epochs: int, tp: str | None = None) -> list[str]:
        """TP2.3's short trainings with BatchNorm, then SyncBatchNorm, on `n_gpu` GPUs; none, and why, where
        SyncBatchNorm has nothing to do (one GPU) or cannot run (CPU processes: PyTorch refuses it)."""
        if on_gpu and n_gpu > 1:
            return self.submit([self.command(*options, epochs=epochs), self.command(*options, "--sync-bn", epochs=epochs)],
                               n_gpu=n_gpu, tp=tp)
        print("one GPU here: SyncBatchNorm has no other rank to synchronise with, so no job is submitted; " if on_gpu
              else "no GPU here: SyncBatchNorm cannot run on CPU processes (PyTorch refuses it), so no job is "
              "submitted; ", "on a node of several GPUs this cell compares BatchNorm and SyncBatchNorm, speed and "
              "accuracy", sep="")
        return []

    def whole_machine(self) -> dict:
        """submit's options for a job that runs by itself and may use every core: on this machine's CPU all the
        notebook's cores (a local job keeps to its device's share otherwise); elsewhere none."""
        on_this_cpu = self.profile.backend == "local" and not devices.machine_devices()[0].startswith("gpu")
        return {"cpus_per_task": len(os.sched_getaffinity(0))} if on_this_cpu else {}

    def compile_bench(self, parts: str, variants: str, batch_size: int, steps: int) -> str:
        """TP3.3's compile_bench.py at the day's model and crop; --fresh-cache: each compiled variant starts from an
        empty kernel cache, so their compile times compare (a variant compiled after another would reuse its
        kernels, and a second run of the cell would reuse the first's)."""
        return self.command("--parts", parts, "--variants", variants, "--model", self.model, "--image-size",
                            self.image_size, "--batch-size", batch_size, "--steps", steps, "--fresh-cache",
                            script="compile_bench.py")

    def submit_compile_ddp(self, parts: str, mode: str, batch_size: int, steps: int, tp: str | None = None) -> list:
        """TP3.3's compile + DDP (torch.compile wraps the DDP-wrapped model) on 2 ranks, where a node has two devices
        and `parts` names the model; else none, and why."""
        if self.profile.node_gpus() > 1 and "model" in parts:
            return self.submit(self.compile_bench("model", f"eager,compile-{mode}", batch_size, steps), n_gpu=2, tp=tp)
        print("compile + DDP not run: " + ("one device only, it needs two" if self.profile.node_gpus() < 2 else
                                           f"COMPILE_PARTS = {parts!r} leaves the model out"))
        return []

    def storage_formats(self) -> Path:
        """TP3.4's formats of the day's data (webdataset, raw), converted once beside the run records, verified."""
        folder = Path(self.runs) / f"formats-{Path(self.data).name}"
        convert = [] if (folder / "manifest.json").exists() else ["--src", self.data, "--out", str(folder),
                                                                   "--image-size", str(self.image_size)]
        subprocess.run([sys.executable, str(FORMAT_CONVERTER), *convert, "--verify", str(folder)], check=True)
        return folder

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

    @property
    def device(self) -> str:
        """What one rank runs on: "GPU", or "CPU process" on a local machine without one (its devices are cores)."""
        on_cores = self.profile.backend == "local" and self.profile.gpus_per_node == "auto" and \
            devices.machine_devices()[0].startswith("cpu")
        return "CPU process" if on_cores else "GPU"

    def _node_devices(self) -> str:
        count = self.profile.node_gpus()
        if self.device == "GPU":
            return f"{count} GPU{'s' if count > 1 else ''}"
        return f"{count} CPU process{'es' if count > 1 else ''} (no GPU here: each stands for one)"

    def describe(self) -> str:
        mode = "the reference SOLUTIONS" if self.solutions else "YOUR script (student mode)"
        lines = [f"profile {self.profile.name!r}: {self.profile.description}",
                 *(["every command starts from what the earlier days chose:",
                    *self.carried_lines()] if self.carry_from else []),
                 f"  backend {self.profile.backend}, {self._node_devices()} per node",
                 f"  training script {self.script} -> {mode}",
                 f"  data {self.data}", f"  job logs in {self.profile.logs}", f"  run records in {self.runs}"]
        if self.profile.backend == "local":
            lines.append("  measurements run alone: a job waits while another holds the devices it needs "
                         "(each GPU, or the whole CPU), and each task keeps to its device's share of the cores")
        elif self.profile.exclusive_measurements:
            lines.append("  measurements run alone: every job asks Slurm for whole nodes (--exclusive), "
                         "so two measurements never share cores")
        return "\n".join(lines)


PRECISION_OPTIONS = {"fp32": [], "tf32": ["--amp", "none", "--tf32"]}  # fp32: the script's default


def precision_options(precision: str) -> list[str]:
    """The training script's options of a precision of TP1.2: "fp32", "tf32", "fp16" or "bf16"."""
    return PRECISION_OPTIONS.get(precision, ["--amp", precision])


def compile_variants(modes) -> str:
    """TP3.3's variants: each part runs those that apply to it (numpy* the function, fused the optimizer step,
    compile-frozen inference, TorchScript all but the optimizer step)."""
    return ",".join(["eager", "trace", "script", *(f"compile-{mode}" for mode in modes), "compile-frozen", "fused",
                     "numpy", "numpy-compile"])


def precision_notes(precision: str) -> dict:
    """What Day 1 saves of a precision in the course notes (dlokit.submission.week: amp and tf32)."""
    return {"amp": precision if precision in ("fp16", "bf16") else "none", "tf32": precision == "tf32"}


def lr_scaling(optimizer: str) -> str:
    """TP3.1's LR scaling rule: linear for the SGD family, square root for the adaptive optimisers."""
    return "linear" if optimizer in ("sgd", "lars") else "sqrt"


def pairs(commands, n_gpu=1) -> list[tuple[str, int]]:
    """gpu_jobs_submitter's jobs as (command, GPU count) pairs: each command on each count of `n_gpu` (an int or a
    list), a (command, n_gpu) pair on its own."""
    commands = [commands] if isinstance(commands, str) else list(commands)
    counts = n_gpu if isinstance(n_gpu, (list, tuple)) else [n_gpu]
    return [job for item in commands for job in ([tuple(item)] if isinstance(item, tuple) else
                                                 [(item, count) for count in counts])]


def changed_scripts(job_id: str, script: str) -> list[str]:
    """The files of `script` (script_modules.script_files) whose content differs from what job `job_id` ran, by
    name; a file added or gone counts, and all of them when the job's card is gone or kept no digests."""
    try:
        ran = find_card(job_id).extra.get("script_sha256") or {}
    except LookupError:
        ran = {}
    now = script_digests(script)
    return sorted(name for name in {*ran, *now} if ran.get(name) != now.get(name))


def expected_per_job(commands, n_gpu, expected) -> list:
    """Day.submit's `expected` spread over pairs(commands, n_gpu): one for all, or one per command."""
    commands = [commands] if isinstance(commands, str) else list(commands)
    if not isinstance(expected, (list, tuple)):
        return [expected] * len(pairs(commands, n_gpu))
    if len(expected) != len(commands):
        raise ValueError(f"expected: {len(expected)} entries for {len(commands)} commands")
    return [meant for command, meant in zip(commands, expected) for _ in pairs([command], n_gpu)]


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
    from dlokit.analysis.table import use_in_notebook

    use_in_notebook()  # every table the notebook shows: one count of decimals per column, what its numbers are
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
    ranks: int | None = None  # the processes of every parallel job (parallel_ranks of what the notebook asked)

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

    def describe(self) -> str:
        return super().describe() + (f"\n  {self.ranks} ranks per parallel job" if self.ranks else "")

    def model_config(self, name: str) -> dict:
        """A model configuration of the day's scripts (llm_kit/model.py), as the memory model and the planner take it."""
        from dlokit.analysis.llm_memory import model_config

        return model_config(self.script.parent, name)

    # ---- the commands of the TPs ----------------------------------------------------------------
    def mode_runs(self, modes, *options) -> list[str]:
        """train_llm.py in each parallel mode of `modes`, with `options`, at the day's sizes (TP4.1, TP4.6)."""
        return [self.command(mode, *options) for mode in modes]

    def layout_runs(self, argvs, steps: int | None = None, repeats: int = 1) -> list[str]:
        """The planner's layouts (layout_planner.candidates' `argv`: each one's script and options) at the day's
        sizes, `steps` steps each (TP4.9); `repeats` rounds of them, alternated (A B C, A B C): job i runs layout
        i % len(argvs)."""
        return [self.command(None, *argv, steps=steps) for _ in range(repeats) for argv in argvs]

    def memory_scan(self, batches, *, seq_len: int, limit_mb: float, config: str, levers=None) -> list[str]:
        """TP4.2's batch scan under `limit_mb` per rank, two steps a run: DDP at each batch of `batches`, then FSDP2
        (meta-initialised) at each; with `levers` ([[options], ...]), FSDP2 plus each lever at each batch instead."""
        arms = [["fsdp", "--meta-init", *lever] for lever in levers] if levers else [["ddp"], ["fsdp", "--meta-init"]]
        return [self.command(mode, *extra, "--batch-size", batch, "--seq-len", seq_len, "--memory-limit", limit_mb,
                             config=config, steps=2) for mode, *extra in arms for batch in batches]

    def pipeline_runs(self, microbatches, *, seq_len: int, steps: int) -> list[str]:
        """TP4.3's pipeline jobs: GPipe at each count of `microbatches`, then 1F1B at the last, on one global batch
        that gives every micro-batch two sequences at least."""
        batch = max(self.batch_size, 2 * max(microbatches))
        runs = [("gpipe", m) for m in microbatches] + [("1f1b", microbatches[-1])]
        return [self.command("pp", "--pp-schedule", schedule, "--microbatches", m, "--seq-len", seq_len,
                             "--batch-size", batch, steps=steps) for schedule, m in runs]

    def deepspeed_runs(self, stages, offload_stage: int) -> list[str]:
        """TP4.8's train_deepspeed.py at the day's sizes (those of TP4.1's runs): ZeRO at each of `stages`, then
        `offload_stage` again with the optimizer's states offloaded to the CPU."""
        sizes = ["--data", "text", "--config", self.config, "--seq-len", self.seq_len, "--batch-size", self.batch_size,
                 "--steps", self.steps, *self.carried]
        runs = [["--zero-stage", stage] for stage in stages] + [["--zero-stage", offload_stage, "--offload-optimizer"]]
        return [self.command(None, *run, *sizes, script="train_deepspeed.py") for run in runs]


def setup_llm_day(nickname: str, profile: str, scripts: str, *, config: str = "tiny", seq_len: int = 64,
                  batch_size: int = 8, steps: int = 6, time_max: str = "00:15:00", refresh_s: float = 5.0,
                  verbose: bool = True, carry_from=(), ranks: int | None = None) -> LlmDay:
    """Day 4's set-up: SCRIPTS '../tp_scripts/solutions' means the reference (tp_scripts/llm/solutions), else
    the student's tp_scripts/llm; the data is generated by the script itself.
    carry_from=[1]: every train_llm.py command computes in the precision Day 1 kept (week.llm_carried_options).
    ranks: the processes of every parallel job, `day.ranks`: fewer where a node has fewer devices (a node of one
    says what to do, before any job)."""
    seq_len, batch_size, steps = size("SEQ_LEN", seq_len), size("BATCH", batch_size), size("STEPS", steps)
    folder = Path(scripts).parent / "llm" / "solutions" if Path(scripts).name == "solutions" else Path(scripts) / "llm"
    base = setup_day(nickname, profile, str(folder), data="synthetic", script="train_llm.py", time_max=time_max,
                     refresh_s=refresh_s, verbose=False)
    day = LlmDay(base.nickname, base.profile, base.script, base.data, batch_size=batch_size, steps=steps,
                 time_max=time_max, refresh_s=refresh_s, carry_from=tuple(carry_from), config=config, seq_len=seq_len)
    day.ranks = day.parallel_ranks(size("RANKS", ranks)) if ranks is not None else None
    if verbose:
        print(day.describe())
    return day
