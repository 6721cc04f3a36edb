"""The planner's parts on synthetic inputs: bus bandwidth as nccl-tests defines it, the step-time model where compute,
communication or the pipeline's bubble dominates, and a ranking that never ranks what its memory model says does
not fit. No job: records and hardware are made up here, on purpose."""
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from dlokit import layout_planner, memory_model
from dlokit.analysis import bus_bandwidth
from dlokit.analysis.llm_memory import model_config
from dlokit.analysis.step_model import Hardware, Layout, flops_per_token, step_time

TINY = model_config(layout_planner.LLM, "tiny")
GB = 1e9


def bench_run(times: dict) -> SimpleNamespace:
    """A comm_bench.py record: {(op, ranks, bytes): [seconds per repeat]}."""
    lines = pd.DataFrame([{"op": op, "ranks": n, "bytes": size, "repeat": i, "time_s": t}
                          for (op, n, size), ts in times.items() for i, t in enumerate(ts)])
    return SimpleNamespace(lines=lambda kind, rank=None: lines, run_id="synthetic", summary={"backend": "gloo"})


@pytest.mark.parametrize("op, ranks, factor", [("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75),
                                               ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875)])
def test_bus_bandwidth_is_the_nccl_tests_formula(op, ranks, factor):
    size, seconds = 64 * 2**20, 0.004
    table = bus_bandwidth.bandwidth_table(bench_run({(op, ranks, size): [seconds] * 5}))
    row = table.iloc[0]
    assert row["algbw_gbs"] == pytest.approx(size / seconds / GB)
    assert row["busbw_gbs"] == pytest.approx(size / seconds * factor / GB)  # 2(n-1)/n all-reduce, (n-1)/n the others
    assert bus_bandwidth.collective_seconds(op, ranks, size, row["busbw_gbs"] * GB) == pytest.approx(seconds)


def test_the_bandwidth_interval_is_the_time_interval_inverted():
    table = bus_bandwidth.bandwidth_table(bench_run({("all_reduce", 2, 2**20): [1e-3, 1.1e-3, 0.9e-3, 1.2e-3, 1e-3]}))
    row = table.iloc[0]
    assert row["busbw_low"] < row["busbw_gbs"] < row["busbw_high"]
    assert row["busbw_low"] == pytest.approx(2**20 / row["time_high"] / GB)


def test_the_curve_interpolates_between_measured_sizes():
    table = bus_bandwidth.bandwidth_table(bench_run({("all_reduce", 2, 2**10): [1e-4] * 3,
                                                     ("all_reduce", 2, 2**20): [1e-3] * 3}))
    at = bus_bandwidth.bandwidth_curve(table)
    small, large = 2**10 / 1e-4, 2**20 / 1e-3
    assert at("all_reduce", 2, 2**10) == pytest.approx(small) and at("all_reduce", 2, 2**30) == pytest.approx(large)
    assert small < at("all_reduce", 2, 2**15) < large
    assert at("all_gather", 4, 2**20) == pytest.approx(large)  # nothing nearer measured: the nearest there is


def flat(bandwidth, peak=1e12, **options) -> Hardware:
    return Hardware("synthetic", peak_flops=peak, busbw=lambda op, n, size: bandwidth, **options)


def test_compute_bound_the_step_is_the_flops_at_the_peak():
    hw = flat(1e18)  # links as fast as you like
    t = step_time(TINY, Layout("ddp", dp_replicate=2), batch_size=8, seq_len=64, hardware=hw)
    assert t.compute == pytest.approx(flops_per_token(TINY, 64) * 8 * 64 / 2 / 1e12)
    assert t.exposed < 1e-6 * t.compute and t.bubble == 0 and t.total == pytest.approx(t.compute, rel=1e-6)
    c = memory_model.parameter_counts(TINY)  # model.flops_per_token's count: 6 per weight touched + attention
    assert flops_per_token(TINY, 64) == 6 * (c["block_linear"] + c["block_norms"] + c["embedding"]) + 12 * 4 * 64 * 64


def test_communication_bound_the_step_is_the_gradient_all_reduce():
    hw = flat(1e6, peak=1e30)  # 1 MB/s: compute is nothing beside it
    t = step_time(TINY, Layout("ddp", dp_replicate=4), batch_size=8, seq_len=64, hardware=hw)
    grads = 4 * memory_model.params_on_rank(TINY)
    assert t.total == pytest.approx(grads * 2 * 3 / 4 / 1e6, rel=1e-6)  # size x 2(n-1)/n / busbw
    assert [c.op for c in t.collectives] == ["all_reduce"]


