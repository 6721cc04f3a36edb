"""Day 4 checks: memory per rank under ZeRO-1 and FSDP (TP4.1), FSDP2 sharding the model, DDP out of memory
where FSDP fits and the largest batch of each (TP4.2), the pipeline bubble (TP4.3), tensor parallelism from
scratch (TP4.4), ring attention (TP4.5), loss match (TP4.6), DeepSpeed's ZeRO stages (TP4.8: checks.day4.deepspeed_zero), the planner's pick against
the measured fastest (TP4.9)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .framework import FAILED, INFO, NOT_APPLICABLE, NOT_APPLICABLE_PREFIX, PASSED, Part, check, failed, from_parts, not_applicable, part, passed, three_digits
from .records import ids, load, load_last

SHARDED = 0.75  # a sharded state per rank must be under this share of DDP's (ideal: 1/N, minus unsharded bits)


def _memory(run) -> dict | None:
    """The busiest rank's measured bytes (train_llm.py summary `memory_bytes`)."""
    found = [(r.get("summary") or {}).get("memory_bytes") for r in run.ranks.values()]
    found = [m for m in found if isinstance(m, dict) and m.get("params") is not None]
    return max(found, key=lambda m: sum(float(m.get(k) or 0) for k in ("params", "grads", "optimizer"))) if found else None


def _completed(job_ids):
    runs = []
    for job_id in ids(job_ids):
        run, problem = load(job_id)
        if problem:
            return runs, failed(problem)
        runs.append(run)
    return runs, (None if runs else failed("no job id given: pass the ids the submission cell returned"))


@check("TP4.1 memory per rank")
def sharded_memory(ddp_id, zero1_id, fsdp_id):
    """Measured from the tensors each rank holds: ZeRO-1 shards the optimizer states (each rank under SHARDED of
    DDP's), FSDP shards parameters, gradients and optimizer states alike."""
    runs, problem = _completed([ddp_id, zero1_id, fsdp_id])
    if problem:
        return problem
    ddp, zero1, fsdp = (_memory(r) for r in runs)
    if None in (ddp, zero1, fsdp):
        return failed("a run recorded no memory_bytes: were they made by train_llm.py?")
    ranks = runs[1].world_size
    details = [f"{name} (run {run.run_id}, {run.world_size} ranks): " + ", ".join(
        f"{k} {float(m.get(k) or 0) / 2**20:.2f} MiB" for k in ("params", "grads", "optimizer"))
        for name, run, m in zip(("ddp", "zero1", "fsdp"), runs, (ddp, zero1, fsdp))]

    def share(mine, keys):
        return sum(float(mine.get(k) or 0) for k in keys) / max(1.0, sum(float(ddp.get(k) or 0) for k in keys))

    zero_share, fsdp_share = share(zero1, ["optimizer"]), share(fsdp, ["params", "grads", "optimizer"])
    zero = part("ZeRO-1", PASSED if zero_share < SHARDED else FAILED,
                f"optimizer states per rank: {zero_share:.2f} of DDP's on {ranks} ranks (ideal 1/{ranks})"
                + ("" if zero_share < SHARDED else " — the optimizer is not sharded: build ZeroRedundancyOptimizer "
                   "for --mode zero1 (TODO TP4.1 in zero1_optimizer.py)"))
    shard = part("FSDP", PASSED if fsdp_share < SHARDED else FAILED,
                 f"parameters + gradients + optimizer states per rank: {fsdp_share:.2f} of DDP's (ideal 1/{ranks})"
                 + ("" if fsdp_share < SHARDED else f" — {FSDP_TODO}"))
    return from_parts([zero, shard], f"ZeRO-1 keeps {zero_share:.2f} of DDP's optimizer states per rank, FSDP "
                      f"{fsdp_share:.2f} of everything", details)


FSDP_TODO = "call fully_shard on each block of model.layers, then on the model (TODO TP4.2 in parallel_fsdp.py)"


def _weights_held(runs, single) -> tuple[float, list[float]]:
    """(the single process's weights in bytes, the weights every rank of `runs` holds in bytes), measured from their
    tensors (train_llm.py summary `memory_bytes`); 0 where a record has none."""
    whole = float((_memory(single) or {}).get("params") or 0)
    held = [float(((r.get("summary") or {}).get("memory_bytes") or {}).get("params") or 0)
            for run in runs for _, r in sorted(run.ranks.items())]
    return whole, held


