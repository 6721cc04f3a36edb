"""GPU code paths of the image script and dlokit.in_job.measure, tested on a machine without a GPU: NVML is a fake
module (sys.modules), the CUDA device properties are fakes, the TF32 flags are PyTorch's own (they can be
set and read without a GPU)."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import tomllib
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from dlokit.in_job import measure
from tp_imports import common, load_script  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tp_scripts" / "solutions" / "train_classifier.py"


def load_solution():
    return load_script(SCRIPT, "train_classifier_gpu_paths")


# ---- energy: NVML's handle is the GPU this process uses, whatever CUDA_VISIBLE_DEVICES hides -------------

PHYSICAL = [f"4f1c0d2a-0000-4000-8000-00000000000{i}" for i in range(4)]  # the machine's 4 GPUs, NVML order


class FakeNVML(types.ModuleType):
    """pynvml over 4 GPUs: handles are NVML indices; GPU i has used i * 1000 J so far, +1 J per reading."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, uuid_lookup=True):
        super().__init__("pynvml")
        self.uuid_lookup = uuid_lookup
        self.readings = [0] * 4
        self.by_index = []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        self.by_index.append(index)
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if not self.uuid_lookup or not uuid.startswith("GPU-") or uuid[4:] not in PHYSICAL:
            raise self.NVMLError("Not Found")
        return PHYSICAL.index(uuid[4:])

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        bus = int(bus_id.split(":")[1], 16)
        if not bus_id.startswith("00000000:") or not bus_id.endswith(":00.0") or bus not in (0x18, 0x3B, 0x86, 0xAF):
            raise self.NVMLError("Not Found")
        return (0x18, 0x3B, 0x86, 0xAF).index(bus)

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{PHYSICAL[handle]}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.readings[handle] += 1
        return handle * 1_000_000 + self.readings[handle] * 1000  # millijoules

    def nvmlDeviceGetPowerUsage(self, handle):
        return 100_000 + handle * 10_000  # milliwatts


class FakeUUID:
    """torch's _CUuuid: str() is the bare 8-4-4-4-12 form."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


@pytest.fixture
def visible_gpu_3(monkeypatch):
    """A job given physical GPU 3 alone: CUDA sees one device, cuda:0, which is NVML's GPU 3."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")

    def properties(index):
        physical = [int(i) for i in os.environ["CUDA_VISIBLE_DEVICES"].split(",")][index]
        return types.SimpleNamespace(uuid=FakeUUID(PHYSICAL[physical]), pci_domain_id=0,
                                     pci_bus_id=(0x18, 0x3B, 0x86, 0xAF)[physical], pci_device_id=0)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_energy_reads_the_gpu_of_the_process_not_nvml_index_0(monkeypatch, visible_gpu_3):
    nvml = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    meter = measure.EnergyMeter(torch.device("cuda", 0))
    assert nvml.by_index == []  # never by index: NVML's index 0 is another GPU
    assert meter.gpu_uuid == f"GPU-{PHYSICAL[3]}"
    assert meter.energy_j() == pytest.approx(1.0)  # GPU 3's counter: one reading later, +1 J
    assert meter.sample_power() == pytest.approx(130.0) and meter.peak_power_w == pytest.approx(130.0)
    summary = meter.summary()
    assert summary["gpu_uuid"] == f"GPU-{PHYSICAL[3]}" and summary["energy_unavailable"] is None
    assert summary["energy_wh"] == pytest.approx(summary["energy_j"] / 3600)
    assert summary["gpu_hours"] > 0
    assert nvml.readings[0] == 0  # GPU 0 (another job's, or every rank's by mistake) never read


def test_energy_falls_back_to_the_pci_bus_id(monkeypatch, visible_gpu_3):
    nvml = FakeNVML(uuid_lookup=False)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    meter = measure.EnergyMeter(torch.device("cuda", 0))
    assert meter.gpu_uuid == f"GPU-{PHYSICAL[3]}" and meter.energy_j() == pytest.approx(1.0)
    assert nvml.by_index == []


