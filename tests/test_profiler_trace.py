"""Profiler traces in Kineto's CUDA layout and in the CPU-only layout (hand-made fixtures, see
tests/fixtures/traces/make_traces.py for their timelines).

CUDA fixture: 2 profiled steps of 100 ms, each written twice (host user_annotation + gpu_user_annotation).
Per step: Kernel 70 ms, Memcpy 4, Memset 1, Communication 10 (a 20 ms NCCL kernel, half of it behind
compute kernels), Runtime 1, DataLoader 10, CPU Exec 3, Other 1. CPU fixture: 2 steps of 10 ms:
DataLoader 2, CPU Exec 7, Other 1.
"""
import gzip
import json
import os
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest

from dlokit import analysis
from dlokit.analysis import profiler
from dlokit.analysis.profiler import CATEGORIES

TRACES = Path(__file__).resolve().parent / "fixtures" / "traces"
CUDA = TRACES / "cuda_ddp_2steps.pt.trace.json"
CPU = TRACES / "cpu_2steps.pt.trace.json"
CUDA_MS = {"Kernel": 70, "Memcpy": 4, "Memset": 1, "Communication": 10, "Runtime": 1, "DataLoader": 10,
           "CPU Exec": 3, "Other": 1}
CPU_MS = {"Kernel": 0, "Memcpy": 0, "Memset": 0, "Communication": 0, "Runtime": 0, "DataLoader": 2, "CPU Exec": 7,
          "Other": 1}


def as_gz(source: Path, folder: Path) -> Path:
    target = folder / (source.name + ".gz")
    target.write_bytes(gzip.compress(source.read_bytes()))
    return target


def test_fixture_has_each_step_twice_as_kineto_writes_it():
    events = profiler.read_trace(CUDA)
    steps = [e for e in events if str(e.get("name")).startswith("ProfilerStep#")]
    assert sorted(e["cat"] for e in steps) == ["gpu_user_annotation"] * 2 + ["user_annotation"] * 2
    chosen = profiler.profiler_steps(events)
    assert [(e["name"], e["cat"]) for e in chosen] == [("ProfilerStep#5", "user_annotation"),
                                                        ("ProfilerStep#6", "user_annotation")]


@pytest.mark.parametrize("compressed", [False, True])
def test_cuda_trace_counts_one_step_per_profiler_step(tmp_path, compressed):
    trace = as_gz(CUDA, tmp_path) if compressed else CUDA
    table = analysis.profiler_breakdown(trace)
    assert table.attrs["steps"] == 2 and table.attrs["step_ms"] == pytest.approx(100.0)
    assert table.attrs["gpu"] is True and table.attrs["trace"] == str(trace)
    assert list(table.index) == list(CATEGORIES)
    assert table["ms_per_step"].to_dict() == pytest.approx(CUDA_MS)
    assert table["percent"].to_dict() == pytest.approx(CUDA_MS)  # 100 ms steps: ms == percent
    assert table["ms_per_step"].sum() == pytest.approx(table.attrs["step_ms"])


def test_device_categories_come_from_gpu_events_only():
    events = profiler.timed_events(profiler.read_trace(CUDA))
    by_category = {}
    for event in events:
        by_category.setdefault(profiler._category(event), set()).add(event["cat"])
    assert by_category["Kernel"] == {"kernel"} and by_category["Communication"] == {"kernel"}
    assert by_category["Memcpy"] == {"gpu_memcpy"} and by_category["Memset"] == {"gpu_memset"}
    assert by_category["Runtime"] == {"cuda_runtime"}
    assert by_category["DataLoader"] == {"user_annotation"}
    assert "gpu_user_annotation" in by_category[None]  # the GPU copies of the annotations count as nothing
    nccl = [e for e in events if profiler._category(e) == "Communication"]
    assert len(nccl) == 2 and all(e["name"].startswith("ncclDevKernel_AllReduce") for e in nccl)


def test_steps_from_gpu_annotations_when_the_host_copy_is_missing(tmp_path):
    data = json.loads(CUDA.read_text())
    data["traceEvents"] = [e for e in data["traceEvents"]
                           if not (str(e.get("name")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation")]
    trace = tmp_path / "gpu_marks_only.pt.trace.json"
    trace.write_text(json.dumps(data))
    assert analysis.profiler_breakdown(trace).attrs["steps"] == 2


def test_cpu_trace_behaves_as_before(tmp_path):
    table = analysis.profiler_breakdown(as_gz(CPU, tmp_path))
    assert table.attrs["steps"] == 2 and table.attrs["step_ms"] == pytest.approx(10.0)
    assert table.attrs["gpu"] is False
    assert table["ms_per_step"].to_dict() == pytest.approx(CPU_MS)
    totals, steps, span = profiler._breakdown_events(profiler.timed_events(profiler.read_trace(CPU)))
    assert (steps, span) == (2, 20000)
    assert "Communication" not in totals  # a category only of traces with NCCL kernels
    assert totals == pytest.approx({"Kernel": 0, "Memcpy": 0, "Memset": 0, "Runtime": 0, "DataLoader": 4000,
                                    "CPU Exec": 14000, "Other": 2000})
    figure = analysis.breakdown_pie([CPU, CUDA], titles=["cpu", "cuda"])
    assert "100.0 ms/step" in figure.axes[1].get_title()
    assert "Communication" in [p.get_label() for p in figure.axes[1].patches]


def test_collectives_of_a_cuda_trace():
    table = profiler.collectives_in_trace(CUDA).set_index("collective")
    assert table.loc["allreduce", "calls"] == 2
    assert table.loc["allreduce", "MiB"] == pytest.approx(2.0)  # 262144 fp32 values per call


@pytest.mark.parametrize("damage", ["truncated", "truncated-gz", "not-gzip", "no-trace-events"])
def test_a_broken_trace_is_a_clear_error_naming_the_file(tmp_path, damage):
    text = CUDA.read_bytes()
    if damage == "truncated":
        trace = tmp_path / "rank0.1.pt.trace.json"
        trace.write_bytes(text[: len(text) // 2])
    elif damage == "truncated-gz":
        trace = tmp_path / "rank0.1.pt.trace.json.gz"
        trace.write_bytes(gzip.compress(text)[:2000])
    elif damage == "not-gzip":
        trace = tmp_path / "rank0.1.pt.trace.json.gz"
        trace.write_bytes(text)
    else:
        trace = tmp_path / "rank0.1.pt.trace.json"
        trace.write_text(json.dumps({"schemaVersion": 1}))
    with pytest.raises(ValueError, match=str(trace).replace(".", r"\.")):
        profiler.read_trace(trace)
    with pytest.raises(ValueError, match="rank0.1.pt.trace.json"):
        analysis.profiler_breakdown(tmp_path)
    with pytest.raises(ValueError):
        profiler.collectives_in_trace(trace)
    figure = analysis.breakdown_pie(trace)
    assert "rank0.1.pt.trace.json" in "\n".join(t.get_text() for ax in figure.axes for t in ax.texts) + \
        "\n".join(t.get_text() for t in figure.texts)