@check("TP4.2 FSDP2 shards the model")
def fsdp_sharding(fsdp_id, single_id):
    """Observed, not assumed: each rank of the FSDP2 run holds its shard of the weights (about 1/N of what the
    single process holds, measured from its tensors), and its loss follows the single process's step by step."""
    from dlokit.analysis.loss_match import loss_match_table

    runs, problem = _completed(list(ids(fsdp_id)) + list(ids(single_id)))
    if problem:
        return problem
    fsdp, single = runs
    whole, weights = _weights_held([fsdp], single)
    held = dict(zip(sorted(fsdp.ranks), weights))
    if not whole or not all(held.values()):
        return failed("a run recorded no memory_bytes: were they made by train_llm.py --mode fsdp and --mode single?")
    shares = {rank: value / whole for rank, value in held.items()}
    ideal = 1 / fsdp.world_size
    details = [f"rank {rank}: {value / 2**20:.2f} MiB of weights, {shares[rank]:.2f} of the single process's "
               f"{whole / 2**20:.2f} MiB" for rank, value in held.items()]
    sharded = all(share < SHARDED for share in shares.values())
    shard = part("sharding", PASSED if sharded else FAILED,
                 f"each rank holds {', '.join(f'{v:.2f}' for v in shares.values())} of the weights (ideal {ideal:.2f})"
                 + ("" if sharded else f" — every rank keeps the whole model: {FSDP_TODO}"))
    table = loss_match_table([fsdp], single)
    row = table.iloc[0]
    gap = "no step in common" if pd.isna(row.max_abs_dloss) else f"max |Δ| {row.max_abs_dloss:.3g}"
    details.append(f"loss against the single process: {gap} over {row.steps_compared} steps "
                   f"(tolerance {table.attrs['tolerance']:g} for {table.attrs['dtype']})")
    why = "" if sharded else f": without sharding nothing averages the ranks' gradients — {FSDP_TODO}"
    same = part("loss", PASSED if row.matched else FAILED,
                f"the loss follows the single process's over {row.steps_compared} steps" if row.matched else
                f"the loss leaves the single process's ({gap}){why}")
    return from_parts([shard, same], f"FSDP2 on {fsdp.world_size} ranks: {shard.message}; {same.message}", details)


@check("TP4.2 FSDP2 + compile")
def fsdp_compile(eager_ids, compiled_ids, single_id):
    """Observed: the first compiled run compiled its blocks (its first step, which compiles, took longer than its
    steady steps), every compiled run still holds a shard of the weights per rank (against the single process's
    whole), and the first compiled run's loss follows the first eager FSDP2 run's step by step (compilation changes
    the rounding only)."""
    from dlokit.analysis.llm_compile import compiled_vs_eager
    from dlokit.analysis.loss_match import loss_match_table

    eager_ids, compiled_ids = list(ids(eager_ids)), list(ids(compiled_ids))
    runs, problem = _completed(eager_ids + compiled_ids + list(ids(single_id)))
    if problem:
        return problem
    eager, compiled, single = runs[:len(eager_ids)], runs[len(eager_ids):-1], runs[-1]
    if not eager or not compiled:
        return failed("pass the eager FSDP2 run(s), then the compiled one(s)")
    if not all(run.config.get("compile") for run in compiled):
        return failed(f"a run of {', '.join(compiled_ids)} was not started with --compile")
    table = compiled_vs_eager([r.run_id for r in eager], [r.run_id for r in compiled], single.path.parent)
    details = [f"{'compiled' if row.compiled else 'eager'} (run {row.run_id}): first step {row.first_step_s:.2f} s, "
               f"steady {row.steady_step_ms:.1f} ms [{row.steady_low_ms:.1f}–{row.steady_high_ms:.1f}]"
               for row in table.itertuples()]
    first_run = table[table["compiled"]].iloc[0]
    first, steady = first_run["first_step_s"], first_run["steady_step_ms"] / 1000
    paid = first is not None and steady > 0 and first > 2 * steady
    compile_part = part("compiled", PASSED if paid else FAILED,
                        f"its first step took {first:.2f} s, {first / steady:.0f}× a steady one: the compilation, "
                        "timed apart" if paid else "its first step was no slower than the others: nothing compiled")
    whole, held = _weights_held(compiled, single)
    if not whole or not all(held):
        return failed("a run recorded no memory_bytes: were they made by train_llm.py --mode fsdp and --mode single?",
                      details)
    sharded = all(value / whole < SHARDED for value in held)
    shares = sorted({f"{value / whole:.2f}" for value in held})
    span = " to ".join(dict.fromkeys([shares[0], shares[-1]]))  # "0.50", or "0.50 to 0.52"
    shard = part("sharding", PASSED if sharded else FAILED,
                 f"each rank of the {len(compiled)} compiled run(s) holds {span} of the weights (ideal "
                 f"{1 / compiled[0].world_size:.2f})"
                 + ("" if sharded else f" — every rank keeps the whole model: {FSDP_TODO}"))
    match = loss_match_table(compiled[:1], eager[0]).iloc[0]
    gap = "no step in common" if pd.isna(match.max_abs_dloss) else f"max |Δ| {match.max_abs_dloss:.3g}"
    same = part("loss", PASSED if match.matched else FAILED,
                f"the loss follows the eager FSDP2 run's over {match.steps_compared} steps ({gap})" if match.matched
                else f"the loss leaves the eager FSDP2 run's ({gap})")
    return from_parts([compile_part, shard, same], f"{compile_part.message}; {shard.message}; {same.message}",
                      details)


