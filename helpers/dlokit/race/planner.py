"""How many epochs fit the race budget: from what a short test job measured, never from a guess.

    test = measure("1234")                  # the test job's run record (same options as the race run)
    plan = make_plan(test, profile=profile) # budget and GPU count from the profile
    print(plan.formula())                   # the formula with the measured numbers in it

    epochs = floor((budget − startup) / (steps per epoch × step time + validation + loader start + checkpoint))

* step time: the test's measured pace per step, its wait for data included (summary `t_period` on a GPU,
  `t_data + t_step` on the CPU); with the memory levers of the race's options (`--grad-accum K`: the batch per GPU in
  K micro-batches, as train_llm.py and fit_levers.py split it; `--activation-checkpointing`), a step costs K x the
  time of a micro-batch, and checkpointing one forward more: measured where the test ran the race's levers, else
  costed from the test's timings (`step_cost`: a micro-batch's time in proportion to its images, a lower bound; the
  test's forward, or the stated STATED_RECOMPUTE); the plan says which. What the test's levers did is read from its
  record (`levers_ran`: each step's forward passes and block forwards, train_classifier.py running the student's
  TP1.5 code): a lever asked for that did not run is named in the plan (TODO TP1.5), never costed as if it had;
* startup: what the test spent outside its steps (process start to end − steps × step time): imports, the
  data set scan, the model, the first batches' allocations and warm-up;
* validation: the whole val/ split every epoch, shared by the GPUs, at the test's forward time per batch
  (+ its data wait): forward-only, without the backward;
* loader start: the DataLoader workers start again every epoch unless --persistent-workers;
* checkpoint: the race run saves one every epoch (--checkpoint-epochs); the test saves one at its last step
  (submit_test passes --checkpoint-steps) and its `checkpoint_saved` event says how long that took.

Budget: `race_budget_minutes` of wall clock (the local profiles) or `race_budget_gpu_hours` shared by
`race_gpus` GPUs (the clusters). A test on W GPUs planned for G: the per-step time is taken as the same
(weak scaling: each GPU keeps its batch); the plan says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.run import load_run
from ..in_job.energy import run_usage
from ..submission.jobspec import format_seconds
from ..submission.profiles import Profile, current_profile
from ..in_job.runrecord import is_number

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".webp", ".bmp")
TIME_MARGIN = 0.10     # the job's time limit: the plan plus 10 %...
TIME_EXTRA_S = 240     # ...plus 4 minutes: Slurm's checkpoint signal comes 2 minutes before the limit, or up to
                       # one minute earlier still, and should not come before the planned end
# activation checkpointing runs each checkpointed forward again in backward: a step of forward (1) and backward (about
# 2) becomes 4/3 of itself, an upper bound (the stem and the head are not checkpointed); used when the test has no
# forward timing of its own
STATED_RECOMPUTE = 4 / 3


class RacePlanError(ValueError):
    """The test run cannot give a plan (unfinished, no timings) or the budget is missing; says what to do."""


@dataclass
class TestRun:
    """What the short test job measured (its run record)."""

    run_id: str
    world_size: int
    batch_size: int              # per process
    step_s: float                # pace per step, data wait included
    t_data: float
    t_forward: float | None
    first_load_s: float
    startup_s: float
    steps: int
    steps_per_epoch: int
    train_images: int | None     # None: --data synthetic
    val_images: int
    persistent_workers: bool
    num_workers: int
    drop_last: bool
    checkpoint_s: float | None   # one checkpoint save, None: the test saved none
    power_w: float | None        # energy per device-second of the test (NVML or RAPL), None: n/a
    energy_source: str | None
    config: dict = field(default_factory=dict)
    argv: list = field(default_factory=list)
    grad_accum: int = 1                   # micro-batches the test's steps ran (--grad-accum, as its record shows)
    activation_checkpointing: bool = False  # the test's blocks recomputed in backward (as its record shows)
    levers_not_run: list = field(default_factory=list)  # a lever asked for that the record shows did not run

    @property
    def micro_s(self) -> float:
        """One micro-batch (batch_size / grad_accum images): its share of the test's measured step."""
        return self.step_s / self.grad_accum


