"""Every day at the sizes its notebook suggests for a GPU node, checked on a CPU: every job valid, and planned to fit.

    rows = plan(ranks=4, card_gib=80)    # one row per job of day4_large_models.ipynb at GPU_SIZES
    plan(4, 80, day="day1")              # ... of Days 1-3 and the race (dlokit.classifier_plan), the same way
    week(4, 80)                          # every day's rows, each with its "day"
    findings(rows)                       # the rows whose job would fail: refused options, or out of memory
    print(sizes_table())                 # the sizes per day and GPU memory, as docs/instructors.md shows them

Day 4 (below):

Each job's command line is written the way the notebook writes it (`LlmDay.command`, the cells' own options),
parsed by its script's own parser and checked against its layout's rules (train_llm.py's `plan_degrees`:
divisibility, tied embeddings, stages) for its number of ranks; its memory per rank comes from the memory model
(`memory_model.estimate_for_run`, on CUDA: with AdamW's foreach temporaries, and DDP's gradient buckets; DeepSpeed's
master copy and bucket for train_deepspeed.py)
and must fit what is left of the card after MARGIN. A job under `--memory-limit` must get a limit the card
has, and end as its cell expects (TP4.2: DDP out of memory, FSDP2 fits). A CPU-only script keeps the CPU sizes.

GPU_SIZES is the one source of the sizes the notebook's "Sizes" cell suggests (tests/test_gpu_plan.py holds them
to each other); the rest of the parameters are the notebook's own (its parameters cell).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

from dlokit import classifier_plan, layout_planner, memory_model
from dlokit.layout_planner import MARGIN, usable_gib  # noqa: F401 (gpu_plan.usable_gib, as before)
from dlokit.analysis import layout_scan, llm_memory
from dlokit.script_modules import common_module, load_script
from dlokit.submission.day import LlmDay
from dlokit.submission.week import option_groups

REPO = Path(__file__).resolve().parents[2]
LLM = REPO / "tp_scripts" / "llm" / "solutions"
NOTEBOOK = REPO / "notebooks" / "day4_large_models.ipynb"
GIB = memory_model.GIB

# What the "Sizes" cell of the notebook tells an instructor to set on a GPU node (RANKS: 4 or 8, the node's GPUs)
GPU_SIZES = {
    "CONFIG": "1b", "SEQ_LEN": 1024, "BATCH": 8, "OOM_CONFIG": "3b",
    "SCAN_CONFIG": "1b", "SCAN_SEQ_LEN": 2048, "SCAN_BATCHES": [8, 16, 32, 64],
    "LOSS_MODES": ["ddp", "zero1", "fsdp", "tp-scratch", "tp", "pp", "cp", "fsdp-tp", "hsdp"],
    "COMM_MAX_MIB": 256,
}
# On 40 GB cards the 1b model's single-process reference cannot fit (its weights, gradients and AdamW states alone
# take 23 GiB, its logits at 2048 tokens most of the rest): the day runs the 125m model on 4 ranks (125m's 12 layers
# do not split into 8 pipeline stages), and the batch scan keeps 1b at shorter sequences.
SMALLER_CARDS = {40: {"RANKS": 4, "CONFIG": "125m", "SCAN_SEQ_LEN": 256}}
# Day 4 computes in the precision Day 1 kept: bf16, or fp32 where Day 1 kept fp16 (train_llm.py has none) or fp32
DTYPES = ("bf16", "fp32")
DTYPE = DTYPES[0]
CARDS_GIB = (80, 40)

CPU_ONLY = ("compress_bench.py",)  # scripts that run on the CPU whatever the node has


@dataclass
class Job:
    tp: str
    command: str
    ranks: int
    expect: str = "fits"  # "fits", "out of memory" (TP4.2's DDP), or "either" (a run of the batch scan)


def notebook_parameters(notebook: Path = NOTEBOOK) -> dict:
    """The values of the notebook's parameters cell (the CPU sizes the course runs)."""
    return classifier_plan.notebook_parameters(notebook)


@dataclass
class _PlannedDay(LlmDay):
    """LlmDay's command lines, with the precision Day 1 would carry, and no profile or course notes."""
    planned_dtype: str = DTYPE

    @property
    def carried(self) -> list[str]:
        return ["--dtype", self.planned_dtype]