@check("TP4.2 DDP out of memory, FSDP fits")
def oom_then_fit(ddp_id, fsdp_id):
    """Under the same memory limit the DDP job ran out of memory (recorded as such) and the FSDP job completed."""
    (ddp_id,), (fsdp_id,) = ids(ddp_id), ids(fsdp_id)
    from dlokit.analysis import load_run
    from dlokit.submission.jobs import job_outcome
    from dlokit.submission.profiles import current_profile

    ddp, fsdp = (load_run(i, current_profile().runs) for i in (ddp_id, fsdp_id))
    ddp_state = job_outcome(ddp_id).state
    details = [f"DDP job {ddp_id}: {ddp_state}, record {ddp.state}", f"FSDP job {fsdp_id}: {job_outcome(fsdp_id).state}, "
               f"record {fsdp.state}"]
    limit, used = fsdp.summary.get("memory_limit_mb"), _memory(fsdp)
    if limit and used:
        tensors = sum(float(used.get(k) or 0) for k in ("params", "grads", "optimizer", "activations_peak",
                                                       "gathered_params_peak")) / 2**20
        details.append(f"each rank's limit {limit:.0f} MiB; FSDP's tensors used {tensors:.0f} MiB of it at most "
                       f"({limit / tensors:.2f}x room)")
    if not (ddp.oom or ddp_state == "OUT_OF_MEMORY"):
        return failed(f"the DDP job {ddp_id} did not run out of memory ({ddp_state}): the limit is too large for this "
                      "model, or the model too small — use the notebook's OOM_CONFIG and OOM_LIMIT", details)
    if fsdp.state != "completed":
        return failed(f"the FSDP job {fsdp_id} did not complete ({fsdp.state}) under the same limit: each rank "
                      f"must hold only its shard — {FSDP_TODO}", details)
    return passed("DDP ran out of memory, FSDP completed under the same limit"
                  + (f" ({fsdp.summary['memory_limit_mb']:.0f} MiB per rank)" if fsdp.summary.get("memory_limit_mb") else ""),
                  details)