def count_images(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def measure(run_id: str, runs_dir=None, val_images: int | None = None) -> TestRun:
    """Read a finished test job's record. `val_images`: the size of the validation split when its folder
    (the run's --data/val) is not readable from here."""
    run = load_run(str(run_id), runs_dir)
    if run.state != "completed":
        raise RacePlanError(f"test run {run_id}: {run.describe_state()}; plan from a completed test job")
    summary, config = run.summary, run.config
    steps = summary.get("steps")
    step_s = summary.get("t_period") if is_number(summary.get("t_period")) else None
    if step_s is None and is_number(summary.get("t_data")) and is_number(summary.get("t_step")):
        step_s = summary["t_data"] + summary["t_step"]
    if not is_number(step_s) or not is_number(steps) or not steps:
        raise RacePlanError(f"test run {run_id} has no step timings (too few steps past the warm-up?): run a test "
                            "job of at least 10 steps")
    usage = run_usage(run)
    data = config.get("data")
    if val_images is None and data != "synthetic":
        val_dir = Path(str(data)) / "val"
        if not val_dir.is_dir():
            raise RacePlanError(f"test run {run_id}: its validation split {val_dir} is not readable from here; "
                                "pass val_images=<number of validation images>")
        val_images = count_images(val_dir)
    saves = run.lines("event")
    saves = saves[saves["event"] == "checkpoint_saved"] if "event" in saves else saves.iloc[0:0]
    checkpoint_s = float(saves["seconds"].max()) if "seconds" in saves and saves["seconds"].notna().any() else None
    startup = max(0.0, (usage.elapsed_s or 0.0) - steps * step_s - (checkpoint_s or 0.0))
    power = usage.energy_j / usage.gpu_seconds if usage.energy_j is not None and usage.gpu_seconds else None
    k, recomputed, not_run = levers_ran(run.lines("step"), config)
    return TestRun(run_id=run.run_id, world_size=run.world_size, batch_size=int(config.get("batch_size") or 1),
                   step_s=float(step_s), t_data=float(summary.get("t_data") or 0.0),
                   t_forward=summary.get("t_forward") if is_number(summary.get("t_forward")) else None,
                   first_load_s=float(summary.get("first_step_load_s") or 0.0), startup_s=startup, steps=int(steps),
                   steps_per_epoch=int(config.get("steps_per_epoch") or config.get("synthetic_steps") or 1),
                   train_images=config.get("train_images"), val_images=int(val_images or 0),
                   persistent_workers=bool(config.get("persistent_workers")),
                   num_workers=int(config.get("num_workers") or 0), drop_last=bool(config.get("drop_last")),
                   checkpoint_s=checkpoint_s,
                   power_w=power, energy_source=usage.energy_source if power is not None else None,
                   config=config, argv=list(run.info.get("argv") or []),
                   grad_accum=k, activation_checkpointing=recomputed, levers_not_run=not_run)


def levers_ran(steps, config: dict) -> tuple[int, bool, list[str]]:
    """(micro-batches a step ran, whether the blocks ran again in backward, a sentence for each lever asked for that did
    not run), from the test's step lines: train_classifier.py records each step's forward passes and block forwards
    under --grad-accum and --activation-checkpointing (the student's own TP1.5 code runs them)."""
    k, checkpointing = int(config.get("grad_accum") or 1), bool(config.get("activation_checkpointing"))
    if k == 1 and not checkpointing:
        return 1, False, []
    seen = steps.dropna(subset=["forward_images"]) if "forward_images" in steps else steps.iloc[0:0]
    if seen.empty:
        return k, checkpointing, ["the test's record shows no forward passes: whether its memory levers ran is not "
                                  "known, so the plan takes them as asked"]
    passes = seen["forward_images"].map(len)
    not_run = []
    if k > 1 and (passes == 1).all():
        not_run.append(f"your accumulation ran the whole batch in one pass: TODO TP1.5 (accumulate_step in "
                       f"fit_levers.py); --grad-accum {k} held the whole batch's activations, and the test's steps "
                       "are whole-batch steps")
    recomputed = checkpointing and bool((seen["block_forwards"] >= 2 * seen["blocks"] * passes).all())
    if checkpointing and not recomputed:
        not_run.append("your activation checkpointing recomputed nothing, each block ran once a pass: TODO TP1.5 "
                       "(Checkpointed.forward in fit_levers.py); --activation-checkpointing kept every activation")
    return int(passes.max()), recomputed, not_run


@dataclass
class RacePlan:
    test: TestRun
    gpus: int
    budget_s: float              # wall clock the run may use
    budget_gpu_hours: float
    budget_words: str
    steps_per_epoch: int
    val_batches: int
    val_s: float
    loader_s: float
    checkpoint_s: float
    epochs: int
    notes: list[str] = field(default_factory=list)
    step_s: float = 0.0          # the race's optimizer step (step_cost); 0: the test's
    step_words: str = ""         # how step_s follows from the test's timings

    @property
    def train_epoch_s(self) -> float:
        return self.steps_per_epoch * (self.step_s or self.test.step_s)

    @property
    def epoch_s(self) -> float:
        return self.train_epoch_s + self.val_s + self.loader_s + self.checkpoint_s

    @property
    def planned_s(self) -> float:
        return self.test.startup_s + self.epochs * self.epoch_s

    @property
    def gpu_hours(self) -> float:
        return self.planned_s * self.gpus / 3600

    @property
    def energy_wh(self) -> float | None:
        return None if self.test.power_w is None else self.test.power_w * self.planned_s * self.gpus / 3600

    @property
    def energy_text(self) -> str:
        return "n/a" if self.energy_wh is None else f"{self.energy_wh:.3g} Wh ({self.test.energy_source})"

    @property
    def time_limit(self) -> str:
        """The job's time limit: the plan, 10 % and four minutes more, in whole minutes."""
        seconds = self.planned_s * (1 + TIME_MARGIN) + TIME_EXTRA_S
        return format_seconds(60 * math.ceil(seconds / 60))

    @property
    def fits(self) -> bool:
        return self.epochs >= 1

    def formula(self) -> str:
        """The formula, then the same with the measured numbers, and where each number comes from."""
        t = self.test
        usable = self.budget_s - t.startup_s
        lines = [
            "epochs = floor((budget − startup) / (steps per epoch × step time + validation + loader start + "
            "checkpoint))",
            f"       = floor(({self.budget_s:.1f} s − {t.startup_s:.1f} s) / ({self.steps_per_epoch} × "
            f"{self.step_s or t.step_s:.4f} s + {self.val_s:.2f} s + {self.loader_s:.2f} s + {self.checkpoint_s:.2f} s))",
            f"       = floor({usable:.1f} s / {self.epoch_s:.2f} s) = {self.epochs}",
            f"budget: {self.budget_words}",
            f"measured by test run {t.run_id}: {t.steps} steps on {t.world_size} GPU(s), batch {t.batch_size} per GPU: "
            f"step {t.step_s:.4f} s (of which waiting for data {t.t_data:.4f} s), startup {t.startup_s:.1f} s",
            *([self.step_words] if self.step_words else []),
            f"steps per epoch on {self.gpus} GPU(s): " + (
                f"{t.train_images} training images / {self.gpus} GPU(s) / batch {t.batch_size} = {self.steps_per_epoch}"
                if t.train_images else f"{self.steps_per_epoch} (synthetic data)"),
            f"validation: {t.val_images} images / {self.gpus} GPU(s) / batch {t.batch_size} = {self.val_batches} "
            f"batches × {(self.val_s / self.val_batches) if self.val_batches else 0:.4f} s (data wait + forward, "
            "forward-only estimate)",
            f"loader start: {self.loader_s:.2f} s per epoch" + (
                " (workers start again each epoch)" if self.loader_s else ""),
            f"checkpoint: {self.checkpoint_s:.2f} s per epoch" + (
                f" (the test's save, step {t.steps})" if t.checkpoint_s is not None else " (the test saved none)"),
            f"planned: {self.epochs} epoch(s) = {t.startup_s:.1f} s + {self.epochs} × {self.epoch_s:.2f} s = "
            f"{self.planned_s:.0f} s on {self.gpus} GPU(s) = {self.gpu_hours:.3g} GPU-hours "
            f"(budget {self.budget_gpu_hours:.3g}); energy {self.energy_text}; job time limit {self.time_limit}",
        ]
        return "\n".join(lines + [f"note: {note}" for note in self.notes])

    def __str__(self) -> str:
        return self.formula()

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(self.formula())}</pre>"

    def as_dict(self) -> dict:
        """What the race job's card keeps of the plan."""
        return {"test_run": self.test.run_id, "gpus": self.gpus, "epochs": self.epochs,
                "budget_gpu_hours": self.budget_gpu_hours, "budget_s": self.budget_s,
                "planned_s": round(self.planned_s, 1), "planned_gpu_hours": self.gpu_hours,
                "planned_energy_wh": self.energy_wh, "time_limit": self.time_limit}