def test_overlap_hides_data_parallel_communication_up_to_the_compute():
    layout = Layout("fsdp", dp_shard=2, zero=3)
    apart = step_time(TINY, layout, batch_size=8, seq_len=64, hardware=flat(1e9, peak=1e9))
    hidden = step_time(TINY, layout, batch_size=8, seq_len=64, hardware=flat(1e9, peak=1e9, overlap=True))
    assert apart.exposed == pytest.approx(apart.communication)
    assert hidden.exposed == pytest.approx(max(0.0, hidden.communication - hidden.compute))
    assert hidden.total < apart.total


@pytest.mark.parametrize("schedule, m, virtual, idle", [("naive", 1, 1, 1.0), ("gpipe", 4, 1, 1 / 4),
                                                        ("1f1b", 8, 1, 1 / 8), ("interleaved", 4, 2, 1 / 8)])
def test_bubble_bound_the_pipeline_idles_p_minus_1_over_v_micro_batches(schedule, m, virtual, idle):
    hw = flat(1e18)
    t = step_time(TINY, Layout("pp", pp=2, pp_schedule=schedule, microbatches=m, virtual=virtual), batch_size=8,
                  seq_len=64, hardware=hw)
    assert t.bubble == pytest.approx(t.compute * idle)  # (p - 1) / (v m) of the stage's compute, p = 2
    assert t.total == pytest.approx(t.compute + t.bubble, rel=1e-6)


def test_a_group_across_nodes_runs_at_the_network_rate():
    hw = Hardware("two nodes", peak_flops=1e30, busbw=lambda *a: 100e9, inter_node_busbw=lambda *a: 10e9,
                  ranks_per_node=4)
    within = step_time(TINY, Layout("tp", tp=4), batch_size=8, seq_len=64, hardware=hw)
    across = step_time(TINY, Layout("tp", tp=8), batch_size=8, seq_len=64, hardware=hw)
    assert across.exposed / within.exposed == pytest.approx(10 * (2 * 7 / 8) / (2 * 3 / 4), rel=1e-6)


def test_the_planner_never_ranks_a_layout_that_does_not_fit():
    hw = flat(1e9, peak=1e11)
    full = layout_planner.plan(TINY, world=2, memory_gib=100, hardware=hw, batch_size=8, seq_len=64)
    limit = float(full["memory_gib"].median())  # about half of them fit
    table = layout_planner.plan(TINY, world=2, memory_gib=limit, hardware=hw, batch_size=8, seq_len=64)
    ranked, unranked = table[table["rank"].notna()], table[table["rank"].isna()]
    assert len(ranked) and len(unranked)
    assert (ranked["memory_gib"] <= limit).all() and (unranked["memory_gib"] > limit).all()
    assert list(ranked["rank"]) == list(range(1, len(ranked) + 1))
    steps = list(ranked["step_s"])  # ordered by step time, but for ties (TIE): no layout ranks above a faster one
    assert all(a <= b * (1 + layout_planner.TIE) for i, a in enumerate(steps) for b in steps[i + 1:])
    assert layout_planner.plan(TINY, world=2, memory_gib=1e-6, hardware=hw, batch_size=8, seq_len=64)["rank"].isna().all()


def test_the_plan_lists_every_layout_the_kit_runs_and_only_what_its_scripts_accept():
    table = layout_planner.plan(TINY, world=4, memory_gib=100, hardware=flat(1e9), batch_size=8, seq_len=64)
    bases = set(table["base"])
    for name in ("DDP", "ZeRO-1", "FSDP2", "FSDP2 no-reshard", "HSDP 2x2", "FSDP2 x TP 2", "PP naive", "PP gpipe m=4", "PP 1f1b m=8", "CP",
                 "DeepSpeed ZeRO-1", "DeepSpeed ZeRO-2", "DeepSpeed ZeRO-3"):
        assert name in bases, name
    assert "PP gpipe m=16" not in bases  # 8 sequences do not split into 16 micro-batches: train_llm.py refuses
    assert not bases & {"TP from scratch", "TP (DTensor)", "TP + SP"}  # tiny's 2 kv heads do not split 4 ways
    assert not [b for b in bases if b.startswith("PP interleaved")]  # nor its 4 layers into 4 x 2 virtual stages
    on_two = set(layout_planner.plan(TINY, world=2, memory_gib=100, hardware=flat(1e9), batch_size=8, seq_len=64)["base"])
    assert {"TP from scratch", "TP (DTensor)", "TP + SP", "PP interleaved m=4"} <= on_two
    levers = table[table["layout"].str.contains("AC") & table["layout"].str.contains("offload")]
    assert len(levers) and all(b.startswith(("FSDP2", "HSDP", "CP")) for b in levers["base"])