@check("TP4.2 batch scan, DDP against FSDP2")
def layout_scan(ddp_ids, fsdp_ids):
    """Observed under one memory limit per rank: DDP fits some batches of the scan and runs out of memory at a larger
    one (the limit bites), FSDP2's runs hold a shard of the weights per rank (measured from their tensors), and the
    largest batch FSDP2 fits is larger than DDP's. A run that ended any other way fails the check."""
    from dlokit.analysis.layout_scan import describe, largest_batches, scan_table

    runs = []
    for job_id in list(ids(ddp_ids)) + list(ids(fsdp_ids)):
        run, problem = load(job_id)
        if problem and not run.oom:  # running out of memory is what a scan's run may do
            return failed(problem)
        runs.append(run)
    n_ddp = len(ids(ddp_ids))
    if not n_ddp or len(runs) == n_ddp:
        return failed("pass the DDP runs of the scan, then the FSDP2 ones")
    table = scan_table(runs[:n_ddp], runs[n_ddp:])  # the records loaded above, not read again
    found = largest_batches(table)
    details = [f"{r.layout} batch {r.batch} ({r.batch_per_rank} per rank): {r.outcome}"
               + (f", {r.measured_mb:.0f} MiB per rank measured" if pd.notna(r.measured_mb) else "")
               + (f", {r.modelled_mb:.0f} modelled" if pd.notna(r.modelled_mb) else "") for r in table.itertuples()]
    other = found["ddp"]["other"] + found["fsdp"]["other"]
    if other:
        return failed(f"run(s) {', '.join(other)} ended neither completed nor out of memory: read their logs "
                      "(dlokit.search_log)", details)
    limits = sorted(set(table["limit_mb"].dropna()))
    if len(limits) != 1:
        return failed(f"the runs did not share one --memory-limit (found {limits or 'none'}): scan both layouts under "
                      "the same limit", details)
    ddp, fsdp = found["ddp"], found["fsdp"]
    if ddp["batch"] is None or not ddp["bracketed"]:
        return failed(f"under {limits[0]:.0f} MiB per rank DDP fitted "
                      + ("no batch of the scan: the limit is too small" if ddp["batch"] is None else
                         "every batch of the scan: the limit is too large")
                      + " — leave SCAN_LIMIT_MB = None (the memory model places it)", details)
    fitted = table[table["outcome"] == "fits"]
    whole = fitted.loc[fitted["layout"] == "ddp", "run_id"].iloc[0]
    ddp_run = next(r for r in runs if r.run_id == whole)
    fsdp_runs = [r for r in runs[n_ddp:] if r.run_id in set(fitted["run_id"])]
    if not fsdp_runs:
        return failed(f"no FSDP2 run fitted under {limits[0]:.0f} MiB per rank, where DDP fitted a batch of "
                      f"{ddp['batch']}: {FSDP_TODO}", details)
    weights, held = _weights_held(fsdp_runs, ddp_run)
    if not weights or not all(held):
        return failed("a run recorded no memory_bytes: were they made by train_llm.py?", details)
    share = max(held) / weights
    if share >= SHARDED:
        return failed(f"each FSDP2 rank holds {share:.2f} of the weights a DDP rank holds: nothing is sharded — "
                      f"{FSDP_TODO}", details)
    if fsdp["batch"] <= ddp["batch"]:
        return failed(f"under {limits[0]:.0f} MiB per rank FSDP2 fitted no larger batch than DDP: {describe(found)}",
                      details)
    return passed(f"under {limits[0]:.0f} MiB per rank, {describe(found)}: FSDP2 trains a batch DDP cannot, each "
                  f"rank holding {share:.2f} of the weights",
                  details)


@check("TP4.3 pipeline bubble")
def pipeline_bubble(job_ids):
    """The GPipe runs' measured bubble falls as the micro-batches grow, as (p−1)/(m+p−1) says: read from the data,
    the bubble at the most micro-batches against the fewest, and every count against the fewest said as it went
    (falls, rises, within noise: the interval of the ratio of their per-step bubbles)."""
    runs, problem = _completed(job_ids)
    if problem:
        return problem
    from dlokit.analysis import stats
    from dlokit.analysis.pipeline import _busiest_steps, bubble_table, bubble_trend

    table = bubble_table(runs).sort_values("m")
    details = [f"m={r.m}: measured {r.bubble_measured:.2f} [{r.bubble_low:.2f}–{r.bubble_high:.2f}], theory "
               f"{r.bubble_theory:.2f}" for r in table.itertuples()]
    if len(table) < 2:
        return failed("need GPipe runs with at least two micro-batch counts", details)
    ordered = sorted(runs, key=lambda r: int(r.summary.get("pp_microbatches") or r.config.get("microbatches") or 1))
    overall = stats.ratio_of_samples([_busiest_steps(ordered[0])], [_busiest_steps(ordered[-1])])
    trend = bubble_trend(ordered)
    steps = f"against m={trend['m_from'].iloc[0]}: " + "; ".join(
        f"m={t.m_to} {t.trend} (×{t.ratio:.2f} [{t.ratio_low:.2f}–{t.ratio_high:.2f}], theory ×{t.theory_ratio:.2f})"
        for t in trend.itertuples()) if len(trend) else "one micro-batch count"
    first, last = table.iloc[0], table.iloc[-1]
    span = (f"from {first.bubble_measured:.2f} [{first.bubble_low:.2f}–{first.bubble_high:.2f}] (m={first.m}) to "
            f"{last.bubble_measured:.2f} [{last.bubble_low:.2f}–{last.bubble_high:.2f}] (m={last.m})")
    details.append(steps)
    if overall.usable and overall.high < 1:
        return passed(f"the bubble falls {span}; {steps}", details)
    busy = _busy_machine(runs)
    if busy:  # idle time measured on cores that other work was using is not the pipeline's bubble
        return not_applicable(f"{busy}: the stages' idle time was not theirs to measure; run these jobs "
                              "again on an idle machine", details)
    return failed(f"the measured bubble did not fall {span} (ratio ×{overall.value:.2f} [{overall.low:.2f}–"
                  f"{overall.high:.2f}]); {steps}", details)


