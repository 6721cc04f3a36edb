"""Day 4 without launches: argument checks, config arithmetic, the memory model against measurement."""
import importlib
import math
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dlokit.in_job.measure import tf32_enabled
from dlokit.memory_model import estimate, params_on_rank
from tp_imports import common, load_script  # noqa: E402

LLM = Path(__file__).resolve().parents[1] / "tp_scripts" / "llm"
model_lib = common("model", llm=True)
train_llm = load_script(LLM / "solutions" / "train_llm.py")


@pytest.mark.parametrize("name", list(model_lib.CONFIGS))
def test_parameter_count_from_config_matches_built_model(name):
    config = model_lib.get_config(name)
    with torch.device("meta"):
        model = model_lib.Llama(config)
    assert model_lib.count_params(config) == sum(p.numel() for p in model.parameters())
    assert params_on_rank(config) == model_lib.count_params(config)


def test_llama_3b_shape():
    assert model_lib.count_params(model_lib.get_config("3b")) == pytest.approx(3.21e9, rel=0.01)


@pytest.mark.parametrize("mode, world, extra, message", [
    ("single", 2, [], "runs one process"),
    ("ddp", 1, [], "needs several processes"),
    ("fsdp-tp", 6, ["--tp", "4"], "not divisible by tp x pp x cp"),
    ("tp", 3, [], "n_heads = 4 is not divisible"),
    ("pp", 3, [], "n_layers = 4 is not divisible"),
    ("pp", 2, ["--microbatches", "3"], "--batch-size 8 is not divisible by --microbatches 3"),
    ("ddp", 3, [], "--batch-size 8 is not divisible by the data-parallel degree 3"),
    ("fsdp", 2, ["--resume"], "--resume needs --checkpoint-dir"),
    ("fsdp", 2, ["--resume", "--checkpoint-dir", "/nonexistent/typo"], "--resume: no checkpoint in /nonexistent/typo"),
    ("hsdp", 2, [], "--mode hsdp needs --dp-replicate >= 2"),
    ("hsdp", 6, ["--dp-replicate", "4"], "--mode hsdp needs --dp-replicate >= 2"),
    ("ddp", 2, ["--grad-accum", "3"], "--grad-accum 3: each rank's 4 sequences must split"),
    ("pp", 2, ["--grad-accum", "2"], "--grad-accum with a pipeline"),
])
def test_bad_arguments_are_explained(mode, world, extra, message):
    args = train_llm.parse_args(["--mode", mode, *extra])
    config = model_lib.get_config(args.config, max_seq_len=args.seq_len)
    with pytest.raises(train_llm.ArgumentsError, match=message.replace("+", r"\+")):
        train_llm.plan_degrees(args, config, world)


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_a_memory_limit_must_be_a_positive_number_of_mib(value, capsys):
    with pytest.raises(SystemExit) as stopped:
        train_llm.parse_args(["--mode", "ddp", "--memory-limit", value])
    assert stopped.value.code == 2 and "a number above 0" in capsys.readouterr().err
    assert train_llm.parse_args(["--memory-limit", "359"]).memory_limit == 359.0


def test_pipeline_takes_tied_embeddings():  # each end keeps a copy; test_day4_parallel: the single model's numbers
    args = train_llm.parse_args(["--mode", "pp", "--config", "125m"])
    assert train_llm.plan_degrees(args, model_lib.get_config("125m", max_seq_len=64), 2).pp == 2