def budget(profile: Profile, gpus: int, budget_gpu_hours: float | None = None,
           budget_minutes: float | None = None) -> tuple[float, float, str]:
    """(wall seconds, GPU-hours, in words): minutes of wall clock, or GPU-hours shared by the GPUs."""
    if budget_minutes is None and budget_gpu_hours is None:
        budget_minutes = profile.race_budget_minutes or None
        budget_gpu_hours = None if budget_minutes else (profile.race_budget_gpu_hours or None)
    if budget_minutes is not None:
        if not budget_minutes > 0:
            raise RacePlanError(f"budget_minutes={budget_minutes!r}: give a positive number of minutes")
        wall = budget_minutes * 60
        return wall, wall * gpus / 3600, f"{budget_minutes:g} min of wall clock on {gpus} GPU(s) = {wall:.0f} s"
    if budget_gpu_hours is None or not budget_gpu_hours > 0:
        raise RacePlanError(f"profile {profile.name!r} sets no race budget: add race_budget_gpu_hours (or "
                            "race_budget_minutes) to it, or pass budget_gpu_hours=...")
    wall = budget_gpu_hours * 3600 / gpus
    return wall, budget_gpu_hours, f"{budget_gpu_hours:g} GPU-hours / {gpus} GPU(s) = {wall:.0f} s of wall clock"