def _busy_machine(runs) -> str | None:
    """'other work kept N % of run X's cores busy' for the first run whose cores were not its own (see
    dlokit.analysis.overlap.foreign_cpu_share; the load average lags a short run by a minute)."""
    from dlokit.analysis.overlap import busy, foreign_cpu_share

    for run in runs:
        share = foreign_cpu_share(run)
        if busy(share):
            return f"other work kept {100 * share:.0f} % of run {run.run_id}'s cores busy"
    return None


def _self_check(job_id, line_kind: str, todo: str):
    run, problem = load_last(job_id)
    if problem:
        return problem
    lines = run.lines(line_kind)
    details = [f"{r.get('version', r.get('attention', '?'))}: ok {r.get('ok')}, max |Δ| output "
               f"{three_digits(r.get('max_abs_diff_output'))}" for r in lines.to_dict("records")]
    if lines.empty:
        return failed(f"run {run.run_id} recorded no {line_kind} line", details)
    bad = lines[~lines["ok"].astype(bool)]
    if len(bad):
        row = bad.iloc[0].to_dict()
        return failed(f"{row.get('version', row.get('attention', 'a version'))} does not match the single-process layer "
                      f"(max |Δ| output {three_digits(row.get('max_abs_diff_output'))}) ({todo})", details)
    return passed(f"{len(lines)} version(s) match the single-process layer, with the expected collectives", details)


@check("TP4.4 tensor parallel")
def tensor_parallel(job_id):
    """check_tp.py: each version (from scratch, DTensor, sequence parallel) gives the single-process layer's output
    and gradients, with one all-reduce per pair of linears each way."""
    return _self_check(job_id, "tp_check", "TODO TP4.4 in parallel_tp_scratch.py")


@check("TP4.5 context parallel")
def context_parallel(job_id):
    """check_cp.py: ring attention gives full attention's output and gradients."""
    return _self_check(job_id, "cp_check", "TODO TP4.5 in parallel_cp.py: the online-softmax merge")


@check("TP4.6 loss match")
def loss_match(job_ids, reference):
    """Every parallel run's loss matches the single process's, step by step."""
    from dlokit.analysis.loss_match import loss_match_table

    runs, problem = _completed(list(ids(job_ids)) + list(ids(reference)))
    if problem:
        return problem
    table = loss_match_table(runs[:-1], runs[-1])
    details = [f"{r.mode} ({r.world_size} ranks): max |Δloss| "
               + ("none (no step in common)" if pd.isna(r.max_abs_dloss) else f"{r.max_abs_dloss:.3g}")
               for r in table.itertuples()]
    wrong = table[~table["matched"]]
    tolerance = f"{table.attrs['tolerance']:g} for {table.attrs['dtype']}"
    if len(wrong):
        return failed(f"{', '.join(wrong['mode'])} does not match the single process (tolerance {tolerance})"
                      + _yours(list(wrong["mode"])), details)
    return passed(f"{len(table)} parallel runs match the single process within {tolerance}", details)


def _yours(modes: list[str]) -> str:
    """The TODOs whose code the mismatched runs ran ("fsdp ×2" -> TP4.2's), for loss_match's message."""
    todos = list(dict.fromkeys(MODE_TODOS[m.split(" ")[0]] for m in modes if m.split(" ")[0] in MODE_TODOS))
    return f": {'they run' if len(modes) > 1 else 'it runs'} your code of {', '.join(todos)}" if todos else ""


# the layouts whose parallel code a student writes (loss_match names the TODO a mismatch points to)
MODE_TODOS = {"zero1": "TODO TP4.1 (zero1_optimizer.py)", "fsdp": "TODO TP4.2 (parallel_fsdp.py)",
              "hsdp": "TODO TP4.2 (parallel_fsdp.py)", "fsdp-tp": "TODO TP4.2 (parallel_fsdp.py)",
              "tp-scratch": "TODO TP4.4 (parallel_tp_scratch.py)", "cp": "TODO TP4.5 (parallel_cp.py)"}


DEEPSPEED_TODO = "TODO TP4.8 in train_deepspeed.py"


def _deepspeed_stage(run) -> tuple[int, int]:
    """(the stage the run was asked for, --zero-stage; the stage its JSON config gave DeepSpeed)."""
    asked = int(run.config.get("zero_stage") or 0)
    given = ((run.config.get("ds_config") or {}).get("zero_optimization") or {}).get("stage")
    return asked, int(given or 0)