def _saved_activation_bytes(model, run):
    """Bytes autograd keeps for backward (saved tensors, each storage once, parameters and buffers excluded)."""
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in owned and t.is_floating_point():
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run()
    return sum(seen.values()), loss


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_memory_model_matches_measured_states_and_activations(name):
    """Measured on CPU in fp32, one process:
    - weights, gradients, AdamW states: sum of tensor bytes after one step (tolerance 1 %);
    - activations: bytes of the tensors autograd saved for backward (tolerance 5 %).
    """
    torch.manual_seed(0)
    batch, seq = 2, 64
    config = model_lib.get_config(name, max_seq_len=seq)
    model = model_lib.Llama(config)
    tokens = torch.randint(0, config.vocab_size, (batch, seq))
    activations, loss = _saved_activation_bytes(model, lambda: model_lib.loss_fn(model(tokens), tokens))
    loss.backward()
    optimizer = torch.optim.AdamW(model.parameters())
    optimizer.step()
    measured = {
        "weights": sum(p.numel() * p.element_size() for p in model.parameters()),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()),
        "optimizer": sum(t.numel() * t.element_size() for s in optimizer.state.values()
                         for k, t in s.items() if k != "step"),
        "activations": activations,
    }
    predicted = estimate(config, batch_size=batch, seq_len=seq, precision="fp32").as_dict()
    for key in ("weights", "gradients", "optimizer"):
        assert predicted[key] == pytest.approx(measured[key], rel=0.01), key
    assert predicted["activations"] == pytest.approx(measured["activations"], rel=0.05)


def test_memory_model_sharding_arithmetic():
    config = SimpleNamespace(dim=1024, n_layers=8, n_heads=16, n_kv_heads=4, ffn_dim=4096, vocab_size=32000,
                             tie_embeddings=False)
    base = estimate(config, batch_size=4, seq_len=256, precision="bf16-mixed")
    psi = params_on_rank(config)
    assert (base.weights, base.gradients, base.optimizer) == (2 * psi, 2 * psi, 12 * psi)
    zero1 = estimate(config, batch_size=4, seq_len=256, dp=4, zero=1)
    zero2 = estimate(config, batch_size=4, seq_len=256, dp=4, zero=2)
    zero3 = estimate(config, batch_size=4, seq_len=256, dp=4, zero=3)
    assert zero1.optimizer == base.optimizer / 4 and zero1.gradients == base.gradients
    assert zero2.gradients == base.gradients / 4 and zero2.weights == base.weights
    assert zero3.weights == base.weights / 4 and zero3.transient > 0
    checkpointed = estimate(config, batch_size=4, seq_len=256, activation_checkpointing=True)
    assert checkpointed.activations < base.activations / 2
    tp = estimate(config, batch_size=4, seq_len=256, tp=4)
    assert base.weights / 4 < tp.weights < base.weights  # embeddings stay replicated
    gpipe = estimate(config, batch_size=8, seq_len=256, pp=4, microbatches=8, pp_schedule="gpipe")
    one_f_one_b = estimate(config, batch_size=8, seq_len=256, pp=4, microbatches=8, pp_schedule="1f1b")
    assert one_f_one_b.activations < gpipe.activations
    with pytest.raises(ValueError):
        estimate(config, batch_size=1, seq_len=8, zero=4)


# ---- MFU: the peak of the run's arithmetic on that GPU model (fake device names) ----

mfu_lib = common("mfu", llm=True)


@pytest.mark.parametrize("name, kind, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5e12),      # SXM
    ("NVIDIA H100 NVL", "bf16", 835.5e12),            # not the SXM figure
    ("NVIDIA H100 PCIe", "bf16", 756e12),
    ("NVIDIA H100 80GB HBM3", "fp32", 67e12),         # fp32 without TF32: CUDA cores
    ("NVIDIA H100 80GB HBM3", "tf32", 494.5e12),
    ("NVIDIA H200", "bf16", 989.5e12),
    ("NVIDIA H200 NVL", "bf16", 835.5e12),
    ("NVIDIA GH200 480GB", "bf16", 989.5e12),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
    ("NVIDIA A100-PCIE-40GB", "tf32", 156e12),
    ("NVIDIA A100 80GB PCIe", "fp32", 19.5e12),
    ("NVIDIA A10", "bf16", 125e12),                   # not matched as an A100
    ("NVIDIA L40S", "bf16", 362.05e12),
    ("NVIDIA L4", "bf16", 121e12),                    # not matched as an L40S
    ("Tesla V100-SXM2-32GB", "fp32", 15.7e12),
])
def test_mfu_peak_by_gpu_model_and_arithmetic(name, kind, peak):
    got, basis = mfu_lib.peak_for_name(name, kind)
    assert got == peak, basis
    assert kind in basis