def day4_jobs(p: dict, ranks: int, dtype: str = DTYPE) -> list[Job]:
    """Every job day4_large_models.ipynb submits at the parameters `p`, as its cells write them."""
    day = _PlannedDay("plan", SimpleNamespace(runs=Path("/nonexistent")), LLM / "train_llm.py", "synthetic",
                      batch_size=p["BATCH"], steps=p["STEPS"], config=p["CONFIG"], seq_len=p["SEQ_LEN"],
                      planned_dtype=dtype)
    jobs = [Job("TP4.1", day.command(m, "--data", "text", "--grad-norm"), ranks) for m in p["MEMORY_MODES"]]
    jobs.append(Job("TP4.2", day.command("single", "--data", "text", "--grad-norm"), 1))
    oom = oom_sizes(ranks)
    need = llm_memory.oom_demo_limit_mb(llm_memory.model_config(LLM, p["OOM_CONFIG"]), ranks=ranks,
                                        batch_size=oom[1], seq_len=oom[3], dtype=dtype)
    limit = p["OOM_LIMIT_MB"] or need["limit_mb"]
    jobs += [Job("TP4.2", day.command("ddp", *oom, "--memory-limit", limit, config=p["OOM_CONFIG"], steps=1), ranks,
                 "out of memory"),
             Job("TP4.2", day.command("fsdp", "--meta-init", *oom, "--memory-limit", limit, config=p["OOM_CONFIG"],
                                      steps=1), ranks)]
    scan = layout_scan.scan_limit(llm_memory.model_config(LLM, p["SCAN_CONFIG"]), ranks=ranks,
                                  batches=p["SCAN_BATCHES"], seq_len=p["SCAN_SEQ_LEN"], dtype=dtype)
    for mode, extra in (("ddp", []), ("fsdp", ["--meta-init"])):
        jobs += [Job("TP4.2", day.command(mode, *extra, "--batch-size", b, "--seq-len", p["SCAN_SEQ_LEN"],
                                          "--memory-limit", p["SCAN_LIMIT_MB"] or scan["limit_mb"],
                                          config=p["SCAN_CONFIG"], steps=2), ranks, "either")
                 for b in p["SCAN_BATCHES"]]
    fitted = scan["fits"]["fsdp"]  # the lever scan: FSDP2 + each lever where plain FSDP2 is modelled not to fit
    lever_batches = [b for b in p["SCAN_BATCHES"] if b > max(fitted, default=0)] or p["SCAN_BATCHES"][-1:]
    jobs += [Job("TP4.2", day.command("fsdp", "--meta-init", *lever, "--batch-size", b, "--seq-len", p["SCAN_SEQ_LEN"],
                                      "--memory-limit", p["SCAN_LIMIT_MB"] or scan["limit_mb"], config=p["SCAN_CONFIG"],
                                      steps=2), ranks, "either")
             for lever in p["SCAN_LEVERS"] for b in lever_batches]
    jobs += [Job("TP4.2", day.command("fsdp", "--data", "text", *compile_, steps=p["COMPILE_STEPS"]), ranks)
             for compile_ in ([], ["--compile"])]
    jobs += [Job("TP4.3", command, ranks)  # the day's own method, as the notebook calls it
             for command in day.pipeline_runs(p["MICROBATCHES"], seq_len=p["PP_SEQ_LEN"], steps=p["PP_STEPS"])]
    jobs += [Job("TP4.4", day.command(None, script="check_tp.py"), ranks),
             Job("TP4.5", day.command(None, script="check_cp.py"), ranks)]
    jobs += [Job("TP4.6", day.command(m, "--data", "text", "--grad-norm"), ranks)
             for m in p["LOSS_MODES"] if m not in p["MEMORY_MODES"]]
    jobs.append(Job("TP4.7", day.command(None, "--config", p["COMPRESS_CONFIG"], "--train-steps",
                                         p["COMPRESS_STEPS"], "--sparsities", *p["COMPRESS_SPARSITIES"],
                                         script="compress_bench.py"), 1))
    jobs += [Job("TP4.8", command, ranks)
             for command in day.deepspeed_runs(p["DS_STAGES"], offload_stage=p["DS_OFFLOAD_STAGE"])]
    jobs += [Job("TP4.9", day.command(None, "--measure", "peak", "--dtype", dtype, script="comm_bench.py"), ranks),
             Job("TP4.9", day.command(None, "--max-mib", p["COMM_MAX_MIB"], script="comm_bench.py"), ranks)]
    jobs += [Job("TP4.9", command, ranks) for command in day.layout_runs(plan_candidates(p, ranks, dtype),
                                                                          steps=p["PLAN_STEPS"], repeats=p["PLAN_REPEATS"])]
    return jobs


