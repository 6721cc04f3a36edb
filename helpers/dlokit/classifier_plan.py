"""Days 1-3 and the race at the sizes their notebooks suggest for a GPU node, checked on a CPU: every job valid, and
planned to fit.

    rows = plan("day1", ranks=4, card_gib=80)    # one row per job of day1_single_gpu.ipynb at GPU_SIZES["day1"]

Each job's command line is written by the notebook's own Day methods (`Day.command`, `scan`, `precision_arms`,
`large_batch_trainings`, `compile_bench`...) from the notebook's parameters updated with GPU_SIZES, and parsed by its
script's own parser for its number of ranks, on a GPU (train_options.parse_args: batch per rank, --lr-finder in one
process, SyncBatchNorm...). Its memory per rank is classifier_memory's (activations measured on this CPU at the
job's model and crop) and must fit the card after MARGIN. What a notebook chooses from a measurement, the plan takes
from the memory model: Day 1's busy batch is the largest of the scan that fits the card. The batch scans may end out
of memory (Day 1's wall, which its check expects); every other job must fit. The days after Day 1 are planned in each
precision Day 1 may keep (bf16, or fp32), the race with AdamW (the optimiser of Day 3 with the most state).

GPU_SIZES is the one source of the sizes each notebook's "Sizes" text suggests (tests/test_gpu_plan_week.py holds
them to each other); the rest of the parameters are the notebooks' own.
"""
from __future__ import annotations

import atexit
import functools
import json
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from dlokit import classifier_memory
from dlokit.layout_planner import usable_gib
from dlokit.script_modules import common_module, load_script
from dlokit.submission import week
from dlokit.submission.day import Day, compile_variants, precision_options

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "tp_scripts" / "solutions"
NOTEBOOKS = {"day1": "day1_single_gpu.ipynb", "day2": "day2_data_and_ddp.ipynb",
             "day3": "day3_large_batch_compile_hpo.ipynb", "race": "race.ipynb"}
# What each notebook's "Sizes" text tells an instructor to set on a GPU cluster
GPU_SIZES = {
    "day1": {"MODEL": "resnet50", "IMAGE_SIZE": 224, "BATCH_SIZE": 256, "STEPS": 50,
             "GPU_BATCH_SWEEP": [64, 128, 256, 512, 1024], "PROFILE_BATCHES": [256, 32], "TRAIN_PER_CLASS": 300},
    "day2": {"MODEL": "resnet50", "IMAGE_SIZE": 224, "BATCH_SIZE": 256, "STEPS": 50, "WORKERS": 8,
             "GPU_COUNTS": [1, 2, 4, 8, 16, 32]},
    "day3": {"MODEL": "resnet50", "EPOCHS": 30, "SMALL_BATCH": 256, "LARGE_BATCH": 8192, "COMPILE_BATCH": 256,
             "COMPILE_PARTS": "model,inference,optimizer,function",
             "COMPILE_MODES": ["default", "max-autotune-no-cudagraphs", "reduce-overhead"],
             "READ_WORKERS": [0, 4, 8, 16], "HPO_TRIALS": 20, "LR_FINDER_BATCHES": [256], "LR_FINDER_STEPS": 8},
    "race": {"MODEL": "resnet50", "IMAGE_SIZE": 160, "BATCH_SIZE": 256, "TEST_STEPS": 50},
}
PRECISIONS = ("bf16", "fp32")  # what Day 1 may keep for the days after it
RACE_OPTIMIZER = "adamw"
FIT_LIMIT_STAND_IN = 64  # MiB: TP1.5's scan limit is measured by its first job on the node; the plan checks the options
CLASSES = 1000  # on a GPU cluster DATA is ImageNet (Day 3's CIFAR-10 has 10: its last layer is smaller still)


@dataclass
class Job:
    tp: str
    command: str
    ranks: int
    expect: str = "fits"  # "fits", "either" (a batch scan: its wall is out of memory), "cpu" (TP1.0's baseline)


@dataclass
class _PlannedDay(Day):
    """Day's command lines with what the earlier days would carry, and no profile or course notes."""
    planned: list = field(default_factory=list)

    @property
    def carried(self) -> list[str]:
        return list(self.planned)


