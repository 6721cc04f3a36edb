"""Days 1-3 and the race at the sizes their notebooks suggest for GPUs, on a CPU (dlokit.classifier_plan through
dlokit.gpu_plan): every job's options pass its script's own parser for its ranks on a GPU, and its memory per rank,
from dlokit.classifier_memory, fits the card. docs/instructors.md's table is the plan's. No GPU, no launch."""
import json
import re
from pathlib import Path

import pytest

from dlokit import classifier_plan, gpu_plan

DAYS = list(classifier_plan.DAYS)
DOC = Path(gpu_plan.REPO) / "docs" / "instructors.md"


def named(rows):
    return [(row["day"], row["tp"], row["job"], row["finding"]) for row in gpu_plan.findings(rows)]


@pytest.mark.parametrize("dtype", gpu_plan.DTYPES)
@pytest.mark.parametrize("ranks", [4, 8])
def test_every_classifier_day_is_valid_and_fits_an_80gb_node(ranks, dtype):
    rows = {day: gpu_plan.plan(ranks, 80, dtype=dtype, day=day) for day in DAYS}
    assert [f for day in DAYS for f in named(rows[day])] == []
    assert {row["tp"] for row in rows["day1"]} == {f"TP1.{n}" for n in range(6)}
    assert {row["tp"] for row in rows["day2"]} == {f"TP2.{n}" for n in range(1, 5)}
    assert {row["tp"] for row in rows["day3"]} == {f"TP3.{n}" for n in range(1, 6)}
    assert len(rows["race"]) == 2 and all(row["ranks"] == ranks for row in rows["race"])
    ddp = [row for row in rows["day2"] if row["tp"] == "TP2.2"]
    assert sorted({row["ranks"] for row in ddp}) == [1, 2, 4, 8, 16, 32]  # GPU_COUNTS, as the text suggests
    trained = [row for row in rows["day1"] + rows["day2"] if row["need_gib"] and "--batch-size 256" in row["job"]]
    assert trained and all(row["need_gib"] > 5 for row in trained)  # resnet50 at 224 px, planned: not a CPU size
    scan = [row for row in rows["day1"] if row["expect"] == "either" and row["tp"] in ("TP1.1", "TP1.2")]
    assert len(scan) == 10 and max(row["need_gib"] for row in scan) > 71  # the fp32 scan's wall, at batch 1024


def test_the_jobs_that_would_not_fit_a_40gb_card_are_named():
    rows = [row for day in DAYS for row in gpu_plan.plan(4, 40, dtype="fp32", day=day)]
    assert named(rows) == []  # every job that must fit does, the scans' walls aside
    walls = [(row["tp"], row["job"].split("--batch-size ")[1].split()[0]) for row in rows
             if row["need_gib"] and row["need_gib"] > row["usable_gib"]]
    assert walls == [("TP1.1", "512"), ("TP1.1", "1024"), ("TP1.2", "512"), ("TP1.2", "1024")]  # fp32 kept: same scan
    busy = [row for row in rows if row["tp"] == "TP1.3"]
    assert all("--batch-size 256" in row["job"] for row in busy)  # TP1.2-1.3 at the largest batch that fits: 256


@pytest.mark.parametrize("day, sizes, tp, finding", [
    ("day1", {"BATCH_SWEEP": [64, 128, 256, 512, 1024], "PROFILE_BATCHES": None}, "TP1.4",
     "out of memory: needs 82"),  # the text before the plan: TP1.4's 4 x BATCH_SIZE = 1024 in fp32
    ("day3", {"LARGE_BATCH": 1}, "TP3.1", "refused: train_classifier.py"),  # BatchNorm needs 2 images
    ("day2", {"BATCH_SIZE": 2048}, "TP2.2", "out of memory"),
    ("race", {"IMAGE_SIZE": 16}, "race", "refused"),  # ImageNet models downsample by 32
    ("day1", {"FIT_BATCH": 30}, "TP1.5", "refused: fit_levers.py"),  # 30 images do not split into 4 micro-batches
])
def test_the_plan_names_a_job_that_would_fail(day, sizes, tp, finding):
    found = named(gpu_plan.plan(8, 80, sizes={**classifier_plan.GPU_SIZES[day], **sizes}, dtype="fp32", day=day))
    assert [f for f in found if f[1] == tp and finding in f[3]], found


@pytest.mark.parametrize("day", DAYS)
def test_the_sizes_text_suggests_the_plans_sizes(day):
    """One source: each notebook's "Sizes" text names each of its GPU_SIZES, with its value."""
    cells = json.loads((gpu_plan.REPO / "notebooks" / classifier_plan.NOTEBOOKS[day]).read_text())["cells"]
    text = next("".join(c["source"]) for c in cells if re.match(r"\*\*(Budget and )?[Ss]izes\.\*\*", "".join(c["source"])))
    text = re.sub(r"\s+", " ", text)
    for name, value in classifier_plan.GPU_SIZES[day].items():
        assert f"`{name} = {json.dumps(value)}`" in text, name


@pytest.mark.parametrize("notebook, snippet", [
    ("day1", 'day.device_sizes(ON_GPU, GPU_IMAGE_SIZE, BATCH_SWEEP, GPU_BATCH_SWEEP)'),
    ("day1", 'amp_batch = scan.busy_batch(BATCH_SIZE)'),
    ("day1", 'large, small = PROFILE_BATCHES or [4 * BATCH_SIZE, max(2, BATCH_SIZE // 4)]'),
    ("day1", 'fit_options = ["--data", day.data, "--image-size", FIT_IMAGE_SIZE, "--micro-batches", FIT_MICRO_BATCHES]'),
    ("day1", 'scan_options = [*fit_options, "--batch-size", FIT_SCAN_BATCH, "--steps", 0, "--memory-limit", fit_limit]'),
    ("day2", 'DDP_BATCH = DDP_BATCH or BATCH_SIZE'),
    ("day2", 'ddp_jobs = day.submit_until_decided([ddp_run], verdicts.scaling_decided, rounds=REPEATS,'),
    ("day2", '                                    n_gpu=GPU_COUNTS, tp="TP2.2")'),
    ("day2", 'CURVE_BATCH = CURVE_BATCH or (DDP_BATCH if ON_GPU else 32)'),
    ("day3", 'day.large_batch_trainings(OPTIMIZERS, BASE_LR, SMALL_BATCH, LARGE_BATCH, WARMUP_EPOCHS,'),
    ("day3", 'day.compile_bench(COMPILE_PARTS, variants, COMPILE_BATCH, COMPILE_STEPS)'),
    ("race", 'race.submit_test(day, options, steps=TEST_STEPS)'),
])
def test_the_notebooks_write_their_commands_as_the_plan_does(notebook, snippet):
    """classifier_plan writes the cells' command lines again: the cells must still say the same."""
    cells = json.loads((gpu_plan.REPO / "notebooks" / classifier_plan.NOTEBOOKS[notebook]).read_text())["cells"]
    assert any(snippet in "".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_the_instructors_table_is_the_plans():
    text = DOC.read_text()
    shown = text.split("<!-- gpu_plan --table -->\n")[1].split("\n<!-- end gpu_plan --table -->")[0]
    assert shown == gpu_plan.sizes_table(), "paste `python -m dlokit.gpu_plan --table` into docs/instructors.md"