def _deepspeed_part(run, single_memory) -> tuple[Part, list[str]]:
    """One stage's run against the single process's tensors: each rank's optimizer states (AdamW's m and v, with
    DeepSpeed's fp32 master copy) from stage 1, its gradients at their peak from stage 2, its weights at stage 3, each
    under SHARDED of what one process holds of it."""
    stage, given = _deepspeed_stage(run)
    whole = {"params": float(single_memory.get("params") or 0), "grads": float(single_memory.get("grads") or 0),
             "optimizer": 1.5 * float(single_memory.get("optimizer") or 0)}  # m and v (8 bytes a weight) + the master (4)
    ranks = [m for r in run.ranks.values() if isinstance(m := (r.get("summary") or {}).get("memory_bytes"), dict)]
    label = f"ZeRO-{stage}"
    if not ranks:
        return part(label, FAILED, f"run {run.run_id} recorded no memory_bytes: was it train_deepspeed.py?"), []
    shares = {key: max(float(m.get(key) or 0) for m in ranks) / max(1.0, whole[key]) for key in whole}
    details = [f"{label} (run {run.run_id}, {run.world_size} ranks, DeepSpeed stage {given}): per rank at most "
               + ", ".join(f"{key} {share:.2f}" for key, share in shares.items())
               + " of one process's (optimizer: AdamW's m and v with an fp32 copy of the weights)"]
    if shares["optimizer"] == 0:
        return part(label, FAILED, f"{label}: no rank holds optimizer states: the engine never stepped — call "
                                   f"engine.backward(loss) and engine.step() ({DEEPSPEED_TODO})"), details
    sharded = [key for key, first in (("optimizer", 1), ("grads", 2), ("params", 3)) if stage >= first]
    whole_still = [key for key in sharded if shares[key] >= SHARDED]
    if given != stage or whole_still:
        return part(label, FAILED, f"{label}: each rank keeps {', '.join(whole_still) or 'everything'} whole "
                                   f"(DeepSpeed was given stage {given}): set the stage in ds_config's "
                                   f"zero_optimization ({DEEPSPEED_TODO})"), details
    return part(label, PASSED, f"{label}: each rank holds "
                + ", ".join(f"{shares[key]:.2f} of the {key}" for key in sharded) + " of one process's"), details


@check("TP4.8 DeepSpeed ZeRO")
def deepspeed_zero(stage_ids, single_id):
    """Observed: each DeepSpeed run (train_deepspeed.py, ZeRO stage 1, 2 or 3) shards what its stage says, measured
    from the tensors of every rank against the single process's (ZeRO-1 the optimizer states, ZeRO-2 the gradients
    too, ZeRO-3 the weights too), and its loss follows the single process's step by step. A run DeepSpeed could not
    start here (recorded as skipped) makes the check not applicable, with the reason."""
    from dlokit.analysis import load_run
    from dlokit.analysis.loss_match import loss_match_table
    from dlokit.submission.profiles import current_profile

    stage_ids = list(stage_ids.values()) if isinstance(stage_ids, dict) else list(ids(stage_ids))
    skipped = [run for run in (load_run(i, current_profile().runs) for i in ids(stage_ids)) if run.state == "skipped"]
    if skipped:
        reason = (skipped[0].summary or {}).get("reason") or skipped[0].describe_state()
        return not_applicable(f"DeepSpeed did not start here: {reason}")
    runs, problem = _completed(list(ids(stage_ids)) + list(ids(single_id)))
    if problem:
        return problem
    single, runs = runs[-1], runs[:-1]
    single_memory = _memory(single)
    if not single_memory:
        return failed(f"the single-process run {single.run_id} recorded no memory_bytes: was it train_llm.py?")
    parts, details = [], []
    for run in runs:
        shard, lines = _deepspeed_part(run, single_memory)
        parts.append(shard)
        details += lines
    table = loss_match_table(runs, single)
    for row, run in zip(table.itertuples(), runs):
        gap = "no step in common" if pd.isna(row.max_abs_dloss) else f"max |Δ| {row.max_abs_dloss:.3g}"
        details.append(f"{row.mode}: loss against the single process, {gap} over {row.steps_compared} steps "
                       f"(tolerance {table.attrs['tolerance']:g} for {table.attrs['dtype']})")
        if not row.matched:
            parts.append(part(f"{row.mode} loss", FAILED, f"{row.mode}: the loss leaves the single process's ({gap}): "
                              f"the engine's backward averages the ranks' gradients, its step updates the weights "
                              f"({DEEPSPEED_TODO})"))
    stages = ", ".join(p.name for p in parts if p.status == PASSED)
    return from_parts(parts, f"{stages}: each shards what its stage says, and follows the single process's loss",
                      details)