def plan_candidates(p: dict, ranks: int, dtype: str, card_gib: float = 80) -> list[list[str]]:
    """TP4.9's layouts at these sizes: the planner's on paper for an H100 node of `ranks` GPUs (on the node, its own
    measurements choose; any of them must fit)."""
    table = layout_planner.plan(llm_memory.model_config(LLM, p["CONFIG"]), world=ranks, memory_gib=usable_gib(card_gib, ranks),
                         hardware=layout_planner.paper_hardware("H100-80GB", dtype), batch_size=p["BATCH"],
                         seq_len=p["SEQ_LEN"], dtype=dtype)
    return list(layout_planner.candidates(table, top=p["PLAN_TOP"])["argv"])


def oom_sizes(ranks: int) -> list:
    """TP4.2's OOM demo: one sequence per rank (the weights and their states are the point)."""
    return ["--batch-size", ranks, "--seq-len", 16]


# ---- one job, checked ---------------------------------------------------------------------------------------

def script_parser(script: Path):
    """The parse_args function of a script of tp_scripts/llm (train_llm.py's lives in llm_kit/llm_options.py)."""
    if script.name == "train_llm.py":
        return common_module(script.parent, "llm_options").parse_args
    return load_script(script, f"_dlokit_plan_{script.stem}").parse_args


def parse(job: Job):
    """(the script's path, its parsed options) or raise ValueError with what the script would say."""
    argv = shlex.split(job.command)
    script = Path(argv[0])
    try:
        return script, script_parser(script)(argv[1:])
    except SystemExit:  # argparse has printed why
        raise ValueError(f"{script.name} refuses its options (exit 2)") from None


def train_llm_need(args, ranks: int) -> tuple[float, str]:
    """GiB per rank of a train_llm.py job on CUDA, after its options pass the script's own checks (else raise)."""
    options = common_module(LLM, "llm_options")
    config = common_module(LLM, "model").get_config(args.config, max_seq_len=args.seq_len)
    dims = options.plan_degrees(args, config, ranks)  # ArgumentsError: what the job would print before exiting 2
    record = {**vars(args), **dims.degrees(), "model": asdict(config)}
    need = memory_model.estimate_for_run(record, cuda=True).total
    if dims.data_parallel in ("ddp", "zero1"):  # DDP's buckets: a copy of the gradients (llm_memory.layout_need_mb)
        need += 4 * memory_model.params_on_rank(record["model"], dims.tp, dims.pp)
    return need / GIB, f"{dims.data_parallel or 'none'} dp={dims.dp} tp={dims.tp} pp={dims.pp} cp={dims.cp}"