@pytest.mark.parametrize("name, kind", [("NVIDIA GeForce RTX 4090", "bf16"), ("Tesla V100-SXM2-32GB", "bf16"),
                                        ("AMD Instinct MI300X", "bf16")])
def test_mfu_unknown_peak_gives_no_mfu_and_says_why(name, kind):
    peak, basis = mfu_lib.peak_for_name(name, kind)
    assert peak is None and "no MFU" in basis
    assert mfu_lib.mfu(1e5, 1e9, 8, peak) is None


def test_mfu_reads_the_device_and_the_tf32_setting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 NVL")
    cuda = torch.device("cuda", 0)
    assert mfu_lib.peak_flops(cuda, mfu_lib.arithmetic("bf16", tf32=False))[0] == 835.5e12
    assert mfu_lib.peak_flops(cuda, mfu_lib.arithmetic("fp32", tf32=False))[0] == 60e12
    assert mfu_lib.peak_flops(cuda, mfu_lib.arithmetic("fp32", tf32=True))[0] == 417.5e12
    assert mfu_lib.peak_flops(torch.device("cpu"), "bf16") == (None, "no MFU on CPU (no reliable peak)")
    # 1000 tokens/s x 1e9 FLOPs/token on 2 GPUs of 1e12 FLOP/s: 50 %
    assert mfu_lib.mfu(1000, 1e9, 2, 1e12) == pytest.approx(0.5)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert tf32_enabled(ops=("matmul",))
        torch.set_float32_matmul_precision("highest")
        assert not tf32_enabled(ops=("matmul",))
    finally:
        torch.set_float32_matmul_precision(previous)


# ---- process group, options, timers ----

def test_cpu_offload_on_gpus_gets_gloo_beside_nccl():
    offload = train_llm.parse_args(["--mode", "fsdp", "--cpu-offload"])
    plain = train_llm.parse_args(["--mode", "fsdp"])
    assert train_llm.process_group_backend(offload, cuda=True) == "cpu:gloo,cuda:nccl"
    assert train_llm.process_group_backend(plain, cuda=True) is None       # nccl
    assert train_llm.process_group_backend(offload, cuda=False) is None    # gloo


@pytest.mark.parametrize("mode, extra, message", [
    ("ddp", ["--meta-init"], "--meta-init allocates each rank's FSDP shards"),
    ("tp-scratch", ["--cpu-offload"], "--cpu-offload is FSDP's"),
    ("cp", ["--seq-len", "62"], "must divide by 2 x cp"),
    ("tp-scratch", ["--compile"], "--compile cannot trace tp-scratch"),
])
def test_options_outside_their_modes_are_refused(mode, extra, message):
    args = train_llm.parse_args(["--mode", mode, *extra])
    config = model_lib.get_config(args.config, max_seq_len=args.seq_len)
    with pytest.raises(train_llm.ArgumentsError, match=message):
        train_llm.plan_degrees(args, config, 2)


timing = common("timing", llm=True)


def test_section_timer_on_cpu_sums_host_time_and_resets():
    timer = timing.SectionTimer(torch.device("cpu"))
    with timer.section():
        torch.ones(64, 64) @ torch.ones(64, 64)
    first = timer.take()
    assert first > 0 and timer.take() == 0.0 and timer.count == 1


def test_section_timer_on_cuda_reads_events_after_synchronising(monkeypatch):
    """On a GPU the host clock only sees the queuing: the timer must use CUDA events and read them
    once the last one has completed (fake events here: no GPU needed)."""
    calls = []

    class FakeEvent:
        clock = 0.0

        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self):
            FakeEvent.clock += 5.0  # ms of device time between consecutive records
            self.at = FakeEvent.clock
            calls.append("record")

        def synchronize(self):
            calls.append("synchronize")

        def elapsed_time(self, end):
            assert "synchronize" in calls, "read before synchronising"
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: pytest.fail("host clock used on CUDA"))
    timer = timing.SectionTimer(torch.device("cuda", 0))
    for _ in range(3):
        with timer.section():
            pass
    assert calls.count("record") == 6
    assert timer.take() == pytest.approx(3 * 5.0 / 1000)
    assert timer.take() == 0.0