def test_energy_is_none_without_nvml_and_on_the_cpu(monkeypatch, visible_gpu_3):
    class Broken(FakeNVML):
        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", Broken())
    meter = measure.EnergyMeter(torch.device("cuda", 0))
    assert meter.energy_j() is None and meter.sample_power() is None and meter.gpu_uuid is None
    assert "Not Found" in meter.summary()["energy_unavailable"]
    cpu = measure.EnergyMeter(torch.device("cpu")).summary()
    assert cpu == {"energy_j": None, "energy_wh": None, "peak_power_w": None, "gpu_uuid": None,
                   "gpu_hours": None, "energy_unavailable": None}


def test_pynvml_is_a_dependency_and_imports_without_a_gpu():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("nvidia-ml-py") for d in dependencies)
    pynvml = importlib.import_module("pynvml")
    assert hasattr(pynvml, "nvmlDeviceGetHandleByUUID") and hasattr(pynvml, "nvmlDeviceGetHandleByPciBusId")
    if not torch.cuda.is_available():  # the real module, no driver: no reading, no crash
        meter = measure.EnergyMeter(torch.device("cuda", 0))
        assert meter.energy_j() is None and meter.summary()["energy_unavailable"]


# ---- SyncBatchNorm: --sync-bn converts on one GPU too -------------------------------------------------------

def test_sync_bn_is_converted_on_a_single_rank():
    script = load_solution()
    args = types.SimpleNamespace(sync_bn=True, find_unused_parameters=False, static_graph=False,
                                 gradient_as_bucket_view=False, bucket_cap_mb=None)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    converted = script.parallelize(model, args, torch.device("cuda", 0), world_size=1)  # one GPU: no DDP
    assert any(isinstance(m, nn.SyncBatchNorm) for m in converted.modules())
    # without a process group SyncBatchNorm computes plain BatchNorm statistics (so even a CPU forward works)
    assert converted(torch.randn(2, 3, 8, 8)).shape == (2, 4, 6, 6)
    plain = script.parallelize(nn.Sequential(nn.BatchNorm2d(4)), types.SimpleNamespace(**{**vars(args), "sync_bn": False}),
                               torch.device("cuda", 0), world_size=1)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in plain.modules())


# ---- TF32: the new API set, the legacy flags still readable ---------------------------------------------------

@pytest.fixture
def tf32_restored():
    b = torch.backends
    saved = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision)
    yield
    # back to PyTorch's defaults as they were (legacy flags first: they reset the new ones)
    torch.backends.cuda.matmul.allow_tf32 = saved[0] == "tf32"
    torch.backends.cudnn.allow_tf32 = saved[1] == "tf32"
    b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision = saved


def test_set_tf32_leaves_the_legacy_flags_readable(tf32_restored):
    set_tf32 = common("device_setup").set_tf32
    from dlokit.in_job.measure import tf32_enabled

    for enabled in (False, True, False):
        set_tf32(enabled)
        assert torch.backends.cuda.matmul.allow_tf32 is enabled  # raised "mix of the legacy and new APIs"
        assert torch.backends.cudnn.allow_tf32 is enabled
        torch.get_float32_matmul_precision()  # read by torch.compile paths: must not raise either
        assert tf32_enabled() is enabled
        if hasattr(torch.backends.cudnn, "conv"):
            expected = "tf32" if enabled else "ieee"
            assert torch.backends.cuda.matmul.fp32_precision == expected
            assert torch.backends.cudnn.conv.fp32_precision == expected


# ---- one rule for "this run was on a GPU": the record's device, never its process group's backend ---------------

MODEL = {"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 176, "vocab_size": 256,
         "tie_embeddings": False}


def gpu_fsdp_record(runs_dir, run_id="offload", world=2, cpu_offload=True):
    """What train_llm.py --mode fsdp --cpu-offload records on 2 GPUs: its process group joined "cpu:gloo,cuda:nccl"
    (llm_options.process_group_backend: the offloaded shards' collectives on the host), each process seeing its
    cuda:0 (hardware as describe_hardware reads it there)."""
    from dlokit.in_job.runrecord import RunRecorder

    config = {"mode": "fsdp", "data_parallel": "fsdp", "dp": world, "cpu_offload": cpu_offload, "dtype": "fp32",
              "batch_size": 8, "seq_len": 64, "process_group_backend": "cpu:gloo,cuda:nccl", "model": MODEL}
    for rank in range(world):
        with RunRecorder(config, rank=rank, world_size=world, run_id=run_id, runs_dir=runs_dir) as rec:
            rec.amend(hardware={**rec.header["hardware"], "gpu_count": 1, "gpu_name": "NVIDIA H100 80GB HBM3"})
            for step in (1, 2):
                rec.log("step", step=step, loss=5.0, t_step=0.1, t_data=0.0, tokens_per_s=5120.0)
            rec.finish(flops_per_token=1.5e6, peak_flops=989e12, mfu_basis="H100 SXM dense bf16 peak",
                       memory_bytes={"params": 1e6, "grads": 1e6, "optimizer": 2e6, "activations": 1e5})
    from dlokit.analysis.run import load_run

    return load_run(runs_dir / run_id)