@check("TP4.9 the planner's pick")
def planner_pick(job_ids, chosen):
    """Measured: the layout the planner ranks fastest (the first of `chosen`, layout_planner.candidates, in the order its
    jobs were submitted) is the fastest of the layouts run, within noise: no other layout's steps are shorter beyond
    the 95 % interval of the ratio (stats.ratio: over the runs of each layout when `job_ids` holds several rounds,
    day.layout_runs with `repeats`; one run each: its steps' interval widened by this machine's run-to-run spread). The layout it predicts slow (the last) is either measured slower, or the check says plainly that this
    machine cannot tell them apart. Both sentences keep their words from one course run to the next; the numbers are in
    the parts."""
    from dlokit.analysis.plan_check import by_layout, slowest_against_pick
    from dlokit.analysis.stats import ratio

    done, problem = _completed(job_ids)
    if problem:
        return problem
    names = list(chosen["layout"])
    runs = by_layout(chosen, done)  # each layout's runs, every round
    if len(names) < 2 or not runs:
        return failed(f"pass the jobs of layout_planner.candidates' {len(names)} layouts, in its order, a round or "
                      f"more (day.layout_runs; got {len(done)} jobs)")
    steps = [_step_estimate(group) for group in runs]
    if None in steps:
        return failed("a run has no settled step to time: give its jobs more --steps (PLAN_STEPS)")
    details = [f"{name}: predicted {1e3 * float(p):.2f} ms a step, measured {_ms(s, group)}"
               for name, p, s, group in zip(names, chosen["step_s"], steps, runs)]
    fastest = min(range(len(runs)), key=lambda i: steps[i].value)
    pick = names[0]
    if fastest == 0:
        within, how = True, f"{pick} measured fastest, {1e3 * steps[0].value:.1f} ms a step"
    else:
        r = ratio(runs[fastest], runs[0], "t_step")
        within = r.usable and r.low <= 1
        how = f"{pick}'s step against {names[fastest]}'s: {r.text()} ({r.basis_text})"
    # At the CPU course's sizes a step is bound by launches and by each collective's fixed cost, which the model
    # (FLOPs at the measured peak, bytes at the measured bus bandwidth) leaves out: there, the pick may lose.
    first = part("fastest", PASSED if within else NOT_APPLICABLE,
                 f"the planner's pick, {pick}, is the fastest layout measured, within noise ({how})" if within else
                 f"{NOT_APPLICABLE_PREFIX}{names[fastest]} measured faster than the planner's pick, {pick} ({how}): "
                 "at these sizes a step is bound by each operation's launch and each collective's fixed cost, which "
                 "the step model leaves out (the notes under the comparison table)")
    slow_ratio = slowest_against_pick(runs)
    predicted = float(chosen["step_s"].iloc[-1]) / float(chosen["step_s"].iloc[0])
    slower = slow_ratio.usable and slow_ratio.low > 1
    second = part("predicted slow", PASSED if slower else INFO,
                  f"{names[-1]}, predicted ×{predicted:.1f} the pick's step, measured {slow_ratio.text()} of it"
                  if slower else f"this machine cannot tell {names[-1]} from {pick} apart: predicted ×{predicted:.1f} "
                  f"the pick's step, measured {slow_ratio.text()} ({slow_ratio.basis_text})")
    message = (f"the planner's pick, {pick}, is the fastest layout measured, within noise" if within else
               f"the layout the planner predicts slow, {names[-1]}, measured slower than its pick, {pick}; the pick is "
               "not the fastest here (➖ fastest)")
    return from_parts([first, second], message, details)


def _ms(value, runs) -> str:
    """One run: its median step with the steps' interval. Several: their mean and each run's median, since a t-interval
    over two or three runs (one or two degrees of freedom) reads e.g. 45.4 [0.8–2662.5] ms, true and of no use."""
    from dlokit.analysis.stats import step_values

    if value.runs < 2:
        return f"{1e3 * value.value:.1f} [{1e3 * value.low:.1f}–{1e3 * value.high:.1f}] ms"
    each = ", ".join(f"{1e3 * float(np.median(v)):.1f}" for v in (step_values(r, "t_step") for r in runs) if len(v))
    return f"{1e3 * value.value:.1f} ms (geometric mean of {value.runs} runs: {each} ms)"


def _step_estimate(runs):
    from dlokit.analysis.stats import estimate

    value = estimate(runs, "t_step")
    return value if math.isfinite(value.value) else None


