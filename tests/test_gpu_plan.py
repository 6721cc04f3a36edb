"""Day 4 at the sizes its notebook suggests for GPUs, on a CPU: every job's options pass its script's own checks
and its memory per rank, from the memory model, fits the card (dlokit.gpu_plan). No GPU, no launch."""
import json
import re

import pytest

from dlokit import gpu_plan


def named(rows):
    return [(row["tp"], row["job"], row["finding"]) for row in gpu_plan.findings(rows)]


@pytest.mark.parametrize("dtype", gpu_plan.DTYPES)
@pytest.mark.parametrize("ranks", [4, 8])
def test_every_day4_job_is_valid_and_fits_an_80gb_node(ranks, dtype):
    rows = gpu_plan.plan(ranks, card_gib=80, dtype=dtype)
    levers = [row for row in rows if "--memory-limit" in row["job"] and any(
        lever in row["job"] for lever in ("--activation-checkpointing", "--grad-accum", "--cpu-offload"))]
    assert len(levers) in (3, 6)  # TP4.2's levers at the scan's batches FSDP2 is modelled not to fit (1 or 2 of them)
    ds = [row for row in rows if row["tp"] == "TP4.8"]
    planned = [row for row in rows if row["tp"] == "TP4.9"]
    assert len(ds) == 4 and all(row["need_gib"] > 1 for row in ds)  # ZeRO 1, 2, 3, 2 + offload: 1b planned
    assert len(planned) == 2 + 2 * 4  # the matmul peak, the collectives, two rounds of the planner's 3 fastest and its slowest
    assert len(rows) == 31 + len(levers) + len(ds) + len(planned) and named(rows) == []
    trained = [row for row in rows if row["need_gib"] is not None]
    assert all(row["need_gib"] > 1 for row in trained)  # 1b and 3b, planned: not the CPU's tiny model
    assert {row["tp"] for row in rows} == {f"TP4.{n}" for n in range(1, 10)}


def test_the_jobs_that_would_not_fit_a_40gb_card_are_named():
    found = named(gpu_plan.plan(4, card_gib=40))
    single = [f for f in found if "--mode single" in f[1]]
    assert single and "out of memory: needs 40.0" in single[0][2]  # TP4.2/TP4.6's reference: the whole batch, one GPU
    scan = [f for f in found if "--memory-limit 48939" in f[1]]
    assert len(scan) == 8 + 3 and all("a 40 GB card gives" in f[2] for f in scan)  # the scan's limit (and its levers')
    assert len(found) == 12
    in_fp32 = named(gpu_plan.plan(4, card_gib=40, dtype="fp32"))
    assert [f for f in in_fp32 if "--mode ddp" in f[1] and "--steps 6" in f[1]]  # TP4.1's DDP too: 35.2 GiB


@pytest.mark.parametrize("dtype", gpu_plan.DTYPES)
def test_the_sizes_for_40gb_cards_fit_them(dtype):
    smaller = gpu_plan.SMALLER_CARDS[40]
    assert named(gpu_plan.plan(smaller["RANKS"], 40, sizes={**gpu_plan.GPU_SIZES, **smaller}, dtype=dtype)) == []


def test_the_sizes_cell_suggests_the_plans_sizes():
    """One source: the notebook's "Sizes" cell names each of GPU_SIZES, with its value."""
    cells = json.loads(gpu_plan.NOTEBOOK.read_text())["cells"]
    text = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("**Sizes.**"))
    text = re.sub(r"\s+", " ", text)
    for name, value in gpu_plan.GPU_SIZES.items():
        assert f"`{name} = {json.dumps(value)}`" in text, name


def test_the_course_cpu_sizes_are_unchanged_and_valid():
    cpu = gpu_plan.notebook_parameters()
    assert (cpu["CONFIG"], cpu["SEQ_LEN"], cpu["BATCH"], cpu["RANKS"], cpu["COMPRESS_CONFIG"]) == ("tiny", 64, 8, 2, "tiny")
    rows = [gpu_plan.check(job, 80) for job in gpu_plan.day4_jobs(cpu, ranks=2, dtype="fp32")]
    assert not [row for row in rows if row["finding"] and row["finding"].startswith("refused")]


@pytest.mark.parametrize("sizes, job, finding", [
    ({"BATCH": 16, "SEQ_LEN": 2048}, "--mode single", "out of memory: needs 91"),  # the old suggestion
    ({"COMPRESS_CONFIG": "1b"}, "compress_bench.py", "runs on the CPU"),  # a 1.24 B model on the CPU
    ({"CONFIG": "125m"}, "--mode pp", "n_layers = 12 is not divisible"),  # 8 stages of 12 layers
])
def test_the_plan_names_a_job_that_would_fail(sizes, job, finding):
    found = named(gpu_plan.plan(8, 80, sizes={**gpu_plan.GPU_SIZES, **sizes}))
    assert [f for f in found if job in f[1] and finding in f[2]], found


@pytest.mark.parametrize("snippet", [
    'OOM_SIZES = ["--batch-size", RANKS, "--seq-len", 16]',      # one sequence per rank: divides over any RANKS
    'batch_size=RANKS, seq_len=16',                             # ... and the limit is planned for that batch
    'day.command(None, "--config", COMPRESS_CONFIG, "--train-steps"',  # TP4.7 on the CPU at a CPU size
    'day.pipeline_runs(MICROBATCHES, seq_len=PP_SEQ_LEN, steps=PP_STEPS)',  # TP4.3: the plan calls the same method
    'day.deepspeed_runs(DS_STAGES, offload_stage=DS_OFFLOAD_STAGE)',     # TP4.8: likewise
])
def test_the_notebook_writes_its_commands_as_the_plan_does(snippet):
    """gpu_plan.day4_jobs writes the cells' command lines again (or calls the day's method they call): the cells
    must still say the same."""
    cells = json.loads(gpu_plan.NOTEBOOK.read_text())["cells"]
    assert any(snippet in "".join(c["source"]) for c in cells if c["cell_type"] == "code")