def test_tp_scratch_gets_its_timer_explicitly():
    """No module-level counter read through sys.modules: the timer is passed in."""
    import inspect

    source = inspect.getsource(train_llm)
    assert "sys.modules" not in source
    tp_scratch = load_script(LLM / "solutions" / "parallel_tp_scratch.py")
    assert "timer" in inspect.signature(tp_scratch.parallelize_tp_scratch).parameters
    assert not hasattr(tp_scratch, "COMM_SECONDS")


def test_context_parallel_positions_cover_the_sequence_once_and_balance_the_work():
    cp_lib = load_script(LLM / "solutions" / "parallel_cp.py")
    seq, size = 64, 4
    parts = [cp_lib.load_balanced_positions(seq, r, size) for r in range(size)]
    assert sorted(torch.cat(parts).tolist()) == list(range(seq))
    # causal work of a rank ~ sum of its positions: equal for every rank
    assert len({int(p.sum()) for p in parts}) == 1


@pytest.mark.parametrize("world", [2, 4])
def test_every_mode_is_a_set_of_degrees_over_the_world(world):
    """--mode is a shortcut: each names degrees (pp, dp_replicate, dp_shard, cp, tp) whose product is the
    world size, and the data-parallel strategy they imply."""
    dims_lib = common("parallel_dims", llm=True)
    expected = {"single": None, "ddp": "ddp", "zero1": "zero1", "fsdp": "fsdp", "hsdp": "hsdp", "pp": None,
                "tp-scratch": None, "tp": None, "fsdp-tp": "fsdp", "cp": "fsdp"}
    assert set(expected) == set(train_llm.MODES)
    for mode, data_parallel in expected.items():
        if mode == "single" or (mode in ("hsdp", "fsdp-tp") and world < 4):
            continue
        dims = dims_lib.ParallelDims.for_mode(mode, world)
        assert dims.world_size == world and dims.data_parallel == data_parallel, (mode, dims)
    hsdp = dims_lib.ParallelDims.for_mode("hsdp", 4, dp_replicate=2)
    assert (hsdp.dp_replicate, hsdp.dp_shard, hsdp.dp) == (2, 2, 4)
    assert train_llm.plan_degrees(train_llm.parse_args(["--mode", "hsdp"]), model_lib.get_config("tiny"), 4).degrees() == {
        "pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 1, "dp": 4, "data_parallel": "hsdp"}


# ---- the benchmark reads every rank ----

def _write_summary(folder, rank, **summary):
    path = folder / f"rank{rank}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(json.dumps(summary))


def test_bench_status_comes_from_every_rank(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_llm", Path(__file__).resolve().parents[1] / "bench" / "bench_llm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    oom = tmp_path / "oom"
    _write_summary(oom, 0, status="aborted", error="stopped because rank 1 ran out of memory: ...", tokens_per_s=None)
    _write_summary(oom, 1, status="oom", error="CUDA out of memory. Tried to allocate 2 GiB")
    got = bench.read_run(oom, 2, returncode=1)
    assert got["status"] == "OOM (rank 1)" and "Tried to allocate" in got["error"]
    good = tmp_path / "good"
    _write_summary(good, 0, status="completed", tokens_per_s=1000.0)
    _write_summary(good, 1, status="completed", tokens_per_s=1000.0)
    assert bench.read_run(good, 2, returncode=0)["status"] == "completed"
    lost = tmp_path / "lost"
    _write_summary(lost, 0, status="completed")
    assert bench.read_run(lost, 2, returncode=1)["status"].startswith("failed rc=1 (no record from rank 1")


def _losses(runs_dir, run_id, losses, dtype, mode="fsdp", world_size=2):
    from dlokit.in_job.runrecord import RunRecorder

    with RunRecorder({"mode": mode, "dtype": dtype}, world_size=world_size, run_id=run_id, runs_dir=runs_dir) as rec:
        for step, loss in enumerate(losses, 1):
            rec.log("step", step=step, loss=loss)
    return run_id


def test_loss_match_judges_a_pair_at_the_tolerance_of_its_coarser_precision(tmp_path):
    """bf16's rounding depends on the layout: correct bf16 layouts left one process by up to 1.3e-3 (fp32: 1e-6), the
    untouched TODOs by 1.7e-2 or more (loss_match.TOLERANCES). A bf16 pair 2e-3 apart matches; an fp32 pair as far
    apart does not; a run 2e-2 away fails in either."""
    from dlokit.analysis.loss_match import loss_match_table, loss_overlay

    base = [5.5364, 5.3853, 5.1603]
    for dtype in ("fp32", "bf16"):
        _losses(tmp_path, f"single-{dtype}", base, dtype, mode="single", world_size=1)
        _losses(tmp_path, f"close-{dtype}", [x + 2e-3 for x in base], dtype)
        _losses(tmp_path, f"wrong-{dtype}", [x + 2e-2 for x in base], dtype)
    bf16 = loss_match_table(["close-bf16", "wrong-bf16"], "single-bf16", runs_dir=tmp_path)
    assert bf16["matched"].tolist() == [True, False] and bf16.attrs["dtype"] == "bf16"
    fp32 = loss_match_table(["close-fp32", "wrong-fp32"], "single-fp32", runs_dir=tmp_path)
    assert fp32["matched"].tolist() == [False, False] and fp32.attrs["tolerance"] == 1e-3
    mixed = loss_match_table(["close-bf16"], "single-fp32", runs_dir=tmp_path)  # the coarser precision's tolerance
    assert mixed.attrs["dtype"] == "bf16" and mixed["matched"].tolist() == [True]
    figure = loss_overlay(["close-bf16"], "single-bf16", runs_dir=tmp_path)
    assert figure.axes[1].get_legend().get_texts()[0].get_text() == "tolerance 0.005 (bf16)"


def test_an_fp32_pair_with_tf32_on_a_gpu_is_judged_at_tf32s_tolerance(tmp_path):
    """TF32 rounds each product's inputs (a 10-bit mantissa): a pair 1.5e-3 apart matches at TF32's 2e-3, not at
    fp32's 1e-3; on a CPU --tf32 changes nothing, and the pair is judged as fp32."""
    from dlokit.analysis.loss_match import TOLERANCES, loss_match_table
    from dlokit.analysis.run import load_run

    base = [5.5364, 5.3853, 5.1603]
    for where, gpus in (("gpu", 1), ("cpu", 0)):
        for run_id, shift, mode in ((f"single-{where}", 0.0, "single"), (f"close-{where}", 1.5e-3, "fsdp"),
                                    (f"wrong-{where}", 2e-2, "fsdp")):
            _losses(tmp_path, run_id, [x + shift for x in base], "fp32", mode=mode)
            record = tmp_path / run_id / "rank0" / "run.json"
            header = json.loads(record.read_text())
            header["config"]["tf32_applied"] = True
            header["hardware"]["gpu_count"] = gpus
            record.write_text(json.dumps(header))
    assert load_run(tmp_path / "close-gpu").on_gpu and not load_run(tmp_path / "close-cpu").on_gpu
    on_gpu = loss_match_table(["close-gpu", "wrong-gpu"], "single-gpu", runs_dir=tmp_path, throughput=False)
    assert on_gpu.attrs["dtype"] == "tf32" and on_gpu.attrs["tolerance"] == TOLERANCES["tf32"] == 2e-3
    assert on_gpu["matched"].tolist() == [True, False]
    on_cpu = loss_match_table(["close-cpu"], "single-cpu", runs_dir=tmp_path, throughput=False)
    assert on_cpu.attrs["dtype"] == "fp32" and on_cpu["matched"].tolist() == [False]


def test_a_loss_mismatch_names_the_todos_whose_code_the_runs_ran():
    """TP4.6 has no TODO of its own: an fsdp, tp-scratch or cp run off the single process's loss points at TP4.2,
    TP4.4 or TP4.5's code (the student course: 'fsdp ×2, tp-scratch ×2, cp ×2 does not match' named none)."""
    from dlokit.checks import day4

    said = day4._yours(["fsdp ×2", "tp-scratch ×2", "cp ×2", "hsdp ×4"])
    assert said == (": they run your code of TODO TP4.2 (parallel_fsdp.py), TODO TP4.4 (parallel_tp_scratch.py), "
                    "TODO TP4.5 (parallel_cp.py)")
    assert day4._yours(["zero1 ×2"]) == ": it runs your code of TODO TP4.1 (zero1_optimizer.py)"
    assert day4._yours(["ddp ×2", "tp ×2"]) == ""  # no student code in those layouts


# ---- TP4.2's batch scan: the plan and the reading, without launches ----

def test_the_scan_limit_lets_ddp_fit_fewer_batches_than_fsdp_and_keeps_away_from_every_need():
    from dataclasses import asdict

    from dlokit.analysis.layout_scan import scan_limit

    plan = scan_limit(asdict(model_lib.get_config("scan-demo")), ranks=2, batches=[32, 64, 128, 256], seq_len=16)
    limit, needs = plan["limit_mb"], plan["needs"]
    assert plan["fits"] == {"ddp": [32, 64], "fsdp": [32, 64, 128]}
    assert needs["ddp"][1] < limit < needs["ddp"][2] and needs["fsdp"][2] < limit < needs["fsdp"][3]
    nearest = min(abs(math.log(limit / need)) for layout in needs.values() for need in layout)
    assert math.exp(nearest) == pytest.approx(plan["margin"], rel=0.01) and plan["margin"] > 1.1
    with pytest.raises(ValueError, match="no limit lets DDP fit some of the batches"):
        scan_limit(asdict(model_lib.get_config("scan-demo")), ranks=2, batches=[64], seq_len=16)


def test_the_largest_batch_is_read_between_what_fitted_and_what_ran_out():
    import pandas as pd

    from dlokit.analysis.layout_scan import describe, largest_batches

    rows = [("ddp", 32, "fits"), ("ddp", 64, "fits"), ("ddp", 128, "out of memory"), ("fsdp", 32, "fits"),
            ("fsdp", 64, "fits"), ("fsdp", 128, "fits"), ("fsdp", 256, "failed")]
    table = pd.DataFrame([{"run_id": f"{layout}-{batch}", "layout": layout, "batch": batch, "outcome": outcome}
                          for layout, batch, outcome in rows])
    found = largest_batches(table)
    assert found["ddp"] == {"batch": 64, "bracketed": True, "smallest_out": 128, "other": []}
    assert found["fsdp"] == {"batch": 128, "bracketed": False, "smallest_out": None, "other": ["fsdp-256"]}
    assert describe(found) == ("DDP fits a batch of 64 (128 ran out of memory), FSDP2 fits a batch of 128 (no "
                               "batch ran out of memory)")


def test_the_memory_model_counts_each_lever():
    """--grad-accum 4: a quarter of the activations; under FSDP2 (no gradient sync but on the last micro-batch) the
    whole gradients meanwhile. FSDP2's CPU offload: the sharded states in host memory, out of the device's total."""
    config = model_lib.get_config("scan-demo")
    plain = estimate(config, batch_size=64, seq_len=16, dp=2, zero=3, precision="fp32")
    accumulated = estimate(config, batch_size=64, seq_len=16, dp=2, zero=3, precision="fp32", grad_accum=4)
    offloaded = estimate(config, batch_size=64, seq_len=16, dp=2, zero=3, precision="fp32", cpu_offload=True)
    assert accumulated.activations == pytest.approx(plain.activations / 4)
    assert accumulated.gradients == pytest.approx(2 * plain.gradients)  # whole, where FSDP2 keeps half on 2 ranks
    assert offloaded.host == pytest.approx(plain.weights + plain.gradients + plain.optimizer)
    assert offloaded.total == pytest.approx(plain.total - offloaded.host)
    assert estimate(config, batch_size=64, seq_len=16, dp=2, zero=0, precision="fp32", cpu_offload=True).host == 0