@check("TP4.9 bus bandwidth")
def bus_bandwidth(job_id):
    """Observed in comm_bench.py's record: each repeat's time is the slowest rank's (equal on every rank of the group,
    and no shorter than the rank's own), as nccl-tests times a collective; then the bus bandwidth it reads."""
    from dlokit.analysis.bus_bandwidth import bandwidth_table

    run, problem = load_last(job_id)
    if problem:
        return problem
    lines = pd.concat([run.lines("collective", rank).assign(rank=rank) for rank in sorted(run.ranks)], ignore_index=True)
    if lines.empty or "own_s" not in lines:
        return failed("the run timed no collective: was it comm_bench.py, without --measure peak?")
    spread = lines.groupby(["op", "ranks", "bytes", "repeat"])["time_s"].agg(lambda t: t.max() - t.min())
    apart = int((spread > 0).sum())
    shorter = int((lines["time_s"] < lines["own_s"]).sum())
    table = bandwidth_table(run)
    largest = table[table["bytes"] == table["bytes"].max()]
    details = [f"{r.op} on {r.ranks} ranks, {r.bytes / 2**20:g} MiB: busbw {r.busbw_gbs:.3g} [{r.busbw_low:.3g}–"
               f"{r.busbw_high:.3g}] GB/s" for r in largest.itertuples()]
    if apart or shorter:
        return failed(f"{apart} of {len(spread)} collectives have a different time on each rank: each rank timed "
                      "itself, but a collective has ended only when its slowest rank has — take the maximum of the "
                      "ranks' times (TODO TP4.9 in comm_bench.py)", details)
    return passed(f"every time is the slowest rank's ({len(spread)} collectives on {run.world_size} ranks); at "
                  f"{largest['bytes'].max() / 2**20:g} MiB the bus bandwidth reads "
                  + ", ".join(f"{r.op} {r.busbw_gbs:.3g} GB/s" for r in largest.itertuples()), details)


ACCELERATE_TRIED = "1.15.0"  # issue 51, on this kit's 2-core CPU: its FSDP and DeepSpeed plugins did not shard there


def accelerate_config(stage: int, processes: int, dtype: str) -> dict:
    """Accelerate's config file (`accelerate launch --config_file`, JSON) for DeepSpeed's ZeRO `stage` through its
    DeepSpeed plugin on one node of `processes` GPUs, as `accelerate config` writes one."""
    return {"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED",
            "deepspeed_config": {"zero_stage": stage, "offload_optimizer_device": "none", "offload_param_device": "none",
                                 "zero3_init_flag": stage == 3, "gradient_accumulation_steps": 1},
            "mixed_precision": "bf16" if dtype == "bf16" else "no", "num_machines": 1, "num_processes": processes,
            "machine_rank": 0, "main_training_function": "main", "use_cpu": False}


@check("TP4.8 Accelerate's ZeRO")
def accelerate_zero(stage_ids):
    """Accelerate's config for each ZeRO stage TP4.8 ran (its processes, its precision), written beside that run's
    record, and the command that would run it. Not applicable where Accelerate would not shard: its DeepSpeed and FSDP
    plugins shard on GPUs only (on a CPU, accelerate ACCELERATE_TRIED runs plain DDP), and accelerate is no dependency
    of the kit. Nothing is run here, so no number is shown."""
    import importlib.metadata
    import json
    import os

    runs, problem = _completed(list(stage_ids.values()) if isinstance(stage_ids, dict) else stage_ids)
    if problem:
        return problem
    details = []
    for run in runs:
        stage = _deepspeed_stage(run)[0]
        path = run.path / "accelerate_config.json"
        text = json.dumps(accelerate_config(stage, run.world_size, str(run.config.get("dtype"))), indent=1)
        spare = path.with_name(f".{path.name}.{os.getpid()}")
        spare.write_text(text)
        os.replace(spare, path)  # replaces a link in its place, never writes through it
        details.append(f"ZeRO-{stage} (TP4.8's run {run.run_id}, {run.world_size} processes): accelerate launch "
                       f"--config_file {path} your_script.py   # {' '.join(text.split())}")
    try:
        version = importlib.metadata.version("accelerate")
    except importlib.metadata.PackageNotFoundError:
        version = None
    missing = "accelerate is not installed here (not a dependency of the kit)"
    if not any(run.on_gpu for run in runs):
        return not_applicable(f"TP4.8's runs had no GPU, and on a CPU accelerate ({ACCELERATE_TRIED} tried) runs "
                              "plain DDP: its DeepSpeed and FSDP plugins shard only on GPUs"
                              + (f"; and {missing}" if version is None else ""), details)
    return not_applicable(("Accelerate would shard on these GPUs, but " + missing if version is None else
                           f"accelerate {version} is installed, but the kit has no training script written for it")
                          + ": the configs below are written, the command beside each would run it", details)