def levers(options) -> tuple[int, bool]:
    """(--grad-accum K, --activation-checkpointing) of a race's options (the form's); the last one given wins."""
    options = [str(o) for o in options]
    k = 1
    checkpointing = False
    for i, option in enumerate(options):
        if option == "--grad-accum" and i + 1 < len(options):
            k = int(options[i + 1])
        elif option.startswith("--grad-accum="):
            k = int(option.split("=", 1)[1])
        elif option in ("--activation-checkpointing", "--no-activation-checkpointing"):
            checkpointing = option == "--activation-checkpointing"
    if k < 1:
        raise RacePlanError(f"--grad-accum {k}: at least one micro-batch a step")
    return k, checkpointing


def step_cost(test: TestRun, grad_accum: int, activation_checkpointing: bool) -> tuple[float, str]:
    """The race's step: `grad_accum` micro-batches of batch_size / grad_accum images, each at its time, with
    activation checkpointing's one forward more; and, in words, what was measured and what stated."""
    k, batch = grad_accum, test.batch_size
    if (k, activation_checkpointing) == (test.grad_accum, test.activation_checkpointing):
        if k == 1 and not activation_checkpointing:
            return test.step_s, ""
        return test.step_s, (f"race step = {k} × {test.micro_s:.4f} s (micro-batches of {batch / k:g} images"
                             + (", activation checkpointing" if activation_checkpointing else "")
                             + f") = {test.step_s:.4f} s, measured: the test ran these levers")
    micro, size, recompute = test.micro_s, "", ""
    if k != test.grad_accum:
        micro *= test.grad_accum / k
        size = (f": the test's {test.micro_s:.4f} s for {batch / test.grad_accum:g} images × {test.grad_accum}/{k}, "
                "stated: in proportion to the images, a lower bound (a smaller pass uses the device less well; a test "
                f"with --grad-accum {k} measures it)")
    step = k * micro
    if activation_checkpointing != test.activation_checkpointing:
        sign, state = (1, "on") if activation_checkpointing else (-1, "off")
        if test.t_forward is not None and test.grad_accum == 1:  # then its forward is the whole batch's
            step += sign * test.t_forward
            recompute = (f" {'+' if sign > 0 else '−'} the batch's forward {test.t_forward:.4f} s (measured by the "
                         f"test) for activation checkpointing {state}")
        else:
            factor = STATED_RECOMPUTE if sign > 0 else 1 / STATED_RECOMPUTE
            step *= factor
            recompute = (f" × {factor:.3f} for activation checkpointing {state} (stated: one forward more in a step "
                         "of three forwards' time; the test timed no forward of its whole batch)")
    return step, f"race step = {k} × {micro:.4f} s (micro-batches of {batch / k:g} images{size}){recompute} = {step:.4f} s"