def test_layouts_the_model_cannot_tell_apart_rank_the_simpler_first():
    """Predicted steps within TIE of the fastest are a tie: the simpler layout (fewer levers, then DDP before the
    pipeline) ranks first, so that a rerun's slightly different bandwidths cannot swap the pick; beyond TIE the
    faster ranks first."""
    steps = pd.Series([6.063, 6.063, 6.111, 6.335, 6.794, 7.0, 9.0])
    assert layout_planner.ties(steps, pd.Series([True] * 6 + [False])) == [0, 0, 0, 0, 1, 1, 2]
    table = layout_planner.plan(TINY, world=2, memory_gib=100, hardware=flat(1e9, peak=1e11), batch_size=8, seq_len=64)
    ranked = table[table["rank"].notna()]
    for tie in ranked.groupby("tie"):
        members = tie[1]
        assert members["step_s"].max() <= members["step_s"].min() * (1 + layout_planner.TIE)
        assert list(zip(members["levers"], members["order"])) == sorted(zip(members["levers"], members["order"]))
    first = ranked[ranked["tie"] == ranked["tie"].iloc[0]]
    assert ranked["layout"].iloc[0] == first.sort_values(["levers", "order"])["layout"].iloc[0]


def test_candidates_are_the_fastest_layouts_and_one_predicted_slow():
    table = layout_planner.plan(TINY, world=2, memory_gib=100, hardware=flat(2e8, peak=3e11), batch_size=8, seq_len=64)
    chosen = layout_planner.candidates(table, top=3)
    assert len(chosen) == 4 and chosen["base"].is_unique and (chosen["script"] == "train_llm.py").all()
    assert chosen["step_s"].iloc[-1] > 2 * chosen["step_s"].iloc[0] and chosen["levers"].iloc[-1] == 0


@pytest.mark.parametrize("config, gpus", [("1b", 8), ("1b", 64), ("3b", 16), ("3b", 64)])
def test_a_cluster_on_paper_has_a_plan_that_fits_an_80gb_gpu(config, gpus):
    table = layout_planner.on_paper(model_config(layout_planner.LLM, config), "H100-80GB", gpus, batch_size=4 * gpus, seq_len=2048)
    best = table.iloc[0]
    assert best["rank"] == 1 and best["fits"] and best["memory_gib"] < 80
    assert "datasheet" in table.attrs["basis"] and table.attrs["gpus"] == gpus
    assert math.isfinite(layout_planner.tokens_per_s(table))


def test_the_chosen_layout_previews_as_a_batch_script():
    table = layout_planner.on_paper(model_config(layout_planner.LLM, "1b"), "A100-80GB", 16, batch_size=64, seq_len=2048)
    script = layout_planner.preview(table.iloc[0], profile="jean-zay", n_gpu=16, account="abc@a100")
    assert "#SBATCH" in script and "train_llm.py" in script and table.iloc[0]["options"].split()[1] in script
    assert "--constraint=a100" in script


def test_a_plan_for_one_gpu_is_refused_a_script_that_asks_slurm_for_another():
    """jean-zay's nodes are A100s (--constraint=a100): an H100 plan's memory and step do not hold there."""
    table = layout_planner.on_paper(model_config(layout_planner.LLM, "1b"), "H100-80GB", 16, batch_size=64, seq_len=2048)
    with pytest.raises(ValueError, match="the plan is for H100-80GB, but profile 'jean-zay' asks Slurm for "
                                         "--constraint=a100: plan for its GPU \\(A100-80GB\\)"):
        layout_planner.preview(table.iloc[0], profile="jean-zay", n_gpu=16, account="abc@h100")
    assert "#SBATCH" in layout_planner.preview(table.iloc[0], profile="local-slurm", n_gpu=16)  # no GPU model asked


def test_the_calculator_shows_the_step_its_layout_is_predicted_to_take():
    sentence = layout_planner.predicted_step(memory_model.PRESETS["Llama-3.2-1B"], batch_size=2, seq_len=2048, dp=4,
                                             zero=3, tp=2, pp=1, cp=1)
    assert sentence.startswith("predicted step on 8 x H100-80GB (bf16)") and "tokens/s" in sentence
    widget = memory_model.calculator(predict=layout_planner.predicted_step)
    assert widget.children[-1].outputs[-1]["text"].startswith("predicted step on 8 x H100-80GB")
    assert {"tensor", "pipeline", "context"} <= {w.description for w in widget.children[:-1]}