def deepspeed_need(args, ranks: int) -> tuple[float, str]:
    """GiB per rank of a train_deepspeed.py job on CUDA: its stage over the ranks, DeepSpeed's fp32 master copy and
    reduce bucket (memory_model.estimate_for_run); with --offload-optimizer the states and their step on the host."""
    config = common_module(LLM, "model").get_config(args.config, max_seq_len=args.seq_len)
    if ranks < 2 and not args.one_process:  # as the script refuses it, after its parser
        raise ValueError("ZeRO shards over several processes: train_deepspeed.py refuses one without --one-process")
    if args.batch_size % ranks:
        raise ValueError(f"--batch-size {args.batch_size} does not split over {ranks} ranks")
    n_params = common_module(LLM, "model").count_params(config)
    record = {**vars(args), "model": asdict(config), "dp": ranks, "data_parallel": "deepspeed",
              "ds_config": {"zero_optimization": {"reduce_bucket_size": max(1, n_params // 32)}}}
    need = memory_model.estimate_for_run(record, cuda=True)
    held = need.total - (need.optimizer + need.optimizer_step if args.offload_optimizer else 0.0)
    return held / GIB, f"deepspeed zero={args.zero_stage} dp={ranks}" + (" offload" if args.offload_optimizer else "")


def check(job: Job, card_gib: float, cpu_job: Job | None = None) -> dict:
    """One job against a card: {"tp", "job", "ranks", "need_gib", "limit_gib", "usable_gib", "finding"}
    ("finding": None when it will run as its cell expects). cpu_job: the same job at the notebook's CPU sizes."""
    usable = usable_gib(card_gib, job.ranks)
    row = {"tp": job.tp, "job": _short(job.command), "ranks": job.ranks, "need_gib": None, "limit_gib": None,
           "usable_gib": round(usable, 1), "expect": job.expect, "finding": None}
    try:
        script, args = parse(job)
        if script.name in CPU_ONLY:
            if cpu_job is not None and shlex.split(job.command)[1:] != shlex.split(cpu_job.command)[1:]:
                row["finding"] = f"{script.name} runs on the CPU: keep its CPU sizes ({_short(cpu_job.command)})"
            return row
        if script.name not in ("train_llm.py", "train_deepspeed.py"):
            return row  # the checkers and benchmarks: their own small shapes, whatever the day's sizes
        need, layout = (train_llm_need if script.name == "train_llm.py" else deepspeed_need)(args, job.ranks)
    except ValueError as error:  # ArgumentsError is one
        return {**row, "finding": f"refused: {error}"}
    row.update(need_gib=round(need, 1), layout=layout)
    limit = args.memory_limit / 1024 if args.memory_limit else None
    row["limit_gib"] = round(limit, 1) if limit else None
    if limit and limit > usable:
        row["finding"] = f"--memory-limit {limit:.1f} GiB is more than the {usable:.1f} GiB a {card_gib} GB card gives"
    elif job.expect == "fits" and need > min(usable, limit or usable):
        row["finding"] = f"out of memory: needs {need:.1f} GiB per rank, {min(usable, limit or usable):.1f} GiB there"
    elif job.expect == "out of memory" and need <= (limit or usable):
        row["finding"] = f"fits ({need:.1f} GiB under {limit or usable:.1f}), but its cell expects it out of memory"
    return row


def _short(command: str) -> str:
    argv = shlex.split(command)
    groups = [(o, v) for o, v in option_groups(argv[1:]) if o not in ("--runs-dir", "--solution")]
    return " ".join([Path(argv[0]).name, *(" ".join([o, *v]) for o, v in groups)])


def plan(ranks: int = 4, card_gib: float = 80, sizes: dict | None = None, dtype: str = DTYPE,
         day: str = "day4") -> list[dict]:
    """Every Day-4 job at the notebook's parameters updated with `sizes` (default GPU_SIZES), on a node of `ranks`
    cards of `card_gib` GB each, computing in `dtype`: a row per job (check). `day` "day1", "day2", "day3" or "race":
    that notebook's jobs instead (classifier_plan.plan, after Day 1 kept the precision `dtype`)."""
    if day != "day4":
        return classifier_plan.plan(day, ranks, card_gib, sizes, precision=dtype)
    cpu = notebook_parameters()
    gpu = {**cpu, **(GPU_SIZES if sizes is None else sizes), "RANKS": ranks}
    cpu_jobs = day4_jobs(cpu, ranks=cpu["RANKS"], dtype="fp32")
    rows = []
    for job in day4_jobs(gpu, ranks, dtype):
        same = next((c for c in cpu_jobs if c.tp == job.tp and _script(c) == _script(job)), None)
        rows.append(check(job, card_gib, same))
    return rows


def _script(job: Job) -> str:
    return Path(shlex.split(job.command)[0]).name


def findings(rows: list[dict]) -> list[dict]:
    return [row for row in rows if row["finding"]]


DAYS = (*classifier_plan.DAYS, "day4")


def day_sizes(day: str, card_gib: float) -> dict:
    """The sizes to set for `day` on cards of `card_gib` (Day 4's smaller cards get SMALLER_CARDS)."""
    if day == "day4":
        return {**GPU_SIZES, **SMALLER_CARDS.get(card_gib, {})}
    return classifier_plan.GPU_SIZES[day]


def week(ranks: int = 4, card_gib: float = 80, dtype: str = DTYPE) -> list[dict]:
    """Every day's jobs at its sizes for this card (day_sizes), each row with its "day"."""
    rows = []
    for day in DAYS:
        sizes = day_sizes(day, card_gib)
        rows += [{"day": day, **row} for row in plan(sizes.get("RANKS", ranks), card_gib, sizes, dtype, day=day)]
    return rows


def sizes_table(ranks=(4, 8), cards=CARDS_GIB) -> str:
    """docs/instructors.md's table: per notebook and card, the sizes to set, the jobs, the findings (every precision,
    every node size: 0 when the day runs), the most a rank needs (fp32, the larger) and the jobs whose cell expects
    them out of memory (the batch scans' walls, TP4.2's DDP)."""
    lines = [f"| notebook | card | set these sizes | jobs ({' / '.join(map(str, ranks))} GPUs) | findings | most per rank "
             "(fp32) | out of memory by design (batch) |",
             "|---|---|---|---|---|---|---|"]
    for card in cards:
        runs = {(n, dtype): week(n, card, dtype) for n in ranks for dtype in DTYPES}
        for day in DAYS:
            rows = {key: [row for row in found if row["day"] == day] for key, found in runs.items()}
            worst = rows[(ranks[0], "fp32")]
            need = max((row for row in worst if row["need_gib"] is not None and row["expect"] == "fits"),
                       key=lambda row: row["need_gib"])
            walls = {}
            for row in worst:  # what a job may hold: the card's usable memory, or its --memory-limit (Day 4)
                room = min(row["usable_gib"], row.get("limit_gib") or row["usable_gib"])
                if row["expect"] != "fits" and row["need_gib"] and row["need_gib"] > room:
                    walls.setdefault(row["tp"], []).append(_option(row["job"], "--batch-size"))
            sizes = ", ".join(f"`{name} = {json.dumps(value)}`" for name, value in day_sizes(day, card).items())
            jobs = " / ".join(str(len(rows[(n, "fp32")])) for n in ranks)
            lines.append(f"| {day} | {card:g} GB | {sizes} | {jobs} | "
                         f"{sum(len(findings(r)) for r in rows.values())} | {need['need_gib']:.1f} GiB ({need['tp']}) | "
                         + ("; ".join(f"{tp}: {', '.join(sorted(set(b), key=int))}" for tp, b in walls.items()) or "none")
                         + " |")
    return "\n".join(lines)


def _option(short: str, option: str) -> str:
    words = short.split()
    return words[len(words) - 1 - words[::-1].index(option) + 1] if option in words else "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Every day's jobs at the GPU sizes: valid, and planned to fit")
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--card-gib", type=float, nargs="+", default=list(CARDS_GIB))
    parser.add_argument("--day", nargs="+", choices=DAYS, default=list(DAYS))
    parser.add_argument("--table", action="store_true", help="print docs/instructors.md's table of every day")
    args = parser.parse_args(argv)
    if args.table:
        print(sizes_table(tuple(args.ranks), tuple(args.card_gib)))
        return 0
    for ranks, card, dtype, day in [(r, c, d, n) for r in args.ranks for c in args.card_gib for d in DTYPES
                                    for n in args.day]:
        suggested = GPU_SIZES if day == "day4" else classifier_plan.GPU_SIZES[day]
        for label, sizes in [("GPU_SIZES", suggested)] + ([(f"SMALLER_CARDS[{card:g}]", day_sizes(day, card))]
                                                          if day == "day4" and card in SMALLER_CARDS else []):
            rows = plan(sizes.get("RANKS", ranks), card, sizes, dtype, day=day)
            print(f"\n{day}, {sizes.get('RANKS', ranks)} x {card:g} GB, {dtype}, {label}: {len(findings(rows))} "
                  f"finding(s) in {len(rows)} jobs")
            for row in rows:
                need = f"{row['need_gib']:6.1f}" if row["need_gib"] is not None else "     -"
                print(f"  {row['tp']}  {need} GiB  {row['finding'] or 'ok'}  <- {row['job']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