def make_plan(test: TestRun | str, *, gpus: int | None = None, budget_gpu_hours: float | None = None,
              budget_minutes: float | None = None, profile: Profile | None = None, runs_dir=None,
              options=None) -> RacePlan:
    """The race plan for the run the test measured (a TestRun, or the test job's id). `options`: the race's (the
    form's), whose memory levers it costs (step_cost); None: the test's own."""
    profile = profile or current_profile()
    if not isinstance(test, TestRun):
        test = measure(test, runs_dir if runs_dir is not None else profile.runs)
    gpus = int(gpus or profile.race_gpus or test.world_size)
    if gpus < 1:
        raise RacePlanError(f"gpus={gpus}: at least one")
    wall, gpu_hours, words = budget(profile, gpus, budget_gpu_hours, budget_minutes)
    notes = list(test.levers_not_run)
    if gpus != test.world_size:
        notes.append(f"the test ran on {test.world_size} GPU(s), the race on {gpus}: the step time is taken as the "
                     "same (each GPU keeps its batch; communication may add to it)")
    k, checkpointing = (test.grad_accum, test.activation_checkpointing) if options is None else levers(options)
    step_s, step_words = step_cost(test, k, checkpointing)
    if test.batch_size % k:
        raise RacePlanError(f"--grad-accum {k}: the batch of {test.batch_size} per GPU does not split into {k} "
                            "micro-batches")
    steps_per_epoch = test.steps_per_epoch if (gpus, k) == (test.world_size, test.grad_accum) else epoch_steps(
        test, gpus, k)
    val_batches = math.ceil(math.ceil(test.val_images / gpus) / test.batch_size) if test.val_images else 0
    if test.t_forward is None and val_batches:
        notes.append("the test has no forward-pass timing: a validation batch is taken as a third of a step")
    val_batch_s = test.t_data + (test.t_forward if test.t_forward is not None else test.step_s / 3)
    loader_s = test.first_load_s if test.num_workers and not test.persistent_workers else 0.0
    if test.checkpoint_s is None:
        notes.append("the test saved no checkpoint, so the race run's save every epoch is left out of the plan: "
                     "run the test with --checkpoint-steps <its steps> (race.submit_test does)")
    plan = RacePlan(test=test, gpus=gpus, budget_s=wall, budget_gpu_hours=gpu_hours, budget_words=words,
                    steps_per_epoch=steps_per_epoch, val_batches=val_batches, val_s=val_batches * val_batch_s,
                    loader_s=loader_s, checkpoint_s=test.checkpoint_s or 0.0, epochs=0, notes=notes,
                    step_s=step_s, step_words=step_words)
    plan.epochs = max(0, math.floor((wall - test.startup_s) / plan.epoch_s))
    if not plan.fits:
        notes.append(f"the budget does not fit one epoch ({plan.epoch_s:.0f} s after {test.startup_s:.0f} s of "
                     "startup): a smaller image size, model or data set, or a larger budget")
    return plan


def epoch_steps(test: TestRun, gpus: int, grad_accum: int = 1) -> int:
    """Optimizer steps per epoch on `gpus` GPUs, as train_classifier.py counts them (a DistributedSampler
    shard per GPU; a last batch of one image is dropped, BatchNorm cannot take it, and under --grad-accum K one that
    does not split into K equal micro-batches of two images or more: common/training_state.last_batch_dropped)."""
    if not test.train_images:
        return test.steps_per_epoch  # synthetic: --synthetic-steps, whatever the GPU count
    shard = math.ceil(test.train_images / gpus)
    rest = shard % test.batch_size
    drop = test.drop_last or (rest and (rest % grad_accum or rest // grad_accum < 2))
    return shard // test.batch_size if drop else math.ceil(shard / test.batch_size)
