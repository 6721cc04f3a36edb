"""Day 4: FSDP2 with torch.compile against FSDP2 eager, the same command but --compile.

    compiled_vs_eager(["1234", "1236"], ["1235", "1237"])   # eager runs, compiled runs (alternated repeats)

train_llm.py --compile compiles each transformer block (one compilation serves every identical block) before
FSDP2 shards it, as torchtitan orders them. The first step pays the compilation (a repeat finds the kernels in the
user's compile cache); the steady steps are the median after the warm-up the step times show
(dlokit.analysis.stats.step_values). The speed-up is eager's step time over the compiled one's, with its 95 %
interval over the runs when each command ran twice or more (two runs of one command differ more than one run's
steps: one run each read ×1.12 [0.93–1.37], then ×1.32 [1.02–1.53]).
"""
from __future__ import annotations

import pandas as pd

from dlokit.analysis import stats
from dlokit.analysis.run import load_runs

COLUMNS = ("run_id", "compiled", "state", "first_step_s", "steady_step_ms", "steady_low_ms", "steady_high_ms",
           "steady_steps", "last_loss")


def _row(run) -> dict:
    first = pd.to_numeric(run.steps.get("t_step", pd.Series(dtype=float)), errors="coerce").dropna()
    steady = stats.estimate_of_samples([stats.step_values(run, "t_step")])
    return {"run_id": run.run_id, "compiled": bool(run.config.get("compile")), "state": run.state,
            "first_step_s": float(first.iloc[0]) if len(first) else None,
            "steady_step_ms": 1000 * steady.value, "steady_low_ms": 1000 * steady.low,
            "steady_high_ms": 1000 * steady.high, "steady_steps": steady.steps,
            "last_loss": run.summary.get("last_loss")}


def compiled_vs_eager(eager_jobs, compiled_jobs, runs_dir=None) -> pd.DataFrame:
    """One row per run: its first step (a compiled run's includes the compilation), its steady step time with its
    interval, its last loss. attrs["speedup"]: eager's steady step time over the compiled one's (stats.Estimate)."""
    eager, compiled = load_runs(eager_jobs, runs_dir), load_runs(compiled_jobs, runs_dir)
    table = pd.DataFrame([_row(run) for run in [*eager, *compiled]], columns=COLUMNS)
    table.attrs["speedup"] = stats.ratio(compiled, eager, "t_step")
    table.attrs["basis"] = (f"one row per run; the steady step: the median of its settled steps, with its 95 % "
                            f"interval; speed-up, compiled against eager: {table.attrs['speedup'].long_text()}"
                            if table.attrs["speedup"].runs else "one row per run; the steady step: the median of its "
                            "settled steps, with its 95 % interval")
    return table