@functools.lru_cache(maxsize=None)
def scratch() -> Path:
    """A tiny ImageNet-layout folder the parsers accept (on the node DATA is a real ImageNet), and a runs folder for
    its converted formats (TP3.4)."""
    from PIL import Image

    root = Path(tempfile.mkdtemp(prefix="dlokit-plan-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for split, label in [(split, label) for split in ("train", "val") for label in range(10)]:
        (root / "images" / split / f"c{label}").mkdir(parents=True)
        Image.new("RGB", (40, 40), (25 * label, 0, 0)).save(root / "images" / split / f"c{label}" / "0.JPEG")
    return root


def notebook_parameters(notebook: Path) -> dict:
    """The values of a notebook's parameters cell (the CPU sizes the course runs)."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    cell = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    values: dict = {}
    exec("".join(cell["source"]), {}, values)
    return {name: value for name, value in values.items() if name.isupper()}


def _day(p: dict, ranks: int, carried=(), batch_size: int | None = None) -> _PlannedDay:
    profile = SimpleNamespace(runs=scratch() / "runs", backend="slurm", node_gpus=lambda: ranks, race_gpus=ranks)
    return _PlannedDay("plan", profile, SOLUTIONS / "train_classifier.py", str(scratch() / "images"), model=p["MODEL"],
                       image_size=p["IMAGE_SIZE"], batch_size=batch_size or p.get("BATCH_SIZE") or 16,
                       steps=p.get("STEPS") or 10, planned=list(carried))


def day1_jobs(p: dict, ranks: int, card_gib: float, precision: str = "bf16") -> list[Job]:
    """day1_single_gpu.ipynb's jobs on a GPU; `precision`: the one TP1.2 keeps."""
    day = _day(p, ranks)
    jobs = [Job("TP1.0", day.command("--device", "cpu"), 1, "cpu"), Job("TP1.1", day.command(), 1)]
    day.image_size = p["GPU_IMAGE_SIZE"] or day.image_size  # Day.device_sizes, once the first job showed a GPU
    sweep = p["GPU_BATCH_SWEEP"]
    jobs += [Job("TP1.1", command, 1, "either") for command in day.scan(sweep)]
    fitting = [b for b in sweep if need_gib(Job("", day.command(batch_size=b), 1)) <= usable_gib(card_gib, 1)]
    busy = max(fitting, default=day.batch_size)  # BatchScan.busy_batch on a GPU: the largest that fitted
    jobs += [Job("TP1.2", command, 1) for command in day.precision_arms(True, p["AMP_MODES"], batch_size=busy).values()]
    kept = precision_options(precision)
    jobs += [Job("TP1.2", command, 1, "either") for command in day.scan(sweep, *kept)]
    jobs += [Job("TP1.3", day.command(*kept, *layout, batch_size=busy), 1) for layout in ([], ["--channels-last"])]
    large, small = p["PROFILE_BATCHES"] or [4 * p["BATCH_SIZE"], max(2, p["BATCH_SIZE"] // 4)]
    profile = ["--profile", "--profile-wait", "1", "--profile-warmup", "1", "--profile-active", "2"]
    jobs += [Job("TP1.4", command, 1) for command in day.scan([large, small], *profile, steps=max(p["STEPS"], 4))]
    fit = ["--data", day.data, "--image-size", p["FIT_IMAGE_SIZE"], "--micro-batches", p["FIT_MICRO_BATCHES"]]
    jobs.append(Job("TP1.5", day.command(*fit, "--batch-size", p["FIT_BATCH"], "--steps", p["FIT_STEPS"],
                                         "--norm-lesson", "batch,group", script="fit_levers.py"), 1))
    scan = [*fit, "--batch-size", p["FIT_SCAN_BATCH"], "--steps", 0, "--memory-limit", FIT_LIMIT_STAND_IN]
    jobs += [Job("TP1.5", day.command(*scan, "--levers", lever, script="fit_levers.py"), 1, "either")
             for lever in ("plain", "accumulate", "checkpoint")]
    return jobs


def day2_jobs(p: dict, ranks: int, card_gib: float, precision: str = "bf16") -> list[Job]:
    """day2_data_and_ddp.ipynb's jobs on a node of `ranks` GPUs, from Day 1's `precision` (and channels_last)."""
    day = _day(p, ranks, [*precision_options(precision), "--channels-last"])
    tuned = ["--num-workers", str(p["WORKERS"]), "--pin-memory", "--non-blocking", "--prefetch-factor",
             str(p["PREFETCH"]), "--persistent-workers"]
    counts = p["GPU_COUNTS"] or day.gpu_counts()
    most, ddp_batch = max(counts), p["DDP_BATCH"] or day.batch_size
    loader = [["--num-workers", "0"], ["--num-workers", str(p["WORKERS"])],
              ["--num-workers", str(p["WORKERS"]), "--pin-memory", "--non-blocking"], tuned]
    jobs = [Job("TP2.1", day.command(*options), 1) for options in loader]
    jobs += [Job("TP2.2", day.command(*tuned, batch_size=ddp_batch), n) for n in counts]
    curve = day.command(*tuned, batch_size=p["CURVE_BATCH"] or ddp_batch, epochs=p["CURVE_EPOCHS"])
    jobs += [Job("TP2.2", curve, n) for n in (1, most)]
    jobs.append(Job("TP2.3", day.command(*tuned, "--profile", "--profile-wait", "1", "--profile-warmup", "1",
                                         "--profile-active", "2", batch_size=ddp_batch, steps=max(p["STEPS"], 4)), most))
    if most > 1:  # Day.submit_sync_bn on a GPU node
        jobs += [Job("TP2.3", day.command(*tuned, *sync, epochs=p["BN_EPOCHS"]), most) for sync in ([], ["--sync-bn"])]
    jobs.append(Job("TP2.3", day.command(script="bn_statistics.py"), most))
    layer_drop = ["--layer-drop", "0.5"] + ([] if p["MODEL"].startswith("resnet") else ["--model", "resnet18"])
    jobs += [Job("TP2.3", day.command(*tuned, *layer_drop, *unused, batch_size=16, steps=3), most)
             for unused in ([], ["--find-unused-parameters"])]
    jobs += [Job("TP2.3", day.command(*tuned, *switch, batch_size=ddp_batch), most)
             for switch in ([], ["--find-unused-parameters"], ["--metric-step", str(p["STEPS"])])]
    jobs += [Job("TP2.4", day.command(*tuned, "--augment", name), 1) for name in ("randaugment", "mixup")]
    return jobs


def day3_jobs(p: dict, ranks: int, card_gib: float, precision: str = "bf16") -> list[Job]:
    """day3_large_batch_compile_hpo.ipynb's jobs, from Day 1's `precision`."""
    day = _day(p, ranks, [*precision_options(precision), "--channels-last"], batch_size=p["SMALL_BATCH"])
    optimizers = p["LR_FINDER_OPTIMIZERS"] or p["OPTIMIZERS"]
    jobs = [Job("TP3.1", command, 1) for command in day.large_batch_trainings(
        p["OPTIMIZERS"], p["BASE_LR"], p["SMALL_BATCH"], p["LARGE_BATCH"], p["WARMUP_EPOCHS"], p["EPOCHS"])]
    finder = list(dict.fromkeys([*(p["LR_FINDER_BATCHES"] or []), p["LARGE_BATCH"]]))
    jobs += [Job("TP3.2", command, 1) for command in day.scan(
        finder, "--optimizer", "sgd", "--lr-finder", "--lr-finder-optimizers", ",".join(optimizers), "--lr-finder-min",
        "1e-5", "--lr-finder-max", "10", "--lr-finder-trials", p["LR_FINDER_TRIALS"], "--lr-finder-steps",
        p["LR_FINDER_STEPS"], steps=1)]
    found = {name: p["BASE_LR"].get(name, 0.01) for name in optimizers}  # the lrs the range test suggests
    jobs += [Job("TP3.2", command, 1) for command in day.found_lr_trainings(found, p["LARGE_BATCH"], p["SMALL_BATCH"],
                                                                             p["WARMUP_EPOCHS"], p["EPOCHS"])]
    variants = compile_variants(p["COMPILE_MODES"])
    jobs.append(Job("TP3.3", day.compile_bench(p["COMPILE_PARTS"], variants, p["COMPILE_BATCH"], p["COMPILE_STEPS"]), 1))
    if ranks > 1 and "model" in p["COMPILE_PARTS"]:  # Day.submit_compile_ddp
        jobs.append(Job("TP3.3", day.compile_bench("model", f"eager,compile-{p['COMPILE_MODES'][0]}",
                                                   p["COMPILE_BATCH"], p["COMPILE_STEPS"]), 2))
    formats = _formats(day)  # the notebook's conversion (Day.storage_formats), of the scratch images
    jobs.append(Job("TP3.4", day.command("--data", formats, "--workers", ",".join(map(str, p["READ_WORKERS"])),
                                         "--batch-size", p["SMALL_BATCH"], "--batches", p["READ_BATCHES"] or 100,
                                         script="read_bench.py"), 1))
    jobs += [Job("TP3.4", day.command("--data", formats, "--data-format", kind, "--num-workers", p["READ_WORKERS"][-1],
                                      steps=4), 1) for kind in ("webdataset", "raw")]
    space = load_script(SOLUTIONS / "hpo_space.py")
    batches = space.SPACE["batch_size"][1] if "batch_size" in space.SPACE else [day.batch_size]
    for epochs in (p["HPO_EPOCHS"], p["PRUNE_EPOCHS"]):  # TP3.5's trials, one GPU each: each batch of the space
        jobs += [Job("TP3.5", day.command(*space.as_options({"lr": 0.1, "batch_size": b}), epochs=epochs), 1)
                 for b in batches]
    return jobs


def race_jobs(p: dict, ranks: int, card_gib: float, precision: str = "bf16") -> list[Job]:
    """race.ipynb's test job and run on the profile's race GPUs (`ranks`), with the form's defaults."""
    from dlokit.race.launch import NO_WARMUP, run_command

    notes = {"amp": "none" if precision == "fp32" else precision, "channels_last": True,
             "optimizer": {"optimizer": RACE_OPTIMIZER, "lr": 0.001}}
    day = _day(p, ranks, week.carried_options(notes, [1, 3]))
    options = ["--image-size", str(day.image_size), "--batch-size", str(day.batch_size)]
    test = day.command("--checkpoint-steps", str(p["TEST_STEPS"]), *options, *NO_WARMUP, steps=p["TEST_STEPS"])
    return [Job("race", test, ranks), Job("race", shlex.join(run_command(day, SimpleNamespace(epochs=16), options)), ranks)]


def _formats(day: Day) -> Path:
    folder = Path(day.runs) / f"formats-{Path(day.data).name}"
    return folder if (folder / "manifest.json").exists() else day.storage_formats()


DAYS = {"day1": day1_jobs, "day2": day2_jobs, "day3": day3_jobs, "race": race_jobs}


# ---- one job, checked ---------------------------------------------------------------------------------------

def parse(job: Job):
    """(the script's name, its parsed options) or ValueError with what the script would say."""
    return _parsed(job.command, job.ranks)


@functools.lru_cache(maxsize=None)  # a day's jobs repeat commands, and every plan of a card repeats the day
def _parsed(command: str, ranks: int):
    argv = shlex.split(command)
    script = Path(argv[0])
    try:
        if script.name == "train_classifier.py":
            options = common_module(SOLUTIONS.parent, "train_options")
            return script.name, options.parse_args(argv[1:], world_size=ranks, cuda_available=True)
        return script.name, load_script(script).parse_args(argv[1:])
    except SystemExit:  # argparse has printed why
        raise ValueError(f"{script.name} refuses its options (exit 2)") from None


def need_gib(job: Job, args=None) -> float | None:
    """GiB per rank the job holds on its device (None: a script with its own small shapes)."""
    name, args = parse(job) if args is None else (Path(shlex.split(job.command)[0]).name, args)
    if name == "compile_bench.py":  # a training step, inference, an optimizer step (Adam) of the same model
        need = classifier_memory.estimate(args.model, image_size=args.image_size, batch_size=args.batch_size,
                                          optimizer="adamw", ranks=job.ranks, classes=CLASSES)
    elif name == "train_classifier.py":
        optimizer = max(args.lr_finder_optimizers if args.lr_finder else [args.optimizer],
                        key=classifier_memory.OPTIMIZER_STATES.get)  # the range test runs each
        need = classifier_memory.estimate(args.model, image_size=args.image_size, batch_size=args.batch_size,
                                          amp=args.amp, optimizer=optimizer, ranks=job.ranks,
                                          cuda=args.device != "cpu", classes=CLASSES)
    else:  # read_bench.py, bn_statistics.py, fit_levers.py (TP1.5's small crops, whatever the day's sizes)
        return None
    return need.total_gib


def check(job: Job, card_gib: float) -> dict:
    """One job against a card: {"tp", "job", "ranks", "need_gib", "usable_gib", "expect", "finding"} ("finding": None
    when it will run as its cell expects)."""
    usable = usable_gib(card_gib, job.ranks)
    row = {"tp": job.tp, "job": _short(job.command), "ranks": job.ranks, "need_gib": None,
           "usable_gib": round(usable, 1), "expect": job.expect, "finding": None}
    try:
        _, args = parse(job)
        need = need_gib(job, args)
    except ValueError as error:
        return {**row, "finding": f"refused: {error}"}
    row["need_gib"] = None if need is None else round(need, 1)
    if need is not None and need > usable and job.expect == "fits":
        row["finding"] = f"out of memory: needs {need:.1f} GiB per rank, {usable:.1f} GiB there"
    return row


def _short(command: str) -> str:
    argv = shlex.split(command)
    groups = [(o, v) for o, v in week.option_groups(argv[1:]) if o not in ("--data", "--print-every")]
    return " ".join([Path(argv[0]).name, *(" ".join([o, *v]) for o, v in groups)])


def plan(day: str, ranks: int = 4, card_gib: float = 80, sizes: dict | None = None, precision: str = "bf16") -> list[dict]:
    """Every job of `day`'s notebook at its parameters updated with `sizes` (default GPU_SIZES[day]), on a node of
    `ranks` cards of `card_gib` GB each, after Day 1 kept `precision`: a row per job (check), scans' walls included."""
    p = {**notebook_parameters(REPO / "notebooks" / NOTEBOOKS[day]), **(GPU_SIZES[day] if sizes is None else sizes)}
    rows = [check(job, card_gib) for job in DAYS[day](p, ranks, card_gib, precision)]
    return [{"day": day, **row} for row in rows]