def test_an_offloaded_fsdp_record_on_gpus_is_a_gpu_run_everywhere(tmp_path):
    import pandas as pd

    from dlokit import memory_model
    from dlokit.analysis import layout_scan, llm_memory, plan_check, throughput

    run = gpu_fsdp_record(tmp_path)
    assert run.device_type == "cuda" and run.on_gpu
    [row] = layout_scan.scan_table([], [], levers=[run]).to_dict("records")
    offloaded = llm_memory.layout_need_mb(MODEL, "fsdp", ranks=2, batch_size=8, seq_len=64, cpu_offload=True,
                                          cuda=True)
    assert row["on_gpu"] and row["layout"] == "fsdp+offload" and row["modelled_mb"] == pytest.approx(offloaded)
    chosen = pd.DataFrame([{"layout": "fsdp", "rank": 1, "step_s": 0.1}])
    [planned] = plan_check.predicted_vs_measured(chosen, [run]).to_dict("records")
    on_gpu = memory_model.estimate_for_run(run.config, cuda=True).total / llm_memory.MIB
    assert planned["memory_predicted_mib"] == pytest.approx(on_gpu)
    assert on_gpu != pytest.approx(memory_model.estimate_for_run(run.config).total / llm_memory.MIB)
    assert llm_memory.offload_table([run])["device"].tolist() == ["GPU"]
    assert throughput.run_peak(run, None) == (2 * 989e12, "H100 SXM dense bf16 peak")  # the datasheet's, per GPU


def test_the_scan_models_a_gpu_runs_foreach_adamw_and_none_under_offload(tmp_path):
    """On a GPU AdamW's foreach step allocates sqrt(v) for every weight of the rank (what --memory-limit bounds there);
    FSDP2's offloaded shards step on the host, where AdamW loops: nothing more on the device."""
    from dlokit import memory_model
    from dlokit.analysis import layout_scan, llm_memory

    run = gpu_fsdp_record(tmp_path, "fsdp", cpu_offload=False)
    [row] = layout_scan.scan_table([], [run]).to_dict("records")
    need = {cuda: llm_memory.layout_need_mb(MODEL, "fsdp", ranks=2, batch_size=8, seq_len=64, cuda=cuda)
            for cuda in (False, True)}
    assert row["modelled_mb"] == pytest.approx(need[True])
    weights = memory_model.params_on_rank(MODEL)
    assert need[True] - need[False] == pytest.approx(4 * weights / 2 / llm_memory.MIB)  # fp32, this rank's half
    offloaded = memory_model.estimate(MODEL, batch_size=4, seq_len=64, dp=2, zero=3, cuda=True, cpu_offload=True)
    assert offloaded.optimizer_step == 0 and offloaded.host > 0


def test_a_run_told_the_cpu_is_a_cpu_run_on_a_gpu_machine(tmp_path):
    run = gpu_fsdp_record(tmp_path)
    run.ranks[0]["run"]["config"]["device"] = "cpu"
    assert run.device_type == "cpu" and not run.on_gpu


def test_the_llm_scripts_apply_tf32_when_they_join(tf32_restored, monkeypatch):
    """--tf32, in train_llm.py and train_deepspeed.py alike (llm_options.setup_device): applied, not only parsed."""
    from llm_kit import llm_options
    from dlokit.in_job.measure import tf32_enabled

    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for tf32 in (True, False):
        assert str(llm_options.setup_device(llm_options.parse_args(["--tf32"] if tf32 else []))) == "cpu"
        assert tf32_enabled(ops=("matmul",)) is tf32
